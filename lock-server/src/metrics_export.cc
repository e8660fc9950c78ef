#include "metrics_export.h"

#include <algorithm>
#include <vector>

namespace fencelock::server {

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
  add("lock_fenced_out_total", "Requests from a lock's own session that presented a token it lost (fence 1); must be zero",
      s.service.fenced_out_total, exported_.service.fenced_out_total);
  add("lockd_foreign_tokens_total",
      "Requests refused for a token their session never held (not a lease violation)",
      s.service.foreign_tokens_total, exported_.service.foreign_tokens_total);
  add("lockd_permission_denied_total",
      "Requests refused for driving a session that is not the sender's, or resuming one with "
      "a wrong secret",
      s.service.permission_denied_total, exported_.service.permission_denied_total);
  add("lockd_grants_total", "Locks granted", s.service.grants_total,
      exported_.service.grants_total);
  add("lockd_session_expiries_total", "Sessions that expired on lockd's clock",
      s.service.session_expiries_total, exported_.service.session_expiries_total);
  add("lockd_lock_expiries_total", "Lock leases that expired on lockd's clock",
      s.service.lock_expiries_total, exported_.service.lock_expiries_total);
  add("lockd_protocol_errors_total", "Connections closed for malformed or refused input",
      s.protocol_errors_total, exported_.protocol_errors_total);
  add("lockd_stalls_total",
      "Times lockd did not run for longer than --stall-threshold (leases extended)",
      s.stalls_total, exported_.stalls_total);
  add("lockd_connections_closed_slow_total",
      "Connections closed for not reading their replies (--slow-reader-timeout)",
      s.connections_closed_slow_total, exported_.connections_closed_slow_total);
  add("lockd_connections_closed_idle_total",
      "Connections closed after sending nothing past --idle-timeout",
      s.connections_closed_idle_total, exported_.connections_closed_idle_total);
  add("lockd_connections_refused_total",
      "Connections refused at admission (a connection limit, descriptors, a user id)",
      s.connections_refused_total, exported_.connections_refused_total);
  const CommitLog& log = core_->log();
  add("lockd_log_syncs_total", "WAL batches written and fdatasynced", log.stats().commits,
      exported_commits_);
  if (const absl::Duration left = log.OwnershipLeft(); left != absl::InfiniteDuration()) {
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
    const std::vector<StoreMember> members = log.Members();
    m.GetGauge("lockd_etcd_members_reachable",
               "With etcd: members that answered lockd's last status request")
        .Set(static_cast<double>(std::count_if(members.begin(), members.end(),
                                               [](const StoreMember& s) { return s.reachable; })));
  }
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
      .Set(static_cast<double>(service.state().last_token()));
}

}  // namespace fencelock::server
