#include "lock-client/pool_manager.h"

#include <algorithm>
#include <map>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "clock/clock.h"
#include "clock/monotonic_event.h"

namespace fencelock {
namespace {

bool Unreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

class PoolManagerImpl final : public PoolManager {
 public:
  PoolManagerImpl(PoolManagerOptions options, std::unique_ptr<PoolClient> calls,
                  std::unique_ptr<PoolClient> background)
      : options_(std::move(options)),
        calls_(std::move(calls)),
        background_(std::move(background)) {}

  ~PoolManagerImpl() override {
    stop_.Notify();
    if (thread_.joinable()) thread_.join();
    bool published;
    {
      absl::MutexLock lock(&mu_);
      published = published_ > 0 && !fenced_;
    }
    // Known zero (ADR-0006): this manager no longer contends. Best effort: demand expires anyway.
    if (published) (void)background_->setDemand(options_.pool, options_.profile, owner_, 0);
  }

  // Start()'s work: the claim, the acknowledgement, the reconciliation, the background thread.
  absl::Status Begin() {
    auto view = calls_->status(options_.pool);
    if (!view.ok()) return view.status();
    const uint64_t generation =
        options_.generation == 0 ? view->generation : options_.generation;
    auto owner = calls_->claim(options_.pool, options_.profile, generation);
    if (!owner.ok()) return owner.status();
    owner_ = *owner;
    if (absl::Status s = calls_->ack(options_.pool, options_.profile, owner_, generation);
        !s.ok()) {
      return s;
    }
    {
      absl::MutexLock lock(&mu_);
      generation_ = generation;
    }
    // The leases as they stand after the claim: no earlier manager can change them any more.
    view = calls_->status(options_.pool);
    if (!view.ok()) return view.status();
    for (const PoolLeaseView& lease : view->leases) {
      if (lease.profile != options_.profile) continue;
      if (absl::Status s = Reconcile(lease); !s.ok()) return s;
    }
    thread_ = std::thread([this] { Background(); });
    return absl::OkStatus();
  }

  PoolOwnerId owner() const override { return owner_; }
  const PoolReconciliation& reconciliation() const override { return reconciliation_; }

  void setDemand(uint64_t slots) override {
    uint64_t demand;
    {
      absl::MutexLock lock(&mu_);
      announced_ = slots;
      demand = std::max(announced_, waiting_);
      if (fenced_) return;
    }
    Publish(*calls_, demand);
  }

  absl::StatusOr<PoolAdmission> acquire(const std::string& slot, absl::Duration wait) override {
    const MonoTime deadline = Clock::Real()->Now() + std::max(wait, absl::ZeroDuration());
    uint64_t demand;
    bool publish;
    {
      absl::MutexLock lock(&mu_);
      if (fenced_) return fenced_status_;
      ++waiting_;
      demand = std::max(announced_, waiting_);
      // An acquire creates demand for one slot by itself (ADR-0006); more waiters say so first.
      publish = demand > 1 && demand > published_;
    }
    struct Waiting {
      PoolManagerImpl* m;
      ~Waiting() {
        absl::MutexLock lock(&m->mu_);
        --m->waiting_;
      }
    } waiting{this};
    if (publish) Publish(*calls_, demand);

    absl::Status last;
    std::string refusal;
    for (;;) {
      auto g = calls_->acquire(options_.pool, options_.profile, slot, owner_,
                               options_.provisional_ttl);
      if (g.ok() && g->granted) {
        Hold(PoolAdmission{slot, g->token, false}, g->ttl);
        return PoolAdmission{slot, g->token, false};
      }
      if (g.ok()) {
        refusal = g->refusal;
      } else if (absl::IsAborted(g.status())) {
        return Fence(g.status());
      } else if (absl::IsFailedPrecondition(g.status())) {
        // The generation moved on, or this slot is leased already: perhaps by this manager's
        // own acquire whose answer was lost on the way.
        auto resolved = AfterRefusal(slot, g.status());
        if (!resolved.ok()) return resolved.status();
        if (resolved->has_value()) return **resolved;
        continue;  // the new generation is acknowledged: ask again at once
      } else if (Unreachable(g.status())) {
        last = g.status();
      } else {
        return g.status();
      }
      if (Clock::Real()->Now() + options_.acquire_retry > deadline) {
        if (!refusal.empty()) {
          return absl::DeadlineExceededError(absl::StrCat(
              "no units for ", options_.pool, "/", options_.profile, "/", slot, " within ",
              absl::FormatDuration(wait), ": ", refusal));
        }
        return last;
      }
      if (stop_.WaitFor(options_.acquire_retry)) return absl::CancelledError("manager stopping");
    }
  }

