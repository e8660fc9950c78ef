// Loss notification: what is behind Client::onLost and Client::whenLost.
//
// A LossWatcher keeps the watched leases and calls each one's callback once, on the client's
// callback thread (the TaskThread the asynchronous calls' callbacks run on), when the lease is
// lost for any reason but kReleased: when it is poked (the client core reported a loss, which
// it does at the moment a deadline passes, from its own timer on the client's Clock, or when
// lockd says fenced out or session gone; a SimulatedClock's move pokes it too) and finds the
// lease lost. A lease released by its client is dropped without a call. It has no thread of
// its own: a Client has at most one, for all its callbacks.
#ifndef FENCELOCK_LOCK_CLIENT_LOSS_WATCHER_H_
#define FENCELOCK_LOCK_CLIENT_LOSS_WATCHER_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "clock/clock.h"
#include "clock/std_mutex.h"
#include "lock-client/core/lease.h"
#include "task_thread.h"

namespace fencelock::client_internal {

class LossWatcher {
 public:
  // Subscribes to `clock`'s moves (Clock::Subscribe) here, not under a lock: the clock calls
  // Poke() while holding its own. Callbacks run on `callbacks`, which outlives this object or
  // runs its last tasks after it (a task holds what it needs).
  LossWatcher(Clock* clock, TaskThread* callbacks);
  // Drops the watches and ends the subscription to the clock; waits for nothing (Stop() does).
  ~LossWatcher();
  LossWatcher(const LossWatcher&) = delete;
  LossWatcher& operator=(const LossWatcher&) = delete;

  // Calls `on_lost(reason)` once, on the callback thread, when `state` is lost for any reason
  // but kReleased; soon after this call if it already is.
  void Watch(std::shared_ptr<LeaseState> state, std::function<void(LossReason)> on_lost);
  // Something may have been lost or released: look at every watch again. Harmless after
  // Stop(); posts nothing while nothing is watched. (A SimulatedClock's moves; O(watches).)
  void Poke();
  // These leases may have been lost or released: look at their watches only (O(leases)).
  void Poke(std::vector<std::shared_ptr<LeaseState>> leases);
  // Watches looked at so far (what a test watches to see that a release does not walk them).
  uint64_t looked() const;
  // No callback starts after this returns, and none is running then unless this is called
  // from a callback (the client destroyed in its onLost). The watches still pending are
  // dropped without a call; a Watch() after it is dropped too.
  void Stop();
  // Watches not yet fired or dropped.
  size_t pending() const;

 private:
  struct Entry {
    std::shared_ptr<LeaseState> state;
    std::function<void(LossReason)> on_lost;
    uint64_t order = 0;  // when it was watched
  };
  // What a posted look holds, so that it may run after the watcher is gone.
  struct Shared {
    explicit Shared(Clock* c) : clock(c) {}
    Clock* const clock;
    StdMutex mu;
    std::condition_variable idle;
    // By lease: a lease may have several watches (onLost, whenLost), called in watch order.
    std::unordered_multimap<const LeaseState*, Entry> entries ABSL_GUARDED_BY(mu);
    uint64_t next_order ABSL_GUARDED_BY(mu) = 0;
    // What the posted look is to look at: every watch, or those of these leases.
    bool look_all ABSL_GUARDED_BY(mu) = false;
    std::vector<std::shared_ptr<LeaseState>> look_at ABSL_GUARDED_BY(mu);
    uint64_t looked ABSL_GUARDED_BY(mu) = 0;
    bool stop ABSL_GUARDED_BY(mu) = false;
    bool posted ABSL_GUARDED_BY(mu) = false;   // a look is on its way
    bool running ABSL_GUARDED_BY(mu) = false;  // callbacks are being called
  };
  // Posts a look unless one is on its way; returns whether the caller must post.
  static bool NeedsLook(Shared& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu);
  void PostLook();
  static void Look(const std::shared_ptr<Shared>& s);

  const std::shared_ptr<Shared> shared_;
  TaskThread* const callbacks_;
  const uint64_t subscription_;
};

}  // namespace fencelock::client_internal

#endif  // FENCELOCK_LOCK_CLIENT_LOSS_WATCHER_H_
