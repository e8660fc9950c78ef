#include "etcd_net.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace fencelock::sim {

using server::EtcdCalls;
using server::EtcdClient;
using server::EtcdWatch;

namespace {

// What one call's fate is, decided when it was submitted.
enum class Fate {
  kAnswered,      // applied, answered in time
  kAppliedLate,   // applied; the answer came after the timeout: kDeadlineExceeded
};

// The replica's client for one call: SimEtcd's, with the call's fate and the checks of who
// commits applied.
class FatedClient final : public EtcdClient {
 public:
  FatedClient(std::unique_ptr<EtcdClient> inner, EtcdNet::TxnCheck check,
              std::function<void()> on_renewal)
      : inner_(std::move(inner)), check_(std::move(check)), on_renewal_(std::move(on_renewal)) {}
  void set_fate(Fate fate) { fate_ = fate; }

  absl::StatusOr<etcdserverpb::RangeResponse> Range(
      const etcdserverpb::RangeRequest& request) override {
    return Late(inner_->Range(request));
  }
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request) override {
    if (check_.before) check_.before(request);
    auto out = inner_->Txn(request);
    if (check_.after) check_.after(request, out);
    return Late(std::move(out));
  }
  absl::Status Compact(int64_t revision) override {
    absl::Status s = inner_->Compact(revision);
    return fate_ == Fate::kAppliedLate ? Timeout() : s;
  }
  absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl) override {
    return Late(inner_->LeaseGrant(ttl));
  }
  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t id) override {
    auto out = inner_->LeaseKeepAlive(id);
    on_renewal_();
    return Late(std::move(out));
  }
  absl::Status LeaseRevoke(int64_t id) override {
    absl::Status s = inner_->LeaseRevoke(id);
    return fate_ == Fate::kAppliedLate ? Timeout() : s;
  }
  absl::StatusOr<LeaseLife> LeaseTimeToLive(int64_t id) override {
    return Late(inner_->LeaseTimeToLive(id));
  }
  absl::StatusOr<std::unique_ptr<EtcdWatch>> Watch(const std::string& key,
                                                   int64_t start_revision) override {
    return inner_->Watch(key, start_revision);
  }
  absl::StatusOr<etcdserverpb::StatusResponse> MemberStatus(size_t i) override {
    return Late(inner_->MemberStatus(i));
  }
  const std::vector<std::string>& endpoints() const override { return inner_->endpoints(); }
  size_t current() const override { return 0; }

 private:
  static absl::Status Timeout() {
    return absl::DeadlineExceededError("sim etcd: no answer within the request timeout");
  }
  template <typename T>
  absl::StatusOr<T> Late(absl::StatusOr<T> result) const {
    if (fate_ == Fate::kAppliedLate) return Timeout();
    return result;
  }

  std::unique_ptr<EtcdClient> inner_;
  EtcdNet::TxnCheck check_;
  std::function<void()> on_renewal_;
  Fate fate_ = Fate::kAnswered;
};

// A client that reaches nothing: the answer of a request that never arrived in time.
class TimedOutClient final : public EtcdClient {
 public:
  explicit TimedOutClient(const std::vector<std::string>* endpoints) : endpoints_(endpoints) {}
  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest&) override {
    return Timeout();
  }
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest&) override {
    return Timeout();
  }
  absl::Status Compact(int64_t) override { return Timeout(); }
  absl::StatusOr<int64_t> LeaseGrant(absl::Duration) override { return Timeout(); }
  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t) override { return Timeout(); }
  absl::Status LeaseRevoke(int64_t) override { return Timeout(); }
  absl::StatusOr<LeaseLife> LeaseTimeToLive(int64_t) override { return Timeout(); }
  absl::StatusOr<std::unique_ptr<EtcdWatch>> Watch(const std::string&, int64_t) override {
    return Timeout();
  }
  absl::StatusOr<etcdserverpb::StatusResponse> MemberStatus(size_t) override { return Timeout(); }
  const std::vector<std::string>& endpoints() const override { return *endpoints_; }
  size_t current() const override { return 0; }

 private:
  static absl::Status Timeout() {
    return absl::DeadlineExceededError("sim etcd: the request did not reach etcd in time");
  }
  const std::vector<std::string>* endpoints_;
};

}  // namespace

