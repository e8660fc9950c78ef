// A flag one thread sets and others wait for, with a timeout that a wall-clock step cannot move.
//
// Debian's Abseil waits with a timeout (Mutex::AwaitWithTimeout, CondVar::WaitWithTimeout) until
// an absolute wall-clock time: stepping the wall clock forward ends such a wait at once, and
// stepping it back stretches it by the step. MonotonicEvent waits on std::condition_variable
// with std::chrono::steady_clock, which libstdc++ hands to pthread_cond_clockwait with
// CLOCK_MONOTONIC, so the timeout is time that really passed.
//
// Thread-safe.
#ifndef FENCELOCK_CLOCK_MONOTONIC_EVENT_H_
#define FENCELOCK_CLOCK_MONOTONIC_EVENT_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>

#include "absl/time/time.h"
#include "clock/std_mutex.h"

namespace fencelock {

class MonotonicEvent {
 public:
  // Sets the flag and wakes every waiter.
  void Notify() {
    {
      StdMutexLock lock(&mu_);
      set_ = true;
    }
    cv_.notify_all();
  }
  // Waits until the flag is set or `timeout` has passed on the monotonic clock. Returns whether
  // the flag is set. Does not clear it.
  bool WaitFor(absl::Duration timeout) {
    const auto deadline = std::chrono::steady_clock::now() +
                          absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration()));
    StdMutexLock lock(&mu_);
    return lock.WaitUntil(cv_, deadline, [this] {
      mu_.AssertHeld();
      return set_;
    });
  }

 private:
  StdMutex mu_;
  std::condition_variable cv_;
  bool set_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace fencelock

#endif  // FENCELOCK_CLOCK_MONOTONIC_EVENT_H_
