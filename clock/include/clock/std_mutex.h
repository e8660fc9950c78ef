// StdMutex: std::mutex that clang's thread-safety analysis can see, and StdMutexLock, its
// scoped lock, which can also wait on a std::condition_variable.
//
// absl::Mutex carries the annotations, but two things keep some code on std::mutex: a
// condition wait with a timeout (Debian's Abseil waits until a wall-clock time, so a step of
// the wall clock ends or stretches it; std::condition_variable with steady_clock waits on
// CLOCK_MONOTONIC), and paths taken on every call of the client, where Debian's Abseil checks
// each Lock() in its process-wide deadlock graph. StdMutex is std::mutex with the annotations,
// so that what it guards is declared with ABSL_GUARDED_BY and checked by clang's
// -Wthread-safety (the test command's clang tree), not stated in a comment.
//
// A lambda that a wait calls with the lock held is analyzed as a function of its own: it
// says so with `mu.AssertHeld()` before it reads what the mutex guards.
#ifndef FENCELOCK_CLOCK_STD_MUTEX_H_
#define FENCELOCK_CLOCK_STD_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace fencelock {

class ABSL_LOCKABLE StdMutex {
 public:
  StdMutex() = default;
  StdMutex(const StdMutex&) = delete;
  StdMutex& operator=(const StdMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the analysis the caller holds it (a wait's predicate); checks nothing at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class StdMutexLock;
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE StdMutexLock {
 public:
  explicit StdMutexLock(StdMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu->mu_) {}
  ~StdMutexLock() ABSL_UNLOCK_FUNCTION() {}
  StdMutexLock(const StdMutexLock&) = delete;
  StdMutexLock& operator=(const StdMutexLock&) = delete;

  // Lets go for a while (work that must not hold it), then takes it again.
  void Unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }

  // Waits on `cv` until `ready()` (called with the lock held).
  template <typename Predicate>
  void Wait(std::condition_variable& cv, Predicate ready) {
    cv.wait(lock_, ready);
  }
  // The same, giving up at `deadline` on the monotonic clock; returns `ready()`.
  template <typename Predicate>
  bool WaitUntil(std::condition_variable& cv, std::chrono::steady_clock::time_point deadline,
                 Predicate ready) {
    return cv.wait_until(lock_, deadline, ready);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace fencelock

#endif  // FENCELOCK_CLOCK_STD_MUTEX_H_
