// The production TimeSource: "now" from a Clock (the boot-time clock by default), timers and
// posted tasks on an Asio io_context. Timers wait on Asio's steady clock for the time left until
// their MonoTime, so a wall-clock step never moves them. Include only from src/ files (it
// includes Asio).
#ifndef FENCELOCK_NET_ASIO_TIME_SOURCE_H_
#define FENCELOCK_NET_ASIO_TIME_SOURCE_H_

#include <time.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "clock/clock.h"
#include "clock/time_source.h"
#include "net/asio.h"

namespace fencelock {

// Not thread-safe apart from Post(): timers belong to the io_context's one thread.
class AsioTimeSource final : public TimeSource {
 public:
  AsioTimeSource(asio::io_context& io, Clock* clock) : io_(io), clock_(clock) {}

  MonoTime Now() const override { return clock_->Now(); }
  std::unique_ptr<Timer> NewTimer() override { return std::make_unique<AsioTimer>(this); }
  void Post(std::function<void()> task) override { asio::post(io_, std::move(task)); }
  // The calling thread's CPU time (user and system).
  absl::Duration RunTime() const override {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return absl::DurationFromTimespec(ts);
  }

 private:
  class AsioTimer final : public Timer {
   public:
    explicit AsioTimer(AsioTimeSource* source)
        : source_(source), timer_(source->io_), arming_(std::make_shared<uint64_t>(0)) {}
    ~AsioTimer() override { Cancel(); }

    void ArmAt(MonoTime when, std::function<void()> fire) override {
      Cancel();
      armed_for_ = when;
      const absl::Duration left = std::max(when - source_->Now(), absl::ZeroDuration());
      timer_.expires_after(absl::ToChronoNanoseconds(left));
      // A completion already queued when the timer is re-armed, cancelled or destroyed must not
      // run the old callback: it checks the arming it belongs to, which outlives the timer.
      const uint64_t mine = ++*arming_;
      timer_.async_wait([this, arming = arming_, mine, fire = std::move(fire)](
                            boost::system::error_code ec) {
        if (ec || *arming != mine) return;
        armed_for_ = MonoTime::Max();
        fire();
      });
    }
    void Cancel() override {
      ++*arming_;
      armed_for_ = MonoTime::Max();
      timer_.cancel();
    }
    MonoTime armed_for() const override { return armed_for_; }

   private:
    AsioTimeSource* const source_;
    asio::steady_timer timer_;
    std::shared_ptr<uint64_t> arming_;
    MonoTime armed_for_ = MonoTime::Max();
  };

  asio::io_context& io_;
  Clock* const clock_;
};

}  // namespace fencelock

#endif  // FENCELOCK_NET_ASIO_TIME_SOURCE_H_
