#include "loss_watcher.h"

#include <algorithm>
#include <chrono>

namespace fencelock::client_internal {

LossWatcher::~LossWatcher() {
  Stop();
  if (subscribed_) clock_->Unsubscribe(subscription_);  // returns once no Poke() is running
}

void LossWatcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<Entry> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(entries_);
  }
  // Destroyed outside mu_: a dropped whenLost promise wakes its future's waiter.
}

void LossWatcher::StopFromItsThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    delete_on_exit_ = true;
    thread_.detach();
  }
  // Now, not when the thread deletes this object: the clock is the caller's, and it need
  // only outlive the client's destructor, which is running.
  clock_->Unsubscribe(subscription_);
  subscribed_ = false;
}

void LossWatcher::Watch(std::shared_ptr<LeaseState> state,
                        std::function<void(LossReason)> on_lost) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;  // stopped: dropped without a call
    entries_.push_back({std::move(state), std::move(on_lost)});
    poked_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  }
  cv_.notify_all();
}

void LossWatcher::Poke() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    poked_ = true;
  }
  cv_.notify_all();
}

size_t LossWatcher::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void LossWatcher::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    poked_ = false;
    const MonoTime now = clock_->Now();
    MonoTime next = MonoTime::Max();
    std::vector<std::pair<std::function<void(LossReason)>, LossReason>> due;
    for (auto it = entries_.begin(); it != entries_.end();) {
      LossReason reason = it->state->Check(now);
      if (reason == LossReason::kDeadlinePassed) {
        // Recorded, so that a release racing with this moment cannot also claim the lease:
        // the first reason recorded wins, and a lease lost here stays lost.
        it->state->MarkLost(LossReason::kDeadlinePassed);
        reason = it->state->Check(now);
      }
      if (reason == LossReason::kNone) {
        next = std::min(next, it->state->deadline());
        ++it;
        continue;
      }
      if (reason != LossReason::kReleased) due.emplace_back(std::move(it->on_lost), reason);
      it = entries_.erase(it);
    }
    if (!due.empty()) {
      for (auto& [on_lost, reason] : due) {
        if (stop_) break;  // a callback destroyed the client: the others are dropped
        lock.unlock();
        on_lost(reason);
        lock.lock();
      }
      continue;
    }
    auto woken = [this] { return poked_ || stop_; };
    if (next == MonoTime::Max()) {
      cv_.wait(lock, woken);
    } else {
      // Sleeps for the time left on the Clock, measured on the monotonic clock; on waking
      // the loop asks the Clock again, so a wait that ends early never fires early. At most
      // kLongestSleep at a time: the boot-time clock counts a suspend that the monotonic
      // clock does not, and after a resume the watcher must not sleep past a deadline.
      constexpr absl::Duration kLongestSleep = absl::Milliseconds(500);
      cv_.wait_for(lock, absl::ToChronoNanoseconds(std::min(next - now, kLongestSleep)), woken);
    }
  }
  if (delete_on_exit_) {
    lock.unlock();
    delete this;
  }
}

}  // namespace fencelock::client_internal
