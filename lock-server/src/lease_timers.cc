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
  const absl::Duration gap = now - last_alive_;
  last_alive_ = now;
  if (gap > threshold_) on_stall_(gap);
}

}  // namespace fencelock::server