  absl::Status activate(PoolAdmission& admission) override {
    if (admission.active) return absl::OkStatus();
    absl::Duration ttl;
    {
      absl::MutexLock lock(&mu_);
      if (fenced_) return fenced_status_;
      auto it = held_.find(admission.slot);
      ttl = it != held_.end() && it->second.admission.token == admission.token
                ? it->second.ttl
                : absl::ZeroDuration();
    }
    // An answer lost on the way is asked again (a repeated activation is answered the same)
    // for as long as the provisional lease could last.
    const MonoTime give_up = Clock::Real()->Now() + ttl;
    for (;;) {
      auto d = calls_->activate(options_.pool, options_.profile, admission.slot,
                                admission.token, owner_);
      if (d.ok()) {
        admission.active = true;
        absl::MutexLock lock(&mu_);
        auto it = held_.find(admission.slot);
        if (it != held_.end() && it->second.admission.token == admission.token) {
          it->second.admission.active = true;
        }
        return absl::OkStatus();
      }
      if (absl::IsAborted(d.status())) return Fence(d.status());
      if (!Unreachable(d.status()) || Clock::Real()->Now() > give_up) {
        if (absl::IsNotFound(d.status())) Forget(admission);
        return d.status();
      }
      if (stop_.WaitFor(absl::Milliseconds(200))) return d.status();
    }
  }

  absl::Status release(const PoolAdmission& admission) override {
    const MonoTime give_up = Clock::Real()->Now() + options_.release_patience;
    for (;;) {
      auto d = calls_->release(options_.pool, options_.profile, admission.slot, admission.token,
                               owner_);
      if (d.ok() || absl::IsNotFound(d.status())) {
        Forget(admission);
        return absl::OkStatus();
      }
      if (absl::IsAborted(d.status())) return Fence(d.status());
      if (!Unreachable(d.status()) || Clock::Real()->Now() > give_up) return d.status();
      if (stop_.WaitFor(absl::Milliseconds(500))) return d.status();
    }
  }

  std::vector<PoolAdmission> leases() const override {
    absl::MutexLock lock(&mu_);
    std::vector<PoolAdmission> out;
    for (const auto& [slot, held] : held_) out.push_back(held.admission);
    return out;
  }

  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return fenced_ ? fenced_status_ : background_status_;
  }

 private:
  struct Held {
    PoolAdmission admission;
    absl::Duration ttl;
    MonoTime renewed;
  };

  absl::Status Reconcile(const PoolLeaseView& lease) {
    const PoolWorkerState worker = options_.reconcile(lease);
    PoolAdmission a{lease.slot, lease.token, lease.active};
    const bool keep = worker == PoolWorkerState::kRunning ||
                      (lease.active && worker == PoolWorkerState::kCreated);
    if (keep) {
      if (!a.active) {
        // A worker runs under a provisional lease (a broken manager started it): its units stay
        // taken, so the lease becomes active rather than expire under it.
        auto d = calls_->activate(options_.pool, options_.profile, a.slot, a.token, owner_);
        if (absl::IsNotFound(d.status())) {
          reconciliation_.released.push_back(a);  // expired meanwhile; nothing to keep
          return absl::OkStatus();
        }
        if (!d.ok()) return d.status();
        a.active = true;
      }
      Hold(a, absl::ZeroDuration());
      reconciliation_.kept.push_back(a);
      return absl::OkStatus();
    }
    auto d = calls_->release(options_.pool, options_.profile, a.slot, a.token, owner_);
    if (!d.ok() && !absl::IsNotFound(d.status())) return d.status();
    reconciliation_.released.push_back(a);
    return absl::OkStatus();
  }

  // After acquire was refused kFailedPrecondition: the admission if the slot turns out to be
  // this manager's already (an answer lost), nullopt to ask again (a new generation is now
  // acknowledged), or the refusal.
  absl::StatusOr<std::optional<PoolAdmission>> AfterRefusal(const std::string& slot,
                                                            const absl::Status& refusal) {
    auto view = calls_->status(options_.pool);
    if (!view.ok()) return refusal;
    for (const PoolLeaseView& l : view->leases) {
      if (l.profile == options_.profile && l.slot == slot && l.epoch == owner_.epoch &&
          !Knows(slot, l.token)) {
        PoolAdmission a{slot, l.token, l.active};
        auto ttl = a.active ? absl::StatusOr<absl::Duration>(absl::ZeroDuration())
                            : calls_->renew(options_.pool, options_.profile, slot, l.token,
                                            owner_);
        if (!ttl.ok()) return ttl.status();
        Hold(a, a.active ? absl::ZeroDuration() : *ttl);
        return std::optional<PoolAdmission>(a);
      }
    }
    uint64_t generation;
    {
      absl::MutexLock lock(&mu_);
      generation = generation_;
    }
    if (options_.generation != 0 || view->generation == generation) return refusal;
    const bool has_profile =
        std::any_of(view->profiles.begin(), view->profiles.end(),
                    [&](const PoolProfileView& p) { return p.profile.id == options_.profile; });
    if (!has_profile) return refusal;
    if (absl::Status s = calls_->ack(options_.pool, options_.profile, owner_, view->generation);
        !s.ok()) {
      if (absl::IsAborted(s)) return Fence(s);
      return s;
    }
    absl::MutexLock lock(&mu_);
    generation_ = view->generation;
    return std::optional<PoolAdmission>();
  }

