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
  if (it->second.covered) covered_.erase({it->second.state->ttl(), it->second.state.get()});
  // Its index entries go when they come to the top (Clean).
  return map_.erase(it);
}

void HeldLeases::Clear() {
  map_.clear();
  ttls_.clear();
  covered_.clear();
  deadlines_ = {};
}

void HeldLeases::Touch(const std::shared_ptr<LeaseState>& state) {
  auto it = map_.find(state->lock());
  if (it == map_.end() || it->second.state != state || it->second.covered) return;
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
      if (h.indexed != MonoTime::Max() && !h.covered) fresh.push_back(Entry{h.indexed, h.state});
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
    const MonoTime deadline = top.state->deadline();
    if (deadline == top.deadline) return;
    const Held& held = it->second;
    const bool later = deadline > top.deadline;
    deadlines_.pop();  // (`top` is gone from here on)
    if (later && held.state->covered_deadline() >= held.state->own_deadline()) {
      // Its session's Renews decide its deadline now, and every later one: it leaves the heap
      // for good (once in its life, unless a KeepAlive that names it extends it past them).
      held.indexed = MonoTime::Max();
      held.covered = true;
      covered_.insert({held.state->ttl(), held.state.get()});
      ++covered_total_;
      continue;
    }
    // Its own deadline moved since it was indexed: renewed by a KeepAlive (later), or marked
    // lost from outside the core (the loss watcher's thread: MonoTime::Min(), due now).
    Push(held);
  }
}

MonoTime HeldLeases::EarliestDeadline() const {
  Clean();
  ++visits_;
  const MonoTime heap = deadlines_.empty() ? MonoTime::Max() : deadlines_.top().deadline;
  return std::min(heap, CoveredEarliest());
}

std::shared_ptr<LeaseState> HeldLeases::NextDue(MonoTime now) {
  for (;;) {
    Clean();
    const bool heap_due = !deadlines_.empty() && deadlines_.top().deadline <= now;
    if (heap_due) {
      std::shared_ptr<LeaseState> due = deadlines_.top().state;
      deadlines_.pop();
      map_.find(due->lock())->second.indexed = MonoTime::Max();  // taken off the index
      return due;
    }
    if (covered_.empty()) return nullptr;
    ++visits_;
    const LeaseState* first = covered_.begin()->second;
    if (first->covered_deadline() > now) return nullptr;
    // Its session's Renews stopped covering it: out of the set, and due unless a KeepAlive
    // that named it gave it a later deadline of its own (then back in the heap).
    covered_.erase(covered_.begin());
    Held& held = map_.find(first->lock())->second;
    held.covered = false;
    if (first->deadline() > now) {
      Push(held);
      continue;
    }
    return held.state;
  }
}

}  // namespace fencelock::client_core
