// ThreadSanitizer annotations for absl::Mutex and absl::Status, linked into every binary of a
// -DFENCELOCK_SANITIZE=thread build only.
//
// Debian's Abseil is compiled without ThreadSanitizer, so the annotations that absl::Mutex
// carries in its .cc are compiled out: TSan never sees the mutex being taken or released, and
// reports every access guarded by one as a race. The linker's --wrap sends our calls to
// Mutex::Lock, Unlock, Await, AwaitWithTimeout and ~Mutex through the wrappers below, which tell TSan
// what the real function does (the calls Abseil makes internally are not wrapped and need not
// be). absl::Status shares its message between copies with a reference count whose decrement
// is in the library too: a copy released on one thread looks like it frees memory another
// thread read, so the release is annotated as well. The mangled names carry Debian's inline namespace (absl::debian3); a build against
// another Abseil fails to link here, naming the symbol.
//
// Only the members the project calls are wrapped; a new one (ReaderLock, TryLock, LockWhen,
// CondVar::Wait) must be added here and to --wrap in the top-level CMakeLists.txt,
// or TSan builds report false races around it.
#include <sanitizer/tsan_interface.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

extern "C" {

// Exported by the TSan runtime, not declared in its public header.
void __tsan_ignore_thread_begin();
void __tsan_ignore_thread_end();

void __real__ZN4absl7debian35Mutex4LockEv(absl::Mutex* mu);
void __real__ZN4absl7debian35Mutex6UnlockEv(absl::Mutex* mu);
bool __real__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(
    absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout);
void __real__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(absl::Mutex* mu,
                                                            const absl::Condition& cond);
void __real__ZN4absl7debian35MutexD1Ev(absl::Mutex* mu);
void __real__ZN4absl7debian36Status15UnrefNonInlinedEm(uintptr_t rep);
void __tsan_release(void* addr);

void __wrap__ZN4absl7debian35Mutex4LockEv(absl::Mutex* mu) {
  __tsan_mutex_pre_lock(mu, 0);
  __real__ZN4absl7debian35Mutex4LockEv(mu);
  __tsan_mutex_post_lock(mu, 0, 0);
}

void __wrap__ZN4absl7debian35Mutex6UnlockEv(absl::Mutex* mu) {
  // Between pre and post TSan ignores the accesses Unlock makes, including the evaluation of
  // other threads' Conditions that Abseil does on the unlocking thread.
  __tsan_mutex_pre_unlock(mu, 0);
  __real__ZN4absl7debian35Mutex6UnlockEv(mu);
  __tsan_mutex_post_unlock(mu, 0);
}

bool __wrap__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(
    absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout) {
  // The wait releases the mutex and takes it again before returning. The Condition is
  // evaluated inside, with the mutex held, while TSan is told it is released: ignore those
  // accesses, as TSan does for the ones inside Unlock.
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_ignore_thread_begin();
  const bool met = __real__ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE(
      mu, cond, timeout);
  __tsan_ignore_thread_end();
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return met;
}

void __wrap__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(absl::Mutex* mu,
                                                            const absl::Condition& cond) {
  // As AwaitWithTimeout, without the timeout.
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_ignore_thread_begin();
  __real__ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE(mu, cond);
  __tsan_ignore_thread_end();
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
}

void __wrap__ZN4absl7debian35MutexD1Ev(absl::Mutex* mu) {
  __tsan_mutex_destroy(mu, __tsan_mutex_not_static);
  // The destructor drops the mutex from Abseil's global deadlock graph, which Abseil guards
  // with an internal lock TSan cannot see either (its memmove calls are intercepted).
  __tsan_ignore_thread_begin();
  __real__ZN4absl7debian35MutexD1Ev(mu);
  __tsan_ignore_thread_end();
}

void __wrap__ZN4absl7debian36Status15UnrefNonInlinedEm(uintptr_t rep) {
  // The decrement is acq_rel in the library: publish this thread's accesses to the rep, and
  // let the last owner free it unseen (TSan cannot order the decrements it does not see).
  __tsan_release(reinterpret_cast<void*>(rep));
  __tsan_ignore_thread_begin();
  __real__ZN4absl7debian36Status15UnrefNonInlinedEm(rep);
  __tsan_ignore_thread_end();
}

}  // extern "C"
