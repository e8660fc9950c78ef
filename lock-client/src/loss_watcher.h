// Loss notification: the timer behind Client::onLost and Client::whenLost.
//
// A LossWatcher keeps the watched leases and one thread that sleeps until the earliest of
// their deadlines on the client's Clock. When a deadline passes, or a lease is marked lost
// (lockd said fenced out or session gone; the client calls Poke() then), it calls that lease's
// callback once with the reason. A lease released by its client is dropped without a call. The
// thread sleeps on the monotonic clock and looks at the Clock again when it wakes, so it never
// fires early. On a SimulatedClock it also wakes whenever a test moves the clock.
#ifndef FENCELOCK_LOCK_CLIENT_LOSS_WATCHER_H_
#define FENCELOCK_LOCK_CLIENT_LOSS_WATCHER_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "clock/clock.h"
#include "lock-client/core/lease.h"

namespace fencelock::client_internal {

class LossWatcher {
 public:
  // Subscribes to `clock`'s moves (Clock::Subscribe) here, not under mu_: the clock calls
  // Poke() while holding its own lock.
  explicit LossWatcher(Clock* clock)
      : clock_(clock), subscription_(clock->Subscribe([this] { Poke(); })) {}
  // Stop(), then ends the subscription to the clock.
  ~LossWatcher();
  LossWatcher(const LossWatcher&) = delete;
  LossWatcher& operator=(const LossWatcher&) = delete;

  // Calls `on_lost(reason)` once, on the watcher's thread, when `state` is lost for any reason
  // but kReleased. At once (on that thread) if it already is. The first call starts the thread.
  void Watch(std::shared_ptr<LeaseState> state, std::function<void(LossReason)> on_lost);
  // Something may have been lost or released: look at every watch again now. Harmless after
  // Stop().
  void Poke();
  // Stops and joins the thread (waiting for a callback that is running) and drops the watches
  // still pending without a call; a Watch() after it is dropped too. The object stays usable,
  // so a client that stops its watcher first may still Poke() it while it shuts down.
  void Stop();
  // Whether the calling thread is the watcher's (a callback is calling).
  bool OnItsThread() const { return thread_.get_id() == std::this_thread::get_id(); }
  // Stop() for a callback that destroys the client: no further callback is made, and once the
  // calling callback returns the thread deletes this object itself (the owner must not).
  void StopFromItsThread();
  // Watches not yet fired or dropped.
  size_t pending() const;

 private:
  struct Entry {
    std::shared_ptr<LeaseState> state;
    std::function<void(LossReason)> on_lost;
  };
  void Run();

  Clock* const clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> entries_;  // guarded by mu_
  bool poked_ = false;          // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  bool delete_on_exit_ = false; // guarded by mu_
  const uint64_t subscription_;
  bool subscribed_ = true;  // until StopFromItsThread() ends the subscription early
  std::thread thread_;
};

}  // namespace fencelock::client_internal

#endif  // FENCELOCK_LOCK_CLIENT_LOSS_WATCHER_H_
