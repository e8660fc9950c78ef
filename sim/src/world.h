// The simulator's ground: true time, the event queue, nodes that pause and restart, each
// node's clock at its own rate, and the seeded random numbers everything draws from.
// Single-threaded; everything here belongs to one Simulation.
#ifndef FENCELOCK_SIM_WORLD_H_
#define FENCELOCK_SIM_WORLD_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "clock/clock.h"
#include "clock/time_source.h"

namespace fencelock::sim {

// splitmix64: small, fast, and the same on every platform (std's distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }
  int64_t Between(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(Below(hi - lo + 1)); }
  absl::Duration Between(absl::Duration lo, absl::Duration hi) {
    return absl::Nanoseconds(Between(absl::ToInt64Nanoseconds(lo), absl::ToInt64Nanoseconds(hi)));
  }

 private:
  uint64_t state_;
};

inline int64_t Ns(absl::Duration d) { return absl::ToInt64Nanoseconds(d); }

// True time, events, and nodes that may be paused and (lockd) restarted.
class World {
 public:
  struct Node {
    uint64_t incarnation = 0;
    int64_t paused_until = 0;
    int64_t rate_ppm = 0;  // the node's clock runs at 1 + rate_ppm / 1e6 of true time
    int64_t origin = 0;
  };

  explicit World(int nodes) : nodes_(nodes) {}

  int64_t now() const { return now_; }
  Node& node(int i) { return nodes_[i]; }

  // Runs `fn` on `node` at true time `t`, unless the node restarts before then. A paused node
  // runs it when the pause ends.
  void At(int64_t t, int node, std::function<void()> fn) {
    queue_.emplace(Key{std::max(t, now_), seq_++},
                   Event{node, nodes_[node].incarnation, std::move(fn)});
  }
  // Runs the next event; false when none is left before `end`.
  bool Step(int64_t end, const std::function<void(int node, const std::function<void()>&)>& run) {
    while (!queue_.empty()) {
      auto it = queue_.begin();
      if (it->first.time > end) return false;
      Event e = std::move(it->second);
      const int64_t t = it->first.time;
      queue_.erase(it);
      Node& n = nodes_[e.node];
      if (e.incarnation != n.incarnation) continue;  // the node restarted since
      if (t < n.paused_until) {                       // runs when the node runs again
        queue_.emplace(Key{n.paused_until, seq_++}, std::move(e));
        continue;
      }
      now_ = t;
      Mix(static_cast<uint64_t>(t));
      Mix(static_cast<uint64_t>(e.node));
      ++events_;
      run(e.node, e.fn);
      return true;
    }
    return false;
  }
  void Restart(int node) { ++nodes_[node].incarnation; }

  // The trace: FNV-1a over everything that happened.
  void Mix(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      hash_ ^= (v >> (8 * i)) & 0xff;
      hash_ *= 0x100000001b3ULL;
    }
  }
  void Mix(std::string_view s) {
    for (unsigned char c : s) {
      hash_ ^= c;
      hash_ *= 0x100000001b3ULL;
    }
    Mix(static_cast<uint64_t>(s.size()));
  }
  uint64_t hash() const { return hash_; }
  uint64_t events() const { return events_; }

 private:
  struct Key {
    int64_t time;
    uint64_t seq;
    bool operator<(const Key& o) const { return time != o.time ? time < o.time : seq < o.seq; }
  };
  struct Event {
    int node;
    uint64_t incarnation;
    std::function<void()> fn;
  };
  std::vector<Node> nodes_;
  std::map<Key, Event> queue_;
  int64_t now_ = 0;
  uint64_t seq_ = 0;
  uint64_t events_ = 0;
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

// One node's clock and timers: a TimeSource whose Now() runs at the node's rate.
class NodeTime final : public TimeSource {
 public:
  NodeTime(World* world, int node) : world_(world), node_(node) {}

  MonoTime Now() const override { return Local(world_->now()); }
  void Post(std::function<void()> task) override {
    world_->At(world_->now(), node_, std::move(task));
  }
  std::unique_ptr<Timer> NewTimer() override { return std::make_unique<SimTimer>(this); }

  MonoTime Local(int64_t t) const {
    const World::Node& n = world_->node(node_);
    const __int128 local = static_cast<__int128>(t) * (1'000'000 + n.rate_ppm) / 1'000'000;
    return MonoTime::FromNanos(n.origin + static_cast<int64_t>(local));
  }
  // The first true time at which the local clock reads at least `local`.
  int64_t TrueTimeOf(MonoTime local) const {
    const World::Node& n = world_->node(node_);
    const __int128 want = static_cast<__int128>(local.nanos() - n.origin) * 1'000'000;
    const int64_t rate = 1'000'000 + n.rate_ppm;
    int64_t t = static_cast<int64_t>((want + rate - 1) / rate);
    while (Local(t) < local) ++t;
    return t;
  }

 private:
  class SimTimer final : public Timer {
   public:
    explicit SimTimer(NodeTime* time) : time_(time), state_(std::make_shared<State>()) {}
    ~SimTimer() override { Cancel(); }
    void ArmAt(MonoTime when, std::function<void()> fire) override {
      Cancel();
      state_->armed = true;
      state_->when = when;
      const uint64_t mine = ++state_->arming;
      std::weak_ptr<State> weak = state_;
      time_->world_->At(time_->TrueTimeOf(when), time_->node_,
                        [weak, mine, fire = std::move(fire)] {
                          auto s = weak.lock();
                          if (!s || !s->armed || s->arming != mine) return;
                          s->armed = false;
                          fire();
                        });
    }
    void Cancel() override {
      state_->armed = false;
      ++state_->arming;
    }
    MonoTime armed_for() const override {
      return state_->armed ? state_->when : MonoTime::Max();
    }

   private:
    struct State {
      bool armed = false;
      MonoTime when;
      uint64_t arming = 0;
    };
    NodeTime* time_;
    std::shared_ptr<State> state_;
  };

  World* world_;
  int node_;
};

// A second event loop on a node's clock, as a process runs beside its main one (a standby
// replica's core has its own): tasks it posts die with it; timers die with their owners.
class LoopTime final : public TimeSource {
 public:
  explicit LoopTime(TimeSource* base) : base_(base), alive_(std::make_shared<bool>(true)) {}
  ~LoopTime() override { *alive_ = false; }
  MonoTime Now() const override { return base_->Now(); }
  void Post(std::function<void()> task) override {
    base_->Post([alive = alive_, task = std::move(task)] {
      if (*alive) task();
    });
  }
  std::unique_ptr<Timer> NewTimer() override { return base_->NewTimer(); }

 private:
  TimeSource* base_;
  std::shared_ptr<bool> alive_;
};

// True time as a Clock: the simulated etcd's (its leases expire on it).
class WorldClock final : public Clock {
 public:
  explicit WorldClock(const World* world) : world_(world) {}
  MonoTime Now() const override { return MonoTime::FromNanos(world_->now()); }

 private:
  const World* world_;
};

}  // namespace fencelock::sim

#endif  // FENCELOCK_SIM_WORLD_H_
