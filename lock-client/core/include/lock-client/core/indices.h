// The client core's two collections that grow with the work, each with the orders the core asks
// of them on every call kept as indices, so that an acquire, a reply or a wake-up costs
// O(log n) in what the process holds and has in flight, never a walk (issue 60):
//
//   HeldLeases     the leases held, by lock name; the shortest TTL among them (the heartbeat
//                  period) and the earliest deadline (the next wake-up, the sweep).
//   TimedRequests  the requests in flight, by request id; the earliest timeout.
//
// A walk over every entry remains where the protocol asks for every entry: a KeepAlive lists
// every held lock (protocol versions before 6, the first renewal on each connection, and after
// lockd reports a loss), a lost session loses every lease, and a lost link fails every
// request. A Renew (ADR 0014) names none: what it gives every lease is one SessionRenewal, and
// a lease whose deadline it decides leaves the deadline heap for a set ordered by TTL, whose
// shortest gives the earliest of them all.
//
// Each counts the entries it looks at (visits(): what its indices look at, and every entry for a
// walk from begin()), so that a test can tell work that grows with the number held from work
// that does not. Not thread-safe: the
// core's, one caller at a time.
#ifndef FENCELOCK_LOCK_CLIENT_CORE_INDICES_H_
#define FENCELOCK_LOCK_CLIENT_CORE_INDICES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "clock/clock.h"
#include "lock-client/core/lease.h"

namespace fencelock::client_core {

using client_internal::LeaseState;

class HeldLeases {
 public:
  struct Held {
    std::shared_ptr<LeaseState> state;
    MonoTime lock_deadline;  // D1 for the lock's own lease
    // The deadline of its newest entry in the index (HeldLeases' own bookkeeping; Max: none).
    mutable MonoTime indexed = MonoTime::Max();
    // In the set of leases whose deadline their session's Renews decide, not in the heap.
    mutable bool covered = false;
  };
  using Map = std::map<std::string, Held>;
  using iterator = Map::iterator;
  using const_iterator = Map::const_iterator;

  // A walk from begin() counts as visiting every entry (visits()).
  iterator begin() {
    visits_ += map_.size();
    return map_.begin();
  }
  iterator end() { return map_.end(); }
  const_iterator begin() const {
    visits_ += map_.size();
    return map_.begin();
  }
  const_iterator end() const { return map_.end(); }
  iterator find(const std::string& lock) { return map_.find(lock); }
  bool contains(const std::string& lock) const { return map_.contains(lock); }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }

  // Holds `held` under `lock`, replacing what was held under that name.
  void Put(const std::string& lock, Held held);
  iterator Erase(iterator it);
  void Clear();
  // After `state`'s deadline moved (a renewal extended it): indexes the new deadline now.
  // Without the call the index learns it when the old one comes up, which is before the new
  // one: nothing is missed either way, the call only keeps the index small.
  void Touch(const std::shared_ptr<LeaseState>& state);

  // The shortest TTL held; infinite when nothing is held. O(1).
  absl::Duration ShortestTtl() const {
    return ttls_.empty() ? absl::InfiniteDuration() : *ttls_.begin();
  }
  // The earliest deadline held (MonoTime::Min() for a lease marked lost); MonoTime::Max() when
  // nothing is held. Amortized O(log n).
  MonoTime EarliestDeadline() const;
  // A held lease whose deadline is at or before `now` (or that was marked lost), taken off the
  // deadline index but left held; nullptr when there is none. Amortized O(log n) each.
  std::shared_ptr<LeaseState> NextDue(MonoTime now);
  // Leases that leave the heap for the covered set, over the life of this object.
  uint64_t covered_total() const { return covered_total_; }

  // Entries looked at so far: by EarliestDeadline and NextDue, and all of them by a walk.
  uint64_t visits() const { return visits_; }

 private:
  struct Entry {
    MonoTime deadline;
    std::shared_ptr<LeaseState> state;
    bool operator>(const Entry& other) const { return deadline > other.deadline; }
  };
  // Drops (or refreshes) index entries that no longer say a held lease's deadline, until the
  // top one does or none is left; a lease whose deadline its session's Renews now decide moves
  // to the covered set.
  void Clean() const;
  // Indexes `held`'s lease at its deadline now.
  void Push(const Held& held) const;
  // The earliest deadline of the covered set, or earlier (Max() when empty): what the Renews
  // give its shortest TTL. A lease there whose own deadline a KeepAlive moved later is due
  // later than that; NextDue then puts it back in the heap.
  MonoTime CoveredEarliest() const {
    return covered_.empty() ? MonoTime::Max() : covered_.begin()->second->covered_deadline();
  }

  Map map_;
  std::multiset<absl::Duration> ttls_;
  // Leases whose deadline their session's Renews decide (one SessionRenewal for them all), by
  // TTL: the shortest has the earliest deadline.
  mutable std::set<std::pair<absl::Duration, const LeaseState*>> covered_;
  mutable uint64_t covered_total_ = 0;
  // A deadline per lease, and older ones left behind by renewals until they come to the top.
  mutable std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> deadlines_;
  mutable uint64_t visits_ = 0;
};

// Requests in flight by id, `P` having a `MonoTime timeout_at` (MonoTime::Max() for none). Its
// timeout changes only through SetTimeout.
template <typename P>
class TimedRequests {
 public:
  using Map = std::map<uint64_t, P>;
  using iterator = typename Map::iterator;

  // A walk from begin() counts as visiting every entry (visits()).
  iterator begin() {
    visits_ += map_.size();
    return map_.begin();
  }
  iterator end() { return map_.end(); }
  iterator find(uint64_t id) { return map_.find(id); }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }

  // Adds request `id` (replacing one of the same id, which request ids never are).
  void Emplace(uint64_t id, P request) {
    if (auto it = map_.find(id); it != map_.end()) Erase(it);
    if (request.timeout_at != MonoTime::Max()) timeouts_.emplace(request.timeout_at, id);
    map_.emplace(id, std::move(request));
  }
  iterator Erase(iterator it) {
    timeouts_.erase({it->second.timeout_at, it->first});
    return map_.erase(it);
  }
  void SetTimeout(iterator it, MonoTime timeout_at) {
    timeouts_.erase({it->second.timeout_at, it->first});
    it->second.timeout_at = timeout_at;
    if (timeout_at != MonoTime::Max()) timeouts_.emplace(timeout_at, it->first);
  }
  // Every request, taken out (a lost link).
  Map TakeAll() {
    timeouts_.clear();
    return std::exchange(map_, {});
  }
  // The earliest timeout, MonoTime::Max() for none. O(1).
  MonoTime NextTimeout() const {
    ++visits_;
    return timeouts_.empty() ? MonoTime::Max() : timeouts_.begin()->first;
  }
  // The ids whose timeout is at or before `now`, earliest first. O(k + log n) for k of them.
  std::vector<uint64_t> Due(MonoTime now) const {
    std::vector<uint64_t> due;
    for (auto it = timeouts_.begin(); it != timeouts_.end() && it->first <= now; ++it) {
      ++visits_;
      due.push_back(it->second);
    }
    return due;
  }
  uint64_t visits() const { return visits_; }

 private:
  Map map_;
  std::set<std::pair<MonoTime, uint64_t>> timeouts_;
  mutable uint64_t visits_ = 0;
};

}  // namespace fencelock::client_core

#endif  // FENCELOCK_LOCK_CLIENT_CORE_INDICES_H_