struct EtcdNet::WatchEntry {
  std::unique_ptr<EtcdWatch> inner;
  int node = 0;
  std::shared_ptr<const bool> alive;  // the EtcdCalls that asked
  EtcdCalls::WatchReport report;
  int64_t last_delivery = 0;  // reports arrive in order
  bool done = false;
};

class EtcdNet::Watching final : public server::EtcdWatching {
 public:
  explicit Watching(std::shared_ptr<WatchEntry> entry) : entry_(std::move(entry)) {}
  ~Watching() override {
    entry_->done = true;
    if (entry_->inner) entry_->inner->Cancel();
  }

 private:
  std::shared_ptr<WatchEntry> entry_;
};

class EtcdNet::Calls final : public EtcdCalls {
 public:
  Calls(EtcdNet* net, int node, std::unique_ptr<EtcdClient> client, absl::Duration timeout,
        std::shared_ptr<const bool> dead, TxnCheck check)
      : net_(net),
        node_(node),
        endpoints_(client->endpoints()),
        client_(std::make_shared<FatedClient>(std::move(client), std::move(check),
                                              [net, node] { net->Stall(node); })),
        timed_out_(&endpoints_),
        timeout_(Ns(timeout)),
        dead_(std::move(dead)),
        alive_(std::make_shared<bool>(true)) {}
  ~Calls() override { *alive_ = false; }

  void Submit(Call call) override {
    if (*dead_) return;
    World* world = net_->world_;
    const int64_t sent = world->now();
    const int64_t to = net_->Leg();
    const int64_t back = net_->Leg();
    auto deliver = [world, node = node_, alive = alive_](int64_t at, std::function<void()> answer) {
      world->At(at, node, [alive, answer = std::move(answer)] {
        if (*alive) answer();
      });
    };
    if (to > timeout_) {
      ++net_->timeouts_;
      // Asked for at the timeout: the request is dropped, its answer is the deadline's.
      world->At(sent + timeout_, net_->etcd_node_,
                [this, alive = alive_, deliver, call = std::move(call)]() mutable {
                  if (!*alive) return;
                  deliver(net_->world_->now(), call(timed_out_));
                });
      return;
    }
    const bool late = to + back > timeout_;
    if (late) ++net_->timeouts_;
    // The call runs at etcd even if the replica is gone by then: it was on the wire. `this`
    // may be gone too, so the client goes with the event.
    world->At(sent + to, net_->etcd_node_,
              [net = net_, client = client_ptr(), alive = alive_, deliver, late,
               answer_at = sent + (late ? timeout_ : to + back), call = std::move(call)]() mutable {
                ++net->calls_;
                client->set_fate(late ? Fate::kAppliedLate : Fate::kAnswered);
                std::function<void()> answer = call(*client);
                client->set_fate(Fate::kAnswered);
                net->ArmTick();
                if (*alive) deliver(answer_at, std::move(answer));
              });
  }

  std::unique_ptr<server::EtcdWatching> Watch(std::string key, int64_t start_revision,
                                              WatchReport report) override {
    auto entry = std::make_shared<WatchEntry>();
    entry->node = node_;
    entry->alive = alive_;
    entry->report = std::move(report);
    if (*dead_) {
      entry->done = true;
      return std::make_unique<Watching>(entry);
    }
    World* world = net_->world_;
    const int64_t to = std::min(net_->Leg(), timeout_);
    world->At(world->now() + to, net_->etcd_node_,
              [net = net_, client = client_ptr(), entry, key = std::move(key), start_revision] {
                if (entry->done || !*entry->alive) return;
                auto inner = client->Watch(key, start_revision);
                if (!inner.ok()) {
                  entry->done = true;
                  const int64_t at = net->world_->now() + net->Leg();
                  net->world_->At(at, entry->node, [entry, s = inner.status()] {
                    if (*entry->alive) entry->report(s);
                  });
                  return;
                }
                entry->inner = std::move(*inner);
                net->watches_.push_back(entry);
                net->PollWatches();
              });
    return std::make_unique<Watching>(entry);
  }

