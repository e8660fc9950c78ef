// Time for an event-driven component: "now", timers, and "run this soon", behind one interface.
//
// lockd's core asks a TimeSource for the time of every lease computation and arms every timer
// it needs (the expiry tick, the stall watch, a connection's Hello timeout, the metrics export)
// through it; it never reads a clock or touches an Asio timer itself. In production the source
// is Asio's event loop with the boot-time clock (lock-server's AsioTimeSource); in tests and in
// the deterministic simulator it is simulated time that moves only when told
// (ManualTimeSource here, or the simulator's own per-node sources).
//
// Everything a TimeSource runs (timer callbacks, posted tasks) runs on its owner's one thread,
// one at a time, never inside the call that armed or posted it.
#ifndef FENCELOCK_CLOCK_TIME_SOURCE_H_
#define FENCELOCK_CLOCK_TIME_SOURCE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "absl/time/time.h"
#include "clock/clock.h"

namespace fencelock {

// One re-armable timer. Destroying it cancels it; it must not outlive its TimeSource. Not
// thread-safe: the owner's thread only.
class Timer {
 public:
  virtual ~Timer() = default;
  // Calls `fire` once, on the owner's thread, once the source's Now() has reached `when` (at
  // once, from the event loop, if it already has). Arming again replaces the previous arming;
  // the replaced callback is dropped without being called.
  virtual void ArmAt(MonoTime when, std::function<void()> fire) = 0;
  // Drops the pending callback, if any, without calling it.
  virtual void Cancel() = 0;
  // When the timer is armed for; MonoTime::Max() when it is not armed.
  virtual MonoTime armed_for() const = 0;
};

class TimeSource {
 public:
  virtual ~TimeSource() = default;
  // The current time on this source's monotonic clock. Never goes backwards.
  virtual MonoTime Now() const = 0;
  // A new, unarmed timer on this source. Never null.
  virtual std::unique_ptr<Timer> NewTimer() = 0;
  // Runs `task` on the owner's thread after the handlers that are already due.
  virtual void Post(std::function<void()> task) = 0;
  // How long the owner's thread has run on a CPU, from some fixed point; call it on that
  // thread. With Now() it tells a thread that was busy (Now() and RunTime() moved together)
  // from one that did not run (Now() moved, RunTime() did not). Default: always zero, so
  // every gap looks like time the thread did not run.
  virtual absl::Duration RunTime() const { return absl::ZeroDuration(); }
};

// Simulated time for unit tests: stands still until AdvanceTo()/Advance() moves it, and then
// runs every timer and posted task that became due, in time order (ties in arming order).
// Single-threaded: the test's thread is the owner.
class ManualTimeSource final : public TimeSource {
 public:
  explicit ManualTimeSource(MonoTime start = MonoTime::FromNanos(1'000'000'000'000))
      : now_(start) {}
  ManualTimeSource(const ManualTimeSource&) = delete;
  ManualTimeSource& operator=(const ManualTimeSource&) = delete;

  MonoTime Now() const override { return now_; }
  std::unique_ptr<Timer> NewTimer() override;
  void Post(std::function<void()> task) override;

  // Runs every posted task and every timer due at or before Now().
  void RunDue();
  // Moves the clock to `t` (never backwards), running what falls due on the way, each at its
  // own time. Returns the number of callbacks run.
  int AdvanceTo(MonoTime t);
  int Advance(absl::Duration d) { return AdvanceTo(now_ + d); }
  // Moves the clock forward by `d` without running anything, as if the owner's thread had not
  // run (frozen, suspended, starved): what fell due runs late, at the next RunDue()/Advance().
  void Freeze(absl::Duration d);
  // Moves the clock and RunTime() forward by `d` without running anything, as if one handler
  // of the owner had been busy for that long: what fell due runs late.
  void Busy(absl::Duration d);
  absl::Duration RunTime() const override { return run_time_; }
  // The earliest pending callback's time, or MonoTime::Max().
  MonoTime NextEventAt() const;

 private:
  class ManualTimer;
  using Key = std::pair<MonoTime, uint64_t>;
  Key Schedule(MonoTime when, std::function<void()> fn);
  void Unschedule(const Key& key);

  MonoTime now_;
  absl::Duration run_time_ = absl::ZeroDuration();
  uint64_t next_seq_ = 0;
  std::map<Key, std::function<void()>> queue_;
};

}  // namespace fencelock

#endif  // FENCELOCK_CLOCK_TIME_SOURCE_H_
