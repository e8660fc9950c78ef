// The two timers behind lockd's leases, on the injected TimeSource.
//
// ExpiryTimer wakes the core when the lock service next has something to expire (a session, a
// lock lease, a queued acquire's wait). StallWatch notices when the core itself did not run: it
// wakes every quarter of the threshold and reads the clock and the thread's run time (CPU
// time). Of the time between two readings, what the thread spent running was busy time (it was
// serving); the rest it did not run (frozen, suspended, starved of CPU, blocked). Only the
// latter, when longer than the threshold, is a stall: an idle thread wakes in time, and a busy
// one is not owed anything, since clients' requests were not what kept it from running.
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
  // `on_stall` gets the time the thread did not run, for each gap in which that was longer
  // than `threshold`.
  StallWatch(TimeSource* time, absl::Duration threshold,
             std::function<void(absl::Duration)> on_stall)
      : time_(time),
        threshold_(threshold),
        timer_(time->NewTimer()),
        on_stall_(std::move(on_stall)),
        last_alive_(time->Now()),
        last_run_time_(time->RunTime()) {}
  bool enabled() const { return threshold_ > absl::ZeroDuration(); }
  // Starts the periodic wake-ups (nothing when the threshold is zero).
  void Start();
  void Stop() { timer_->Cancel(); }
  // Called before the core reads the clock for anything else: when the time since the last
  // reading is longer than the threshold, reads the run time and reports the time not run
  // since then if that is longer than the threshold.
  void Notice();

 private:
  void Arm();
  // Reads the run time at `now` and reports the time not run since the last reading.
  void Read(MonoTime now);

  TimeSource* const time_;
  const absl::Duration threshold_;
  std::unique_ptr<Timer> timer_;
  std::function<void(absl::Duration)> on_stall_;
  MonoTime last_alive_;
  absl::Duration last_run_time_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_LEASE_TIMERS_H_
