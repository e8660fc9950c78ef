// The two timers behind lockd's leases, on the injected TimeSource.
//
// ExpiryTimer wakes the core when the lock service next has something to expire (a session, a
// lock lease, a queued acquire's wait). StallWatch notices when the core itself did not run: it
// wakes every quarter of the threshold, so a gap longer than the threshold between two readings
// means the thread was frozen, suspended or starved, not that it was idle.
//
// Not thread-safe: the core's thread.
#ifndef FENCELOCK_LOCK_SERVER_LEASE_TIMERS_H_
#define FENCELOCK_LOCK_SERVER_LEASE_TIMERS_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "clock/time_source.h"

namespace fencelock::server {

class ExpiryTimer {
 public:
  ExpiryTimer(TimeSource* time, std::function<void()> on_due)
      : timer_(time->NewTimer()), on_due_(std::move(on_due)) {}
  // Arms for `next` (MonoTime::Max(): disarms), replacing any earlier arming.
  void ArmFor(MonoTime next);
  // Arms for `next` only if that is earlier than what the timer waits for now.
  void ArmIfEarlier(MonoTime next) {
    if (next < timer_->armed_for()) ArmFor(next);
  }
  void Stop() { timer_->Cancel(); }

 private:
  std::unique_ptr<Timer> timer_;
  std::function<void()> on_due_;
};

class StallWatch {
 public:
  // `on_stall` gets the length of each gap longer than `threshold`.
  StallWatch(TimeSource* time, absl::Duration threshold,
             std::function<void(absl::Duration)> on_stall)
      : time_(time),
        threshold_(threshold),
        timer_(time->NewTimer()),
        on_stall_(std::move(on_stall)),
        last_alive_(time->Now()) {}
  bool enabled() const { return threshold_ > absl::ZeroDuration(); }
  // Starts the periodic wake-ups (nothing when the threshold is zero).
  void Start();
  void Stop() { timer_->Cancel(); }
  // Reads the clock: reports a gap since the last reading longer than the threshold.
  void Notice();

 private:
  void Arm();

  TimeSource* const time_;
  const absl::Duration threshold_;
  std::unique_ptr<Timer> timer_;
  std::function<void(absl::Duration)> on_stall_;
  MonoTime last_alive_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_LEASE_TIMERS_H_
