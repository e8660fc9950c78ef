#include "metrics_export.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "logging/logging.h"

namespace fencelock::server {
namespace {

// From how long before a CRL's next update lockd warns.
constexpr absl::Duration kCrlWarning = absl::Hours(24);

}  // namespace

void MetricsExport::Start() {
  ExportNow();
  Arm();
}

void MetricsExport::Arm() {
  timer_->ArmAt(time_->Now() + absl::Milliseconds(250), [this] {
    ExportNow();
    Arm();
  });
}

void MetricsExport::ExportNow() {
  metrics::Registry& m = *registry_;
  const CoreStats s = core_->stats();
  auto add = [&](const char* name, const char* help, uint64_t now, uint64_t& before) {
    m.GetCounter(name, help).Increment(static_cast<double>(now - before));
    before = now;
  };
  s.ForEachCounter([&](const CounterRef& c) {
    add(c.metric, c.help, c.value, exported_[c.metric]);
  });
  const CommitLog& log = core_->log();
  add("lockd_log_syncs_total", "WAL batches written and fdatasynced", log.stats().commits,
      exported_commits_);
  const Leadership& leadership = core_->leadership();
  if (const MonoTime until = leadership.ServesUntil(); until != MonoTime::Max()) {
    const absl::Duration left = std::max(until - time_->Now(), absl::ZeroDuration());
    m.GetGauge("lockd_ownership_left_seconds",
               "With etcd: how much longer this lockd owns its prefix; 0 once it has lapsed")
        .Set(absl::ToDoubleSeconds(left));
    const CommitLogStats stats = log.stats();
    m.GetGauge("lockd_etcd_term",
               "With etcd: times a lockd has taken over the prefix, this one included; its "
               "increase is the number of leadership changes")
        .Set(static_cast<double>(stats.term));
    add("lockd_etcd_commit_retries_total",
        "With etcd: transactions sent again after etcd failed them (no leader for a moment)",
        stats.commit_retries, exported_commit_retries_);
    const std::vector<StoreMember> members = leadership.Members();
    m.GetGauge("lockd_etcd_members_reachable",
               "With etcd: members that answered lockd's last status request")
        .Set(static_cast<double>(std::count_if(members.begin(), members.end(),
                                               [](const StoreMember& s) { return s.reachable; })));
  }
  ExportPools();
  ExportCrl();
  m.GetGauge("lockd_disk_fault",
             "1 after a failed write or sync: lockd refuses mutations until restarted")
      .Set(log.fault() != nullptr ? 1.0 : 0.0);
  // After a disk fault memory may hold changes that never became durable: the gauges of the
  // state keep their last value from before it.
  if (log.fault() != nullptr) return;
  const LockService& service = core_->service();
  m.GetGauge("lockd_sessions", "Open sessions")
      .Set(static_cast<double>(service.state().session_count()));
  m.GetGauge("lockd_locks_held", "Held locks")
      .Set(static_cast<double>(service.state().held_lock_count()));
  m.GetGauge("lockd_waiters", "Queued acquires").Set(static_cast<double>(service.waiter_count()));
  m.GetGauge("lockd_last_token", "The newest fencing token issued")
      .Set(static_cast<double>(service.state().last_token().value()));
}

void MetricsExport::ExportCrl() {
  if (tls_ == nullptr) return;
  const std::optional<absl::Time> due = tls_->InForce()->crl_next_update();
  if (!due.has_value()) return;
  // A CRL's validity is a wall-clock date, as OpenSSL reads it at each handshake: this is the
  // one comparison lockd makes with the wall clock, and it decides only a gauge and a warning.
  const absl::Duration left = *due - absl::Now();
  registry_->GetGauge("lockd_tls_crl_next_update_seconds",
                      "With --tls-crl: seconds until the CRL's next update is due (negative once "
                      "past: every new TLS client is then refused until a new CRL is loaded)")
      .Set(absl::ToDoubleSeconds(left));
  const MonoTime now = time_->Now();
  if (left > kCrlWarning || now - crl_warned_ < absl::Hours(1)) return;
  crl_warned_ = now;
  logging::Lockd().Warning(absl::StrCat(
      "the CRL (--tls-crl) ", left > absl::ZeroDuration() ? "is due for its next update in "
                                                           : "passed its next update ",
      absl::FormatDuration(absl::Trunc(left > absl::ZeroDuration() ? left : -left,
                                       absl::Seconds(1))),
      left > absl::ZeroDuration() ? "" : " ago",
      ", at ", absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", *due, absl::UTCTimeZone()),
      left > absl::ZeroDuration() ? ": once it passes, lockd refuses every new TLS client"
                                  : ": lockd refuses every new TLS client",
      "; put a new list in place and reload lockd (SIGHUP)"));
}

void MetricsExport::ExportPools() {
  metrics::Registry& m = *registry_;
  const PoolService& pools = core_->service().pools();
  const MonoTime now = time_->Now();
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  for (const std::string& name : pools.PoolNames()) {
    auto view = pools.View(name, now, /*with_leases=*/false);
    if (!view.ok()) continue;
    const metrics::Labels pool{{"pool", name}};
    auto gauge = [&](const char* metric, const char* help, double value,
                     const metrics::Labels& labels) { m.GetGauge(metric, help, labels).Set(value); };
    gauge("lockd_pool_budget_units", "Admission pools: the pool's budget",
          static_cast<double>(view->budget), pool);
    gauge("lockd_pool_used_units", "Admission pools: units held by active and provisional leases",
          static_cast<double>(view->used_units), pool);
    gauge("lockd_pool_policy_generation", "Admission pools: the published policy generation",
          static_cast<double>(view->generation), pool);
    gauge("lockd_pool_decision", "Admission pools: the pool's last decision number",
          static_cast<double>(view->decision), pool);
    gauge("lockd_pool_tombstones", "Admission pools: recovery tombstones kept",
          static_cast<double>(view->tombstones_kept), pool);
    gauge("lockd_pool_draining", "Admission pools: 1 while the pool takes no new admission",
          view->draining ? 1.0 : 0.0, pool);
    gauge("lockd_pool_complete",
          "Admission pools: 1 while every profile has a manager on the current generation",
          view->complete ? 1.0 : 0.0, pool);
    for (const PoolProfileView& p : view->profiles) {
      const metrics::Labels labels{{"pool", name}, {"profile", p.profile.id}};
      gauge("lockd_pool_active_units", "Admission pools: units of a profile's active leases",
            static_cast<double>(p.active_units), labels);
      gauge("lockd_pool_provisional_units",
            "Admission pools: units of a profile's provisional leases",
            static_cast<double>(p.provisional_units), labels);
      gauge("lockd_pool_pending_units",
            "Admission pools: units of a profile's current demand; NaN when unknown (expired or "
            "never published)",
            p.pending_units ? static_cast<double>(*p.pending_units) : unknown, labels);
      gauge("lockd_pool_withheld_units",
            "Admission pools: fair units withheld from others for a profile; NaN when its "
            "demand is unknown",
            p.withheld_units ? static_cast<double>(*p.withheld_units) : unknown, labels);
      gauge("lockd_pool_profile_compatible",
            "Admission pools: 1 when the profile's manager acknowledged the current generation",
            p.compatible ? 1.0 : 0.0, labels);
    }
  }
}

}  // namespace fencelock::server
