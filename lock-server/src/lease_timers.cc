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
    Notice();
    Arm();
  });
}

void StallWatch::Notice() {
  if (!enabled()) return;
  const MonoTime now = time_->Now();
  const absl::Duration run_time = time_->RunTime();
  const absl::Duration not_run = (now - last_alive_) - (run_time - last_run_time_);
  last_alive_ = now;
  last_run_time_ = run_time;
  if (not_run > threshold_) on_stall_(not_run);
}

}  // namespace fencelock::server
