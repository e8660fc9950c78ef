// The one source of "now" for every lease computation in the project.
//
// MonoTime is a point on a monotonic clock that keeps counting while the machine is
// suspended (CLOCK_BOOTTIME on Linux). It is not comparable with wall-clock time and is
// never sent over the wire. Clock is the interface lease logic asks for the time; the real
// implementation reads CLOCK_BOOTTIME, SimulatedClock moves only when a test moves it.
// Nothing else in the project reads a clock for lease arithmetic; Asio timers only trigger
// a re-check against the injected Clock.
#ifndef FENCELOCK_CLOCK_CLOCK_H_
#define FENCELOCK_CLOCK_CLOCK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>

#include "absl/time/time.h"
#include "api/export.h"
#include "clock/std_mutex.h"

namespace fencelock {

// A point in time on the boot-time monotonic clock, as nanoseconds since an arbitrary
// origin. Value type; trivially copyable. Arithmetic saturates like absl::Duration.
class FENCELOCK_API MonoTime {
 public:
  constexpr MonoTime() = default;
  static constexpr MonoTime FromNanos(int64_t ns) { return MonoTime(ns); }
  // The earliest representable time: "already passed" for every deadline comparison.
  static constexpr MonoTime Min() { return MonoTime(INT64_MIN); }
  static constexpr MonoTime Max() { return MonoTime(INT64_MAX); }

  constexpr int64_t nanos() const { return ns_; }

  friend MonoTime operator+(MonoTime t, absl::Duration d) {
    return MonoTime(Saturate(static_cast<__int128>(t.ns_) + absl::ToInt64Nanoseconds(d)));
  }
  friend MonoTime operator-(MonoTime t, absl::Duration d) {
    return MonoTime(Saturate(static_cast<__int128>(t.ns_) - absl::ToInt64Nanoseconds(d)));
  }
  friend absl::Duration operator-(MonoTime a, MonoTime b) {
    return absl::Nanoseconds(Saturate(static_cast<__int128>(a.ns_) - b.ns_));
  }
  friend constexpr auto operator<=>(MonoTime a, MonoTime b) = default;

 private:
  constexpr explicit MonoTime(int64_t ns) : ns_(ns) {}
  static constexpr int64_t Saturate(__int128 v) {
    if (v > INT64_MAX) return INT64_MAX;
    if (v < INT64_MIN) return INT64_MIN;
    return static_cast<int64_t>(v);
  }
  int64_t ns_ = 0;
};

// Where lease logic gets the time. Implementations are thread-safe; Now() never blocks,
// never allocates, and never goes backwards.
class FENCELOCK_API Clock {
 public:
  virtual ~Clock() = default;
  virtual MonoTime Now() const = 0;

  // For a thread that sleeps until a time on this clock (the client's loss timer): `moved` is
  // called after every move of the clock that is not time passing, that is, every
  // SimulatedClock::Advance() and Set(), until Unsubscribe(id) returns. It runs on the thread
  // that moved the clock and must not block. The real clock never calls it (its time only
  // passes), so a sleeper on it just waits on the monotonic clock. Returns the id.
  virtual uint64_t Subscribe(std::function<void()> moved) {
    (void)moved;
    return 0;
  }
  virtual void Unsubscribe(uint64_t id) { (void)id; }

  // The real boot-time clock (CLOCK_BOOTTIME). Never null; lives for the whole process.
  static Clock* Real();
};

// A clock that stands still until Advance() or Set() moves it. Starts at `start`.
// Thread-safe: tests move it from one thread while the code under test reads it from another.
class FENCELOCK_API SimulatedClock : public Clock {
 public:
  explicit SimulatedClock(MonoTime start = MonoTime::FromNanos(1'000'000'000'000))
      : now_ns_(start.nanos()) {}
  MonoTime Now() const override {
    return MonoTime::FromNanos(now_ns_.load(std::memory_order_acquire));
  }
  // Moves the clock forward by `d` (a negative `d` is a programming error and aborts).
  void Advance(absl::Duration d);
  // Moves the clock to `t`, which must not be earlier than Now().
  void Set(MonoTime t);

  uint64_t Subscribe(std::function<void()> moved) override;
  void Unsubscribe(uint64_t id) override;

 private:
  void Moved();

  std::atomic<int64_t> now_ns_;
  StdMutex subscribers_mu_;
  std::map<uint64_t, std::function<void()>> subscribers_ ABSL_GUARDED_BY(subscribers_mu_);
  uint64_t next_subscriber_ ABSL_GUARDED_BY(subscribers_mu_) = 1;
};

}  // namespace fencelock

#endif  // FENCELOCK_CLOCK_CLOCK_H_
