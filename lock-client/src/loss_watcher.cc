#include "loss_watcher.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace fencelock::client_internal {

LossWatcher::LossWatcher(Clock* clock, TaskThread* callbacks)
    : shared_(std::make_shared<Shared>(clock)),
      callbacks_(callbacks),
      subscription_(clock->Subscribe([this] { Poke(); })) {}

LossWatcher::~LossWatcher() {
  // The owner's Stop() waited for a running callback already; here nothing waits, for the
  // owner may be destroyed from that very callback (whose thread then no longer says so).
  std::unordered_multimap<const LeaseState*, Entry> dropped;
  {
    StdMutexLock lock(&shared_->mu);
    shared_->stop = true;
    dropped.swap(shared_->entries);
  }
  shared_->clock->Unsubscribe(subscription_);  // returns once no Poke() is running
}

void LossWatcher::Stop() {
  std::unordered_multimap<const LeaseState*, Entry> dropped;
  {
    StdMutexLock lock(&shared_->mu);
    shared_->stop = true;
    if (!callbacks_->OnItsThread()) {
      lock.Wait(shared_->idle, [&] {
        shared_->mu.AssertHeld();
        return !shared_->running;
      });
    }
    dropped.swap(shared_->entries);
  }
  // Destroyed outside the lock: a dropped whenLost promise wakes its future's waiter.
}

bool LossWatcher::NeedsLook(Shared& s) {
  if (s.stop || s.entries.empty() || s.posted) return false;
  s.posted = true;
  return true;
}

void LossWatcher::PostLook() {
  callbacks_->Post([shared = shared_] { Look(shared); });
}

void LossWatcher::Watch(std::shared_ptr<LeaseState> state,
                        std::function<void(LossReason)> on_lost) {
  bool post = false;
  {
    StdMutexLock lock(&shared_->mu);
    if (shared_->stop) return;  // stopped: dropped without a call
    const LeaseState* key = state.get();
    shared_->look_at.push_back(state);  // it may be lost already
    shared_->entries.emplace(key, Entry{std::move(state), std::move(on_lost),
                                        shared_->next_order++});
    post = NeedsLook(*shared_);
  }
  if (post) PostLook();
}

void LossWatcher::Poke() {
  bool post = false;
  {
    StdMutexLock lock(&shared_->mu);
    shared_->look_all = true;
    post = NeedsLook(*shared_);
  }
  if (post) PostLook();
}

void LossWatcher::Poke(std::vector<std::shared_ptr<LeaseState>> leases) {
  bool post = false;
  {
    StdMutexLock lock(&shared_->mu);
    if (shared_->stop || shared_->entries.empty()) return;
    for (auto& lease : leases) {
      if (shared_->entries.contains(lease.get())) shared_->look_at.push_back(std::move(lease));
    }
    post = NeedsLook(*shared_);
  }
  if (post) PostLook();
}

size_t LossWatcher::pending() const {
  StdMutexLock lock(&shared_->mu);
  return shared_->entries.size();
}

uint64_t LossWatcher::looked() const {
  StdMutexLock lock(&shared_->mu);
  return shared_->looked;
}

void LossWatcher::Look(const std::shared_ptr<Shared>& s) {
  StdMutexLock lock(&s->mu);
  s->posted = false;
  if (s->stop) return;
  const MonoTime now = s->clock->Now();
  // The leases to look at: every watched one, or those named since the last look.
  std::vector<const LeaseState*> leases;
  if (s->look_all) {
    for (const auto& [key, entry] : s->entries) leases.push_back(key);
  } else {
    for (const auto& lease : s->look_at) leases.push_back(lease.get());
  }
  s->look_all = false;
  s->look_at.clear();
  std::vector<std::tuple<uint64_t, std::function<void(LossReason)>, LossReason>> due;
  for (const LeaseState* lease : leases) {
    auto [first, last] = s->entries.equal_range(lease);
    if (first == last) continue;  // looked at already (named twice), or not watched
    ++s->looked;
    LossReason reason = lease->Check(now);
    if (reason == LossReason::kDeadlinePassed) {
      // Recorded, so that a release racing with this moment cannot also claim the lease: the
      // first reason recorded wins, and a lease lost here stays lost.
      first->second.state->MarkLost(LossReason::kDeadlinePassed);
      reason = lease->Check(now);
    }
    if (reason == LossReason::kNone) continue;
    if (reason != LossReason::kReleased) {
      for (auto it = first; it != last; ++it) {
        due.emplace_back(it->second.order, std::move(it->second.on_lost), reason);
      }
    }
    s->entries.erase(first, last);
  }
  // In the order they were watched.
  std::sort(due.begin(), due.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  s->running = true;
  for (auto& [order, on_lost, reason] : due) {
    if (s->stop) break;  // a callback destroyed the client: the others are dropped
    lock.Unlock();
    on_lost(reason);
    lock.Lock();
  }
  s->running = false;
  s->idle.notify_all();
}

}  // namespace fencelock::client_internal
