// The client's conservative lease arithmetic (ADR-006 D1, D3, D5), free of I/O.
//
// UsableDeadline() is D1. LeaseState is what a LockHandle points at: the lock's effective
// deadline (the earlier of its own lease and its session's, as the client estimates them) and
// the reason it was lost, both atomics so that checkStillHeld reads them without a lock.
#ifndef FENCELOCK_LOCK_CLIENT_CORE_LEASE_H_
#define FENCELOCK_LOCK_CLIENT_CORE_LEASE_H_

#include <atomic>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "clock/clock.h"
#include "lock-client/client.h"

namespace fencelock {

// D1: the last moment the client may believe a lease it renewed with a request written at
// `t_send` (read from the boot-time clock just before the write) is still valid.
inline MonoTime UsableDeadline(MonoTime t_send, absl::Duration ttl, double safety_margin) {
  return t_send + ttl * (1.0 - safety_margin);
}

namespace client_internal {

// What a Renew (protocol version 6, ADR 0014) gives every lease of one session at once: lockd
// renewed the session and every lock it held when the Renew arrived, so each lease the session
// held then, or was granted after, is valid until `base` (the Renew's t_send) plus its usable
// TTL, and not past the session's deadline. One store per heartbeat instead of one per lease.
// Thread-safe; both only ever move later.
class SessionRenewal {
 public:
  MonoTime base() const { return MonoTime::FromNanos(base_ns_.load(std::memory_order_acquire)); }
  MonoTime session_deadline() const {
    return MonoTime::FromNanos(session_ns_.load(std::memory_order_acquire));
  }
  // What it gives a lease published at `known_at` whose usable TTL (ttl × (1 − margin)) is
  // `usable`: nothing (Min()) until a Renew sent after `known_at` was answered, for only such a
  // Renew confirmed it to lockd. (After, strictly: a Renew sent at the same reading of the
  // clock may have gone before it was published.) Reading the two apart is sound: each alone
  // is a bound that held when stored.
  MonoTime Covers(MonoTime known_at, absl::Duration usable) const {
    const MonoTime base = this->base();
    if (base <= known_at) return MonoTime::Min();
    return std::min(base + usable, session_deadline());
  }
  void Advance(MonoTime base, MonoTime session_deadline) {
    Raise(session_ns_, session_deadline.nanos());
    Raise(base_ns_, base.nanos());
  }

 private:
  static void Raise(std::atomic<int64_t>& a, int64_t v) {
    int64_t current = a.load(std::memory_order_acquire);
    while (current < v && !a.compare_exchange_weak(current, v, std::memory_order_acq_rel)) {
    }
  }
  std::atomic<int64_t> base_ns_{MonoTime::Min().nanos()};
  std::atomic<int64_t> session_ns_{MonoTime::Min().nanos()};
};

// Thread-safe. Once lost (explicitly, or because `now` reached the deadline when an extension
// was attempted), it never becomes held again.
class LeaseState {
 public:
  // `owner` names the client core that holds the lease (ClientCore::id()), so that a handle
  // handed to another client is refused there rather than released under the wrong session.
  // `renewal`, when set, is its session's (SessionRenewal): `usable` is what a Renew gives it,
  // and `known_at` when its client published it.
  LeaseState(std::string lock, uint64_t token, absl::Duration ttl, MonoTime deadline,
             uint64_t owner = 0, LockMode mode = LockMode::kExclusive,
             std::shared_ptr<const SessionRenewal> renewal = nullptr,
             absl::Duration usable = absl::ZeroDuration(), MonoTime known_at = MonoTime::Max())
      : lock_(std::move(lock)),
        token_(token),
        ttl_(ttl),
        owner_(owner),
        mode_(mode),
        renewal_(std::move(renewal)),
        usable_(usable),
        known_at_(known_at),
        deadline_ns_(deadline.nanos()) {}

  const std::string& lock() const { return lock_; }
  uint64_t owner() const { return owner_; }
  uint64_t token() const { return token_; }
  LockMode mode() const { return mode_; }
  absl::Duration ttl() const { return ttl_; }

  // kNone while `now` is before the deadline and nothing marked the lease lost.
  LossReason Check(MonoTime now) const noexcept {
    const LossReason reason = reason_.load(std::memory_order_acquire);
    if (reason != LossReason::kNone) return reason;
    if (now >= deadline()) return LossReason::kDeadlinePassed;
    return LossReason::kNone;
  }

  // The later of its own deadline (its grant, and renewals that named it) and what its
  // session's Renews give it; MonoTime::Min() once lost.
  MonoTime deadline() const {
    const int64_t own = deadline_ns_.load(std::memory_order_acquire);
    if (own == MonoTime::Min().nanos() || renewal_ == nullptr) return MonoTime::FromNanos(own);
    return std::max(MonoTime::FromNanos(own), renewal_->Covers(known_at_, usable_));
  }
  // The deadline from its grant and the renewals that named it alone.
  MonoTime own_deadline() const {
    return MonoTime::FromNanos(deadline_ns_.load(std::memory_order_acquire));
  }
  // What its session's Renews give it (Min() without any).
  MonoTime covered_deadline() const {
    return renewal_ == nullptr ? MonoTime::Min() : renewal_->Covers(known_at_, usable_);
  }

  // Moves its own deadline to `candidate` if that is later (D5: never earlier). Refuses, and
  // marks the lease lost, if the deadline had already passed at `now`: a lease that ran out
  // stays lost even if a renewal sent before that moment succeeds afterwards. Returns whether
  // the lease is still held.
  bool Extend(MonoTime candidate, MonoTime now) {
    int64_t current = deadline_ns_.load(std::memory_order_acquire);
    for (;;) {
      if (reason_.load(std::memory_order_acquire) != LossReason::kNone) return false;
      if (now >= deadline()) {
        MarkLost(LossReason::kDeadlinePassed);
        return false;
      }
      if (candidate.nanos() <= current) return true;
      if (deadline_ns_.compare_exchange_weak(current, candidate.nanos(),
                                             std::memory_order_acq_rel)) {
        return true;
      }
    }
  }

  // Ends the lease for `reason` (the first reason recorded wins).
  void MarkLost(LossReason reason) {
    LossReason expected = LossReason::kNone;
    reason_.compare_exchange_strong(expected, reason, std::memory_order_acq_rel);
    deadline_ns_.store(MonoTime::Min().nanos(), std::memory_order_release);
  }

 private:
  const std::string lock_;
  const uint64_t token_;
  const absl::Duration ttl_;
  const uint64_t owner_;
  const LockMode mode_;
  const std::shared_ptr<const SessionRenewal> renewal_;
  const absl::Duration usable_;
  const MonoTime known_at_;
  std::atomic<int64_t> deadline_ns_;
  std::atomic<LossReason> reason_{LossReason::kNone};
};

}  // namespace client_internal
}  // namespace fencelock

#endif  // FENCELOCK_LOCK_CLIENT_CORE_LEASE_H_