  const std::vector<std::string>& endpoints() const override { return endpoints_; }

 private:
  // The client outlives this object while calls it sent are still on their way.
  std::shared_ptr<FatedClient> client_ptr() { return client_; }

  EtcdNet* const net_;
  const int node_;
  const std::vector<std::string> endpoints_;
  std::shared_ptr<FatedClient> client_;
  TimedOutClient timed_out_;
  const int64_t timeout_;
  std::shared_ptr<const bool> dead_;
  std::shared_ptr<bool> alive_;
};

EtcdNet::EtcdNet(World* world, Rng* rng, int etcd_node, SimEtcd* etcd)
    : world_(world), rng_(rng), etcd_node_(etcd_node), etcd_(etcd) {}

EtcdNet::~EtcdNet() = default;

std::unique_ptr<EtcdCalls> EtcdNet::Connect(int node, const std::string& name,
                                            absl::Duration timeout,
                                            std::shared_ptr<const bool> dead, TxnCheck check) {
  return std::make_unique<Calls>(this, node,
                                 etcd_->Connect(name, {"sim-etcd-0", "sim-etcd-1", "sim-etcd-2"}),
                                 timeout, std::move(dead), std::move(check));
}

void EtcdNet::Stall(int node) {
  auto it = stalls_.find(node);
  if (it == stalls_.end()) return;
  World::Node& n = world_->node(node);
  n.paused_until = std::max(n.paused_until, world_->now() + it->second);
  world_->Mix(static_cast<uint64_t>(node) | (uint64_t{0x57} << 56));
  stalls_.erase(it);
}

int64_t EtcdNet::Leg() {
  if (world_->now() < slow_until_) return Ns(rng_->Between(absl::Milliseconds(20), absl::Milliseconds(600)));
  return Ns(rng_->Between(absl::Microseconds(100), absl::Milliseconds(2)));
}

void EtcdNet::OnChange() {
  if (!poll_scheduled_) {
    poll_scheduled_ = true;
    world_->At(world_->now(), etcd_node_, [this] {
      poll_scheduled_ = false;
      PollWatches();
    });
  }
}

void EtcdNet::PollWatches() {
  for (auto it = watches_.begin(); it != watches_.end();) {
    WatchEntry& w = **it;
    if (w.done || !*w.alive) {
      it = watches_.erase(it);
      continue;
    }
    auto changes = w.inner->Poll();
    if (changes.ok() && !changes->has_value()) {
      ++it;
      continue;
    }
    absl::StatusOr<EtcdWatch::Changes> report =
        changes.ok() ? absl::StatusOr<EtcdWatch::Changes>(std::move(**changes))
                     : absl::StatusOr<EtcdWatch::Changes>(changes.status());
    w.last_delivery = std::max(w.last_delivery, world_->now() + Leg());
    world_->At(w.last_delivery, w.node, [entry = *it, report = std::move(report)] {
      if (!entry->done && *entry->alive) entry->report(report);
    });
    if (!changes.ok()) {
      w.done = true;
      it = watches_.erase(it);
    } else {
      ++it;
    }
  }
}

void EtcdNet::ArmTick() {
  const MonoTime next = etcd_->NextExpiry();
  if (next == MonoTime::Max() || next.nanos() >= tick_at_) return;
  tick_at_ = next.nanos();
  world_->At(tick_at_, etcd_node_, [this] {
    tick_at_ = INT64_MAX;
    etcd_->Tick();
    ArmTick();
  });
}

}  // namespace fencelock::sim
