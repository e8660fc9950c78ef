#include "clock/clock.h"

#include <time.h>

#include <cstdio>
#include <cstdlib>

namespace fencelock {
namespace {

class BootTimeClock final : public Clock {
 public:
  MonoTime Now() const override {
    timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return MonoTime::FromNanos(static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec);
  }
};

}  // namespace

Clock* Clock::Real() {
  static BootTimeClock* clock = new BootTimeClock();
  return clock;
}

void SimulatedClock::Advance(absl::Duration d) {
  if (d < absl::ZeroDuration()) {
    std::fprintf(stderr, "SimulatedClock::Advance: negative step %s\n",
                 absl::FormatDuration(d).c_str());
    std::abort();
  }
  now_ns_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_acq_rel);
  Moved();
}

void SimulatedClock::Set(MonoTime t) {
  int64_t current = now_ns_.load(std::memory_order_acquire);
  if (t.nanos() < current) {
    std::fprintf(stderr, "SimulatedClock::Set: time would go backwards\n");
    std::abort();
  }
  now_ns_.store(t.nanos(), std::memory_order_release);
  Moved();
}

uint64_t SimulatedClock::Subscribe(std::function<void()> moved) {
  StdMutexLock lock(&subscribers_mu_);
  const uint64_t id = next_subscriber_++;
  subscribers_.emplace(id, std::move(moved));
  return id;
}

void SimulatedClock::Unsubscribe(uint64_t id) {
  StdMutexLock lock(&subscribers_mu_);
  subscribers_.erase(id);
}

void SimulatedClock::Moved() {
  StdMutexLock lock(&subscribers_mu_);
  for (const auto& [id, moved] : subscribers_) moved();
}

}  // namespace fencelock
