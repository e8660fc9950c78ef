#include "loss_watcher.h"

#include <utility>

namespace fencelock::client_internal {

LossWatcher::LossWatcher(Clock* clock, TaskThread* callbacks)
    : shared_(std::make_shared<Shared>(clock)),
      callbacks_(callbacks),
      subscription_(clock->Subscribe([this] { Poke(); })) {}

LossWatcher::~LossWatcher() {
  // The owner's Stop() waited for a running callback already; here nothing waits, for the
  // owner may be destroyed from that very callback (whose thread then no longer says so).
  std::vector<Entry> dropped;
  {
    StdMutexLock lock(&shared_->mu);
    shared_->stop = true;
    dropped.swap(shared_->entries);
  }
  shared_->clock->Unsubscribe(subscription_);  // returns once no Poke() is running
}

void LossWatcher::Stop() {
  std::vector<Entry> dropped;
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
    shared_->entries.push_back({std::move(state), std::move(on_lost)});
    post = NeedsLook(*shared_);
  }
  if (post) PostLook();
}

void LossWatcher::Poke() {
  bool post = false;
  {
    StdMutexLock lock(&shared_->mu);
    post = NeedsLook(*shared_);
  }
  if (post) PostLook();
}

size_t LossWatcher::pending() const {
  StdMutexLock lock(&shared_->mu);
  return shared_->entries.size();
}

void LossWatcher::Look(const std::shared_ptr<Shared>& s) {
  StdMutexLock lock(&s->mu);
  s->posted = false;
  if (s->stop) return;
  const MonoTime now = s->clock->Now();
  std::vector<std::pair<std::function<void(LossReason)>, LossReason>> due;
  for (auto it = s->entries.begin(); it != s->entries.end();) {
    LossReason reason = it->state->Check(now);
    if (reason == LossReason::kDeadlinePassed) {
      // Recorded, so that a release racing with this moment cannot also claim the lease: the
      // first reason recorded wins, and a lease lost here stays lost.
      it->state->MarkLost(LossReason::kDeadlinePassed);
      reason = it->state->Check(now);
    }
    if (reason == LossReason::kNone) {
      ++it;
      continue;
    }
    if (reason != LossReason::kReleased) due.emplace_back(std::move(it->on_lost), reason);
    it = s->entries.erase(it);
  }
  s->running = true;
  for (auto& [on_lost, reason] : due) {
    if (s->stop) break;  // a callback destroyed the client: the others are dropped
    lock.Unlock();
    on_lost(reason);
    lock.Lock();
  }
  s->running = false;
  s->idle.notify_all();
}

}  // namespace fencelock::client_internal