  bool Knows(const std::string& slot, uint64_t token) {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(slot);
    return it != held_.end() && it->second.admission.token == token;
  }

  void Hold(const PoolAdmission& a, absl::Duration ttl) {
    absl::MutexLock lock(&mu_);
    held_[a.slot] = Held{a, ttl, Clock::Real()->Now()};
  }

  void Forget(const PoolAdmission& a) {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(a.slot);
    if (it != held_.end() && it->second.admission.token == a.token) held_.erase(it);
  }

  absl::Status Fence(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (!fenced_) {
      fenced_ = true;
      fenced_status_ = s;
    }
    return fenced_status_;
  }

  // Publishes `demand` on `client`; records what lockd now knows.
  void Publish(PoolClient& client, uint64_t demand) {
    absl::Status s = client.setDemand(options_.pool, options_.profile, owner_, demand);
    if (absl::IsAborted(s)) {
      (void)Fence(s);
      return;
    }
    absl::MutexLock lock(&mu_);
    if (s.ok()) published_ = demand;
    background_status_ = s;
  }

  void Background() {
    while (!stop_.WaitFor(options_.demand_refresh)) {
      uint64_t demand;
      bool publish;
      std::vector<PoolAdmission> renew;
      {
        absl::MutexLock lock(&mu_);
        if (fenced_) return;
        demand = std::max(announced_, waiting_);
        publish = demand > 0 || published_ > 0;
        const MonoTime now = Clock::Real()->Now();
        for (const auto& [slot, held] : held_) {
          if (!held.admission.active && now - held.renewed >= held.ttl / 3) {
            renew.push_back(held.admission);
          }
        }
      }
      // A restarted lockd forgot every demand: the next refresh tells it again.
      if (publish) Publish(*background_, demand);
      for (const PoolAdmission& a : renew) {
        auto ttl = background_->renew(options_.pool, options_.profile, a.slot, a.token, owner_);
        if (absl::IsAborted(ttl.status())) {
          (void)Fence(ttl.status());
          return;
        }
        if (absl::IsNotFound(ttl.status())) {
          Forget(a);  // expired or released: activate() will say so
          continue;
        }
        absl::MutexLock lock(&mu_);
        if (!ttl.ok()) {
          background_status_ = ttl.status();
          continue;
        }
        auto it = held_.find(a.slot);
        if (it != held_.end() && it->second.admission.token == a.token) {
          it->second.ttl = *ttl;
          it->second.renewed = Clock::Real()->Now();
        }
      }
    }
  }

  const PoolManagerOptions options_;
  const std::unique_ptr<PoolClient> calls_;       // the callers' requests
  const std::unique_ptr<PoolClient> background_;  // demand and renewals, never behind a caller
  PoolOwnerId owner_;                             // set by Begin(), then constant
  PoolReconciliation reconciliation_;             // set by Begin(), then constant
  MonotonicEvent stop_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);  // by slot
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t announced_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t published_ ABSL_GUARDED_BY(mu_) = 0;
  bool fenced_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fenced_status_ ABSL_GUARDED_BY(mu_);
  absl::Status background_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<PoolManager>> PoolManager::Start(PoolManagerOptions options) {
  if (options.pool.empty() || options.profile.empty()) {
    return absl::InvalidArgumentError("a pool manager needs its pool and its profile");
  }
  if (!options.reconcile) {
    return absl::InvalidArgumentError(
        "a pool manager needs `reconcile`: what became of the workers of the leases it finds "
        "(ADR-0003: a lease is freed only once its worker is proved absent)");
  }
  // Never slower than the seed's cadences, which lockd's shortest demand TTL is built around.
  for (const auto& [name, value, most] :
       {std::tuple{"demand_refresh", options.demand_refresh, defaults::kPoolDemandRefresh},
        std::tuple{"acquire_retry", options.acquire_retry, defaults::kPoolAcquireRetry}}) {
    if (value < absl::Milliseconds(10) || value > most) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " ", absl::FormatDuration(value), " is outside [10ms, ",
          absl::FormatDuration(most), "]: ADR-0006's managers' cadence, which lockd's shortest "
          "demand TTL counts on"));
    }
  }
  if (options.release_patience < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("release_patience is negative");
  }
  auto calls = PoolClient::Create(options.client);
  if (!calls.ok()) return calls.status();
  auto background = PoolClient::Create(options.client);
  if (!background.ok()) return background.status();
  auto m = std::make_unique<PoolManagerImpl>(std::move(options), std::move(*calls),
                                             std::move(*background));
  if (absl::Status s = m->Begin(); !s.ok()) return s;
  return m;
}

}  // namespace fencelock
