#include "lock-client/core/indices.h"

namespace fencelock::client_core {

void HeldLeases::Put(const std::string& lock, Held held) {
  auto it = map_.find(lock);
  if (it != map_.end()) Erase(it);
  ttls_.insert(held.state->ttl());
  Push(map_.insert_or_assign(lock, std::move(held)).first->second);
}

HeldLeases::iterator HeldLeases::Erase(iterator it) {
  ttls_.erase(ttls_.find(it->second.state->ttl()));
  // Its index entries go when they come to the top (Clean).
  return map_.erase(it);
}

void HeldLeases::Clear() {
  map_.clear();
  ttls_.clear();
  deadlines_ = {};
}

void HeldLeases::Touch(const std::shared_ptr<LeaseState>& state) {
  auto it = map_.find(state->lock());
  if (it == map_.end() || it->second.state != state) return;
  if (it->second.indexed != state->deadline()) Push(it->second);
}

void HeldLeases::Push(const Held& held) const {
  held.indexed = held.state->deadline();
  deadlines_.push(Entry{held.indexed, held.state});
  // Renewals leave an older entry per lease behind; past a few per lease, start again from
  // what is held (O(n), once per several renewals of every lease: amortized O(1)).
  if (deadlines_.size() > 4 * map_.size() + 64) {
    visits_ += map_.size();
    std::vector<Entry> fresh;
    fresh.reserve(map_.size());
    for (const auto& [name, h] : map_) {
      if (h.indexed != MonoTime::Max()) fresh.push_back(Entry{h.indexed, h.state});
    }
    deadlines_ = decltype(deadlines_)(std::greater<Entry>(), std::move(fresh));
  }
}

void HeldLeases::Clean() const {
  while (!deadlines_.empty()) {
    ++visits_;
    const Entry& top = deadlines_.top();
    auto it = map_.find(top.state->lock());
    if (it == map_.end() || it->second.state != top.state || it->second.indexed != top.deadline) {
      deadlines_.pop();  // released, replaced, or superseded by a newer entry of its lease
      continue;
    }
    if (top.state->deadline() == top.deadline) return;
    // Its deadline moved since it was indexed: renewed (later), or marked lost from outside
    // the core (the loss watcher's thread: MonoTime::Min(), due now).
    deadlines_.pop();
    Push(it->second);
  }
}

MonoTime HeldLeases::EarliestDeadline() const {
  Clean();
  return deadlines_.empty() ? MonoTime::Max() : deadlines_.top().deadline;
}

std::shared_ptr<LeaseState> HeldLeases::NextDue(MonoTime now) {
  Clean();
  if (deadlines_.empty() || deadlines_.top().deadline > now) return nullptr;
  std::shared_ptr<LeaseState> due = deadlines_.top().state;
  deadlines_.pop();
  map_.find(due->lock())->second.indexed = MonoTime::Max();  // taken off the index
  return due;
}

}  // namespace fencelock::client_core
