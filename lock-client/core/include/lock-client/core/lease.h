// The client's conservative lease arithmetic (ADR-006 D1, D3, D5), free of I/O.
//
// UsableDeadline() is D1. LeaseState is what a LockHandle points at: the lock's effective
// deadline (the earlier of its own lease and its session's, as the client estimates them) and
// the reason it was lost, both atomics so that checkStillHeld reads them without a lock.
#ifndef FENCELOCK_LOCK_CLIENT_CORE_LEASE_H_
#define FENCELOCK_LOCK_CLIENT_CORE_LEASE_H_

#include <atomic>
#include <cstdint>
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

// Thread-safe. Once lost (explicitly, or because `now` reached the deadline when an extension
// was attempted), it never becomes held again.
class LeaseState {
 public:
  // `owner` names the client core that holds the lease (ClientCore::id()), so that a handle
  // handed to another client is refused there rather than released under the wrong session.
  LeaseState(std::string lock, uint64_t token, absl::Duration ttl, MonoTime deadline,
             uint64_t owner = 0, LockMode mode = LockMode::kExclusive)
      : lock_(std::move(lock)),
        token_(token),
        ttl_(ttl),
        owner_(owner),
        mode_(mode),
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
    if (now.nanos() >= deadline_ns_.load(std::memory_order_acquire)) {
      return LossReason::kDeadlinePassed;
    }
    return LossReason::kNone;
  }

  MonoTime deadline() const {
    return MonoTime::FromNanos(deadline_ns_.load(std::memory_order_acquire));
  }

  // Moves the deadline to `candidate` if that is later (D5: never earlier). Refuses, and marks
  // the lease lost, if the deadline had already passed at `now`: a lease that ran out stays
  // lost even if a renewal sent before that moment succeeds afterwards. Returns whether the
  // lease is still held.
  bool Extend(MonoTime candidate, MonoTime now) {
    int64_t current = deadline_ns_.load(std::memory_order_acquire);
    for (;;) {
      if (reason_.load(std::memory_order_acquire) != LossReason::kNone) return false;
      if (now.nanos() >= current) {
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
  std::atomic<int64_t> deadline_ns_;
  std::atomic<LossReason> reason_{LossReason::kNone};
};

}  // namespace client_internal
}  // namespace fencelock

#endif  // FENCELOCK_LOCK_CLIENT_CORE_LEASE_H_
