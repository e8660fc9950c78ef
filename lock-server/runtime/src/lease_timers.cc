#include "lease_timers.h"

namespace fencelock::server {

void ExpiryTimer::ArmFor(MonoTime next) {
  if (next == MonoTime::Max()) {
    timer_->Cancel();
    return;
  }
  timer_->ArmAt(next, [this] { on_due_(); });
}

void StallWatch::Start() {
  if (!enabled()) return;
  last_alive_ = time_->Now();
  last_run_time_ = time_->RunTime();
  Arm();
}

void StallWatch::Arm() {
  timer_->ArmAt(time_->Now() + threshold_ / 4, [this] {
    Read(time_->Now());
    Arm();
  });
}

void StallWatch::Notice() {
  if (!enabled()) return;
  const MonoTime now = time_->Now();
  // The periodic reading keeps the last one fresh: a gap within the threshold cannot hold a
  // stall, and reading the thread's CPU time (a system call) on every request is not needed.
  if (now - last_alive_ > threshold_) Read(now);
}

void StallWatch::Read(MonoTime now) {
  const absl::Duration run_time = time_->RunTime();
  const absl::Duration not_run = (now - last_alive_) - (run_time - last_run_time_);
  last_alive_ = now;
  last_run_time_ = run_time;
  if (not_run > threshold_) on_stall_(not_run);
}

}  // namespace fencelock::server
