#include "sim/simulator.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clock/time_source.h"
#include "fencelock/wire.pb.h"
#include "lease.h"  // the client library's lease rules (D1, D3, D5)
#include "lock-server/commit_log.h"
#include "lock-server/local_commit_log.h"
#include "lock-server/server_core.h"
#include "lock-server/storage.h"
#include "protocol/frame.h"
#include "protocol/version.h"
#include "sim_disk.h"

namespace fencelock::sim {
namespace {

using client_internal::LeaseState;
using server::CommitLog;
using server::CommitLogListener;
using server::CommitLogStats;
using server::ConnectionId;
using server::ConnectionSink;
using server::FenceToken;
using server::Record;
using server::ServerCore;
using server::SessionId;
using server::StateMachine;

constexpr char kDataDir[] = "/lockd";
constexpr int kLockd = 0;  // node 0 is lockd; clients are 1..N; the last node is the
                           // environment (faults), which never pauses or restarts
constexpr absl::Duration kRequestTimeout = absl::Milliseconds(800);

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

int64_t Ns(absl::Duration d) { return absl::ToInt64Nanoseconds(d); }

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

class Simulation;

// Records every record lockd appends and learns which are committed, for the checks.
class RecordingLog final : public CommitLog, public CommitLogListener {
 public:
  RecordingLog(std::unique_ptr<CommitLog> inner, Simulation* sim)
      : inner_(std::move(inner)), sim_(sim) {}
  void SetListener(CommitLogListener* listener) override {
    listener_ = listener;
    inner_->SetListener(this);
  }
  void ReserveFor(FenceToken token, SessionId session) override {
    inner_->ReserveFor(token, session);
  }
  void Append(const Record& record) override;
  void Flush() override { inner_->Flush(); }
  void StartIfIdle() override { inner_->StartIfIdle(); }
  void Snapshot(const StateMachine& state) override { inner_->Snapshot(state); }
  uint64_t newest_batch() const override { return inner_->newest_batch(); }
  uint64_t committed_batch() const override { return inner_->committed_batch(); }
  uint64_t last_lsn() const override { return inner_->last_lsn(); }
  const absl::Status* fault() const override { return inner_->fault(); }
  std::string Describe() const override { return inner_->Describe(); }
  CommitLogStats stats() const override { return inner_->stats(); }

  void OnCommitted(uint64_t batch) override;
  void OnCommitFault(const absl::Status& status) override;
  void OnSnapshotDue() override { listener_->OnSnapshotDue(); }

 private:
  std::unique_ptr<CommitLog> inner_;
  Simulation* sim_;
  CommitLogListener* listener_ = nullptr;
  std::map<uint64_t, uint64_t> batch_last_lsn_;
  uint64_t reported_ = 0;  // the highest batch OnCommitted() was told of
};

struct Connection {
  int client = 0;
  bool open = true;
  ConnectionId server_id = 0;  // 0 until lockd accepted it
  int64_t last_to_server = 0;  // TCP: frames arrive in order
  int64_t last_to_client = 0;
  protocol::FrameDecoder decoder;  // the client's side
};

// A request in flight, as the client remembers it.
struct Pending {
  enum class Kind { kHello, kOpen, kResume, kKeepAlive, kAcquire, kRelease, kClose, kWithdraw } kind;
  MonoTime t_send;
  absl::Duration timeout;
  std::string lock;
  FenceToken token = 0;
  absl::Duration ttl;
  std::vector<std::pair<std::string, FenceToken>> renewed;
  // kAcquire: the client withdrew it (WithdrawAcquire) and no longer waits for it.
  bool withdrawn = false;
  // kWithdraw: the request id of the Acquire it withdraws.
  uint64_t acquire_id = 0;
};

class SimClient {
 public:
  SimClient(Simulation* sim, int node, World* world, Rng* rng)
      : sim_(sim), node_(node), world_(world), rng_(rng), time_(world, node) {}
  void Start();
  void OnResponse(int conn, const wire::Response& r);
  void OnDisconnected(int conn);
  int node() const { return node_; }
  int conn() const { return conn_; }

 private:
  void Connect();
  void Send(Pending p, wire::Request r);
  void Work();
  void Heartbeat();
  void CheckTimeouts();
  void Drop(const std::string& lock);
  void DropAll() {
    for (auto& [lock, lease] : held_) lease->MarkLost(LossReason::kSessionLost);
    held_.clear();
  }
  MonoTime Deadline(MonoTime t_send, absl::Duration ttl) const;

  Simulation* sim_;
  int node_;
  World* world_;
  Rng* rng_;
  NodeTime time_;
  int conn_ = -1;
  uint64_t next_request_ = 0;
  SessionId session_ = 0;
  std::string secret_;  // resumes session_ on a new connection
  MonoTime session_deadline_ = MonoTime::Min();  // the client's own estimate (D1)
  bool opening_ = false;
  absl::Duration session_ttl_;
  std::map<std::string, std::shared_ptr<LeaseState>> held_;
  std::map<uint64_t, Pending> pending_;
  bool acquiring_ = false;
  uint64_t acquire_id_ = 0;  // of the Acquire in flight, while acquiring_
  // Acquires on this connection that lockd said it withdrew: none of them may be granted.
  std::set<uint64_t> withdrawn_;
  std::unique_ptr<Timer> work_, heartbeat_, timeouts_, reconnect_;
};

class Simulation {
 public:
  explicit Simulation(const SimOptions& options)
      : options_(options),
        rng_(options.seed),
        secrets_(options.seed ^ 0x5ec7e75ec7e75ULL),
        world_(options.clients + 2),
        env_node_(options.clients + 1) {
    result_.seed = options.seed;
  }
  SimResult Run();

  // Called by the parts.
  World* world() { return &world_; }
  Rng* rng() { return &rng_; }
  const SimOptions& options() const { return options_; }
  int OpenConnection(int client_node);
  void ClientSend(int conn, const wire::Request& r);
  void CutConnection(int conn);
  void OnAppended(uint64_t lsn, const Record& r);
  void OnCommittedLsn(uint64_t lsn) { committed_lsn_ = std::max(committed_lsn_, lsn); }
  void OnDiskFault() {
    ++result_.disk_faults;
    // An operator restarts lockd once the disk is fixed.
    world_.At(world_.now() + Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(1))),
              env_node_, [this] { Crash(); });
  }
  void Fail(const std::string& what) {
    if (result_.failures.size() < 20) {
      result_.failures.push_back(absl::StrFormat("t=%.6fs: %s", world_.now() / 1e9, what));
    }
    result_.ok = false;
  }
  // checkStillHeld said "held" for `token` on `lock`.
  void CheckHeld(int client, const std::string& lock, FenceToken token);
  void CountGrant(FenceToken token) {
    ++result_.grants;
    if (!acked_tokens_.insert(token).second) {
      Fail(absl::StrCat("token ", token, " was acknowledged twice"));
    }
  }
  void CountFencedOut() { ++result_.fenced_out; }
  void CountWithdrawal() { ++result_.withdrawals; }
  // Whether a lock renewal or release with `token` was stale when lockd received it.
  bool WasStale(uint64_t conn, uint64_t request_id, const std::string& lock) const {
    return stale_.contains({conn, request_id, lock});
  }
  bool bounds_hold() const { return options_.lockd_fast_clock == 0; }

  class Sink;

 private:
  void StartLockd();
  void Crash();
  void ScheduleFaults();
  // One of the connections now open, or -1.
  int RandomOpenConnection();
  void DeliverToLockd(int conn, std::string payload, wire::Request request);
  // Runs one lockd event with the FIFO check around it.
  void RunLockdEvent(const std::function<void()>& fn);
  void CheckReplyGate(int conn, std::string_view frames);

  SimOptions options_;
  Rng rng_;
  Rng secrets_;  // session secrets, apart from rng_ so that they change no other draw
  World world_;
  SimResult result_;
  SimDisk disk_;
  std::unique_ptr<NodeTime> lockd_time_;
  std::unique_ptr<ServerCore> core_;
  std::vector<std::unique_ptr<Sink>> sinks_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<std::unique_ptr<SimClient>> clients_;
  // What lockd appended, by lsn, across incarnations (lost records are cut off at recovery).
  std::map<uint64_t, Record> appended_;
  uint64_t committed_lsn_ = 0;
  FenceToken max_token_appended_ = 0;  // in this run of lockd
  FenceToken max_token_sent_ = 0;      // the highest token in any reply that left lockd
  std::map<FenceToken, uint64_t> grant_lsn_;      // token -> lsn of its grant
  std::map<SessionId, uint64_t> session_lsn_;     // session -> lsn of its opening
  // KeepAlives lockd received and has not answered, by (connection, request id): the session
  // and the tokens an OK answer asserts.
  std::map<std::pair<int, uint64_t>, std::pair<SessionId, std::vector<FenceToken>>> renewals_;
  std::set<FenceToken> acked_tokens_;
  std::set<std::tuple<uint64_t, uint64_t, std::string>> stale_;  // conn, request, lock
  std::vector<std::pair<std::string, SessionId>> grants_this_event_;
  bool lockd_up_ = false;
  int64_t handoff_at_ = 0;  // when the log's last completion reaches lockd's thread
  const int env_node_;
  // One-way partitions of a client's link: nothing it sends (or nothing sent to it) arrives
  // before these true times; TCP then delivers what was sent, in order.
  std::map<int, int64_t> blocked_to_server_, blocked_to_client_;
};

class Simulation::Sink final : public ConnectionSink {
 public:
  Sink(Simulation* sim, int conn) : sim_(sim), conn_(conn) {}
  void Send(std::string_view frames) override;
  void CloseAfterSend() override;

 private:
  Simulation* sim_;
  int conn_;
};

// ---- RecordingLog ----

void RecordingLog::Append(const Record& record) {
  const uint64_t before = inner_->last_lsn();
  inner_->Append(record);
  if (inner_->last_lsn() == before) return;  // renewals are not logged
  batch_last_lsn_[inner_->newest_batch()] = inner_->last_lsn();
  sim_->OnAppended(inner_->last_lsn(), record);
}

void RecordingLog::OnCommitted(uint64_t batch) {
  // What the log says is committed never goes back. If it did, a reply tagged with a batch
  // already durable would wait for a later batch, and on a quiet lockd none comes: the reply
  // is never sent. (Safety checks do not see that; lockd's first M7 run hung on it.)
  if (batch < reported_) {
    sim_->Fail(absl::StrCat("the log reported batch ", batch, " committed after batch ", reported_));
  }
  if (inner_->committed_batch() < batch) {
    sim_->Fail(absl::StrCat("the log reported batch ", batch, " committed while committed_batch() is ",
                            inner_->committed_batch()));
  }
  reported_ = std::max(reported_, batch);
  for (auto it = batch_last_lsn_.begin(); it != batch_last_lsn_.end() && it->first <= batch;) {
    sim_->OnCommittedLsn(it->second);
    it = batch_last_lsn_.erase(it);
  }
  listener_->OnCommitted(batch);
}

void RecordingLog::OnCommitFault(const absl::Status& status) {
  sim_->OnDiskFault();
  listener_->OnCommitFault(status);
}

// ---- the network ----

int Simulation::OpenConnection(int client_node) {
  const int id = static_cast<int>(conns_.size());
  auto c = std::make_unique<Connection>();
  c->client = client_node;
  const int64_t arrive =
      std::max(world_.now() + Ns(rng_.Between(absl::Microseconds(50), absl::Microseconds(500))),
               blocked_to_server_[client_node]);
  c->last_to_server = arrive;
  conns_.push_back(std::move(c));
  sinks_.push_back(std::make_unique<Sink>(this, id));
  if (!lockd_up_) {
    // Nobody listens: the connection is refused.
    world_.At(arrive, client_node, [this, id] {
      conns_[id]->open = false;
      clients_[conns_[id]->client - 1]->OnDisconnected(id);
    });
    return id;
  }
  world_.At(arrive, kLockd, [this, id] {
    if (!conns_[id]->open) return;
    if (core_) conns_[id]->server_id = core_->Connect(sinks_[id].get());
  });
  return id;
}

int64_t NetworkDelay(Rng& rng, bool faults) {
  if (faults && rng.Chance(0.01)) return Ns(rng.Between(absl::Milliseconds(20), absl::Milliseconds(300)));
  return Ns(rng.Between(absl::Microseconds(50), absl::Microseconds(1500)));
}

void Simulation::ClientSend(int conn, const wire::Request& r) {
  Connection& c = *conns_[conn];
  if (!c.open) return;
  const int64_t at = std::max({c.last_to_server, blocked_to_server_[c.client],
                               world_.now() + NetworkDelay(rng_, options_.network_faults)});
  c.last_to_server = at;
  std::string payload = r.SerializeAsString();
  world_.At(at, kLockd, [this, conn, payload = std::move(payload), r] {
    DeliverToLockd(conn, payload, r);
  });
}

void Simulation::DeliverToLockd(int conn, std::string payload, wire::Request request) {
  Connection& c = *conns_[conn];
  if (!c.open || c.server_id == 0 || !core_) return;
  world_.Mix(payload);
  // Which lock renewals and releases are stale on arrival: lockd must never accept those.
  const auto& state = core_->service().state();
  auto note = [&](const std::string& lock, FenceToken token) {
    const auto* h = state.FindHolder(lock);
    if (h == nullptr || h->token != token) stale_.insert({conn, request.request_id(), lock});
  };
  if (request.has_keep_alive()) {
    auto& renewal = renewals_[{conn, request.request_id()}];
    renewal.first = request.keep_alive().session_id();
    for (const auto& l : request.keep_alive().locks()) {
      note(l.lock(), l.token());
      renewal.second.push_back(l.token());
    }
  } else if (request.has_release()) {
    note(request.release().lock(), request.release().token());
  }
  core_->Receive(c.server_id, std::span<const std::string>(&payload, 1));
}

void Simulation::Sink::Send(std::string_view frames) {
  Simulation* sim = sim_;
  sim->CheckReplyGate(conn_, frames);
  Connection& c = *sim->conns_[conn_];
  if (!c.open) return;
  const int64_t at =
      std::max({c.last_to_client, sim->blocked_to_client_[c.client],
                sim->world_.now() + NetworkDelay(sim->rng_, sim->options_.network_faults)});
  c.last_to_client = at;
  const int conn = conn_;
  sim->world_.At(at, c.client, [sim, conn, bytes = std::string(frames)] {
    Connection& c = *sim->conns_[conn];
    if (!c.open) return;
    sim->world_.Mix(bytes);
    c.decoder.Feed(bytes);
    std::string payload;
    while (c.decoder.Next(&payload) == protocol::FrameDecoder::Result::kFrame) {
      wire::Response r;
      if (!r.ParseFromString(payload)) {
        sim->Fail("a reply from lockd does not parse");
        continue;
      }
      sim->clients_[c.client - 1]->OnResponse(conn, r);
      if (!c.open) break;
    }
  });
}

void Simulation::Sink::CloseAfterSend() {
  Simulation* sim = sim_;
  const int conn = conn_;
  const int64_t at = sim->conns_[conn]->last_to_client + 1;
  sim->world_.At(at, kLockd, [sim, conn] { sim->CutConnection(conn); });
}

void Simulation::CutConnection(int conn) {
  Connection& c = *conns_[conn];
  if (!c.open) return;
  c.open = false;
  world_.Mix(static_cast<uint64_t>(conn) | (uint64_t{0xC} << 56));
  if (c.server_id != 0 && core_) {
    const ConnectionId id = c.server_id;
    world_.At(world_.now() + Ns(absl::Microseconds(100)), kLockd,
              [this, id] {
                if (core_) core_->Disconnect(id);
              });
  }
  const int client = c.client;
  world_.At(world_.now() + Ns(absl::Microseconds(100)), client,
            [this, conn, client] { clients_[client - 1]->OnDisconnected(conn); });
}

// ---- lockd ----

void Simulation::StartLockd() {
  server::LocalCommitLogOptions log_options{.env = &disk_,
                                            .dir = kDataDir,
                                            .segment_bytes = 16 << 10,
                                            .reservation_block = 7,
                                            // Half the runs sync small batches on lockd's own
                                            // thread when no batch is in flight, as lockd does.
                                            .inline_sync_max_records = rng_.Chance(0.5) ? 4u : 0u,
                                            .now = [this] { return lockd_time_->Now(); },
                                            .log = [](const std::string&) {}};
  log_options.schedule_writer = [this](std::function<void()> step) {
    absl::Duration latency = rng_.Between(absl::Microseconds(100), absl::Milliseconds(1));
    if (options_.disk_faults && rng_.Chance(0.02)) {
      latency = rng_.Between(absl::Milliseconds(50), absl::Milliseconds(400));  // a slow sync
    }
    world_.At(world_.now() + Ns(latency), kLockd, std::move(step));
  };
  // The writer hands its completions to lockd's thread across threads: they arrive in order,
  // each some microseconds later, and lockd may run other events (an inline sync) meanwhile.
  auto opened = server::OpenLocalCommitLog(
      log_options, lockd_time_->Now(), [this](std::function<void()> f) {
        handoff_at_ = std::max(handoff_at_, world_.now() + rng_.Between(0, Ns(absl::Microseconds(500))));
        world_.At(handoff_at_, kLockd, std::move(f));
      });
  if (!opened.ok()) {
    Fail(absl::StrCat("lockd does not recover after a crash: ", opened.status().ToString()));
    return;
  }
  // Nothing committed may be lost, and recovery must give exactly the log up to where it ends.
  const uint64_t recovered_lsn = opened->log->last_lsn();
  if (recovered_lsn < committed_lsn_) {
    Fail(absl::StrCat("recovery ends at lsn ", recovered_lsn, " but lsn ", committed_lsn_,
                      " was committed (acknowledged state lost)"));
  }
  appended_.erase(appended_.upper_bound(recovered_lsn), appended_.end());
  max_token_appended_ = 0;
  committed_lsn_ = recovered_lsn;
  StateMachine replayed;
  for (const auto& [lsn, r] : appended_) replayed.Apply(r, lockd_time_->Now());
  if (replayed.DebugString() != opened->state.DebugString()) {
    Fail(absl::StrCat("recovered state differs from the committed log: recovered {",
                      opened->state.DebugString(), "} log {", replayed.DebugString(), "}"));
  }
  if (!acked_tokens_.empty() && opened->state.last_token() < *acked_tokens_.rbegin()) {
    Fail(absl::StrCat("after recovery the next token would be ", opened->state.last_token() + 1,
                      ", but token ", *acked_tokens_.rbegin(), " was acknowledged"));
  }
  opened->log = std::make_unique<RecordingLog>(std::move(opened->log), this);
  server::CoreOptions core_options{
      .service = server::ServiceOptions{.min_ttl = absl::Milliseconds(10),
                                        .max_ttl = absl::Seconds(60),
                                        .max_wait = absl::Seconds(60)},
      .hello_timeout = absl::Seconds(2),
      .stall_threshold = absl::Seconds(1),
      .log = [](const std::string&) {},
      .session_secrets = [this] {
        std::string secret(16, '\0');
        for (char& c : secret) c = static_cast<char>(secrets_.Next());
        return secret;
      }};
  core_ = std::make_unique<ServerCore>(core_options, lockd_time_.get(), std::move(*opened));
  core_->Start();
  lockd_up_ = true;
}

void Simulation::Crash() {
  if (!lockd_up_) return;
  ++result_.crashes;
  world_.Mix(uint64_t{0xDEAD});
  lockd_up_ = false;
  world_.Restart(kLockd);  // every pending lockd event (timers, disk steps, deliveries) is gone
  core_.reset();
  renewals_.clear();  // none of them will be answered
  for (size_t i = 0; i < conns_.size(); ++i) {
    if (conns_[i]->open) {
      conns_[i]->server_id = 0;
      CutConnection(static_cast<int>(i));
    }
  }
  disk_.ClearFaults();
  disk_.Crash([this](uint64_t unsynced) -> uint64_t {
    return rng_.Chance(0.5) ? 0 : rng_.Below(unsynced + 1);  // lost, or torn
  });
  const int64_t back = world_.now() + Ns(rng_.Between(absl::Milliseconds(50), absl::Seconds(1)));
  world_.At(back, kLockd, [this] { StartLockd(); });
}

void Simulation::OnAppended(uint64_t lsn, const Record& r) {
  appended_[lsn] = r;
  if (const auto* g = std::get_if<server::record::LockGranted>(&r)) {
    // Within one run of lockd every grant takes a higher token; across crashes no grant may
    // take a token that ever left lockd (in any reply). A token granted but never acknowledged
    // (its batch lost with its reservation) was never issued and may be used again.
    if (g->token <= max_token_appended_) {
      Fail(absl::StrCat("token ", g->token, " granted after token ", max_token_appended_,
                        " in the same run of lockd"));
    }
    if (g->token <= max_token_sent_) {
      Fail(absl::StrCat("token ", g->token, " granted again: token ", max_token_sent_,
                        " already left lockd"));
    }
    max_token_appended_ = g->token;
    grant_lsn_[g->token] = lsn;
    grants_this_event_.emplace_back(g->lock, g->session);
  } else if (const auto* o = std::get_if<server::record::SessionOpened>(&r)) {
    session_lsn_[o->session] = lsn;
  }
}

void Simulation::CheckReplyGate(int conn, std::string_view frames) {
  protocol::FrameDecoder decoder;
  decoder.Feed(frames);
  std::string payload;
  while (decoder.Next(&payload) == protocol::FrameDecoder::Result::kFrame) {
    wire::Response r;
    if (!r.ParseFromString(payload)) continue;
    if (r.has_acquire() && r.acquire().granted()) {
      max_token_sent_ = std::max(max_token_sent_, r.acquire().token());
    }
    for (const auto& l : r.list().locks()) max_token_sent_ = std::max(max_token_sent_, l.token());
    if (r.code() != wire::OK) continue;
    auto committed = [&](const std::map<uint64_t, uint64_t>& lsns, uint64_t key,
                         const char* what) {
      auto it = lsns.find(key);
      if (it != lsns.end() && it->second > committed_lsn_) {
        Fail(absl::StrCat("reply acknowledging ", what, " ", key, " left lockd before lsn ",
                          it->second, " was committed (committed: ", committed_lsn_, ")"));
      }
    };
    if (r.has_acquire() && r.acquire().granted()) committed(grant_lsn_, r.acquire().token(), "grant of token");
    if (r.has_open_session()) committed(session_lsn_, r.open_session().session_id(), "session");
    if (r.has_keep_alive()) {
      // A renewal is answered without waiting for other batches; what it asserts (its session
      // and tokens) must be committed all the same.
      auto renewal = renewals_.find({conn, r.request_id()});
      if (renewal == renewals_.end()) continue;
      const bool all_ok = std::all_of(r.keep_alive().lock_codes().begin(),
                                      r.keep_alive().lock_codes().end(),
                                      [](int code) { return code == wire::OK; });
      if (all_ok) {
        committed(session_lsn_, renewal->second.first, "renewal of session");
        for (FenceToken token : renewal->second.second) {
          committed(grant_lsn_, token, "renewal of token");
        }
      }
      renewals_.erase(renewal);
    }
  }
}

void Simulation::RunLockdEvent(const std::function<void()>& fn) {
  // FIFO: a grant to a waiter while an earlier waiter for the same lock stays queued skips it.
  std::map<std::string, std::vector<SessionId>> before;
  if (core_) {
    for (int l = 0; l < options_.locks; ++l) {
      const std::string lock = absl::StrCat("lock-", l);
      before[lock] = core_->service().QueuedSessions(lock);
    }
  }
  grants_this_event_.clear();
  fn();
  if (!core_) return;
  for (const auto& [lock, session] : grants_this_event_) {
    const auto& queue = before[lock];
    auto pos = std::find(queue.begin(), queue.end(), session);
    if (pos == queue.end()) continue;  // not a waiter
    const auto after = core_->service().QueuedSessions(lock);
    for (auto it = queue.begin(); it != pos; ++it) {
      if (std::find(after.begin(), after.end(), *it) != after.end()) {
        Fail(absl::StrCat("lock ", lock, " went to waiting session ", session,
                          " while session ", *it, ", queued before it, still waits"));
      }
    }
  }
}

void Simulation::CheckHeld(int client, const std::string& lock, FenceToken token) {
  ++result_.checks_passed;
  if (!core_) return;
  const auto* holder = core_->service().state().FindHolder(lock);
  if (holder == nullptr || holder->token == token) return;
  ++result_.overlaps;
  if (bounds_hold()) {
    Fail(absl::StrCat("client ", client, " passed checkStillHeld for ", lock, " with token ",
                      token, " while session ", holder->session, " holds it with token ",
                      holder->token));
  }
}

// ---- faults ----

int Simulation::RandomOpenConnection() {
  std::vector<int> open;
  for (size_t c = 0; c < conns_.size(); ++c) {
    if (conns_[c]->open) open.push_back(static_cast<int>(c));
  }
  return open.empty() ? -1 : open[rng_.Below(open.size())];
}

void Simulation::ScheduleFaults() {
  const int64_t end = Ns(options_.duration);
  if (options_.crashes) {
    for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
      world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this] { Crash(); });
    }
  }
  if (options_.disk_faults && rng_.Chance(0.25)) {
    world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this] {
      if (lockd_up_) disk_.FailNextSync();
    });
  }
  if (options_.pauses) {
    for (int i = 0, n = static_cast<int>(rng_.Below(4)); i < n; ++i) {
      const int node = static_cast<int>(rng_.Below(options_.clients + 1));
      const int64_t at = rng_.Between(0, end);
      const int64_t length = Ns(rng_.Between(absl::Milliseconds(300), absl::Seconds(6)));
      // The pause itself is not an event of the node: it happens to it.
      world_.At(at, env_node_, [this, node, length] {
        ++result_.pauses;
        World::Node& n = world_.node(node);
        n.paused_until = std::max(n.paused_until, world_.now() + length);
        world_.Mix(static_cast<uint64_t>(node) | (uint64_t{0xF} << 56));
      });
    }
  }
  if (options_.network_faults) {
    for (int i = 0, n = static_cast<int>(rng_.Below(6)); i < n; ++i) {
      world_.At(rng_.Between(0, end), env_node_, [this] {
        // A cut of a random open connection (a reset, a dead middlebox).
        const int conn = RandomOpenConnection();
        if (conn < 0) return;
        ++result_.cuts;
        CutConnection(conn);
      });
    }
    for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
      // A one-way partition: one direction of a connection stops delivering for a while; TCP
      // delivers what was sent once it heals, unless a side gives up first.
      world_.At(rng_.Between(0, end), env_node_, [this] {
        const int conn = RandomOpenConnection();
        if (conn < 0) return;
        Connection& c = *conns_[conn];
        const int64_t heal = world_.now() + Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(3)));
        if (rng_.Chance(0.5)) {
          c.last_to_server = std::max(c.last_to_server, heal);
        } else {
          c.last_to_client = std::max(c.last_to_client, heal);
        }
      });
    }
    for (int i = 0, n = static_cast<int>(rng_.Below(8)); i < n; ++i) {
      // A one-way partition of a client's whole link, across its reconnects.
      world_.At(rng_.Between(0, end), env_node_, [this] {
        const int client = 1 + static_cast<int>(rng_.Below(options_.clients));
        const int64_t heal = world_.now() + Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(4)));
        auto& blocked = rng_.Chance(0.5) ? blocked_to_server_ : blocked_to_client_;
        blocked[client] = std::max(blocked[client], heal);
        world_.Mix(static_cast<uint64_t>(client) | (uint64_t{0xB} << 56));
      });
    }
  }
}

SimResult Simulation::Run() {
  const int64_t bound_ppm = static_cast<int64_t>(options_.clock_rate_bound * 1e6);
  for (int n = 0; n <= options_.clients; ++n) {
    World::Node& node = world_.node(n);
    node.rate_ppm = rng_.Between(-bound_ppm, bound_ppm);
    node.origin = Ns(absl::Hours(1)) + rng_.Between(0, Ns(absl::Hours(100)));
  }
  if (options_.lockd_fast_clock > 0) {
    world_.node(kLockd).rate_ppm = static_cast<int64_t>(options_.lockd_fast_clock * 1e6);
  }
  lockd_time_ = std::make_unique<NodeTime>(&world_, kLockd);
  if (absl::Status s = server::InitDataDir(&disk_, kDataDir, 16 << 10); !s.ok()) {
    Fail(absl::StrCat("init: ", s.ToString()));
    return result_;
  }
  RunLockdEvent([&] { StartLockd(); });
  for (int c = 1; c <= options_.clients; ++c) {
    clients_.push_back(std::make_unique<SimClient>(this, c, &world_, &rng_));
  }
  for (auto& c : clients_) c->Start();
  ScheduleFaults();
  const int64_t end = Ns(options_.duration);
  while (result_.ok &&
         world_.Step(end, [this](int node, const std::function<void()>& fn) {
           if (node == kLockd) {
             RunLockdEvent(fn);
           } else {
             fn();
           }
         })) {
  }
  result_.events = world_.events();
  result_.trace_hash = world_.hash();
  // Timers and clients refer to the core: tear down in order.
  core_.reset();
  clients_.clear();
  return result_;
}

// ---- the client ----

MonoTime SimClient::Deadline(MonoTime t_send, absl::Duration ttl) const {
  return UsableDeadline(t_send, ttl, sim_->options().safety_margin);  // D1
}

void SimClient::Start() {
  work_ = time_.NewTimer();
  heartbeat_ = time_.NewTimer();
  timeouts_ = time_.NewTimer();
  reconnect_ = time_.NewTimer();
  session_ttl_ = rng_->Between(absl::Seconds(2), absl::Seconds(5));
  reconnect_->ArmAt(time_.Now() + rng_->Between(absl::Milliseconds(1), absl::Milliseconds(50)),
                    [this] { Connect(); });
  work_->ArmAt(time_.Now() + absl::Milliseconds(100), [this] { Work(); });
  heartbeat_->ArmAt(time_.Now() + absl::Milliseconds(100), [this] { Heartbeat(); });
  timeouts_->ArmAt(time_.Now() + absl::Milliseconds(50), [this] { CheckTimeouts(); });
}

void SimClient::Connect() {
  conn_ = sim_->OpenConnection(node_);
  wire::Request hello;
  hello.mutable_hello()->set_min_version(1);
  hello.mutable_hello()->set_max_version(protocol::kWithdrawProtocolVersion);
  Send(Pending{.kind = Pending::Kind::kHello, .timeout = kRequestTimeout}, hello);
  if (session_ != 0) {
    // lockd lets only the connection a session is bound to drive it: resume it here first.
    wire::Request resume;
    resume.mutable_resume_session()->set_session_id(session_);
    resume.mutable_resume_session()->set_secret(secret_);
    Send(Pending{.kind = Pending::Kind::kResume, .timeout = kRequestTimeout}, resume);
  }
  if (session_ == 0 && !opening_) {
    wire::Request open;
    open.mutable_open_session()->set_ttl_ms(absl::ToInt64Milliseconds(session_ttl_));
    opening_ = true;
    Send(Pending{.kind = Pending::Kind::kOpen, .timeout = kRequestTimeout}, open);
  }
}

void SimClient::Send(Pending p, wire::Request r) {
  if (conn_ < 0) return;
  r.set_request_id(++next_request_);
  p.t_send = time_.Now();  // D2: read immediately before the request is written
  pending_[r.request_id()] = std::move(p);
  sim_->ClientSend(conn_, r);
}

void SimClient::OnDisconnected(int conn) {
  if (conn != conn_) return;
  conn_ = -1;
  // Every request in flight failed: none of them extends anything (D5).
  for (const auto& [id, p] : pending_) {
    if (p.kind == Pending::Kind::kOpen) opening_ = false;
    if (p.kind == Pending::Kind::kAcquire) acquiring_ = false;
  }
  pending_.clear();
  withdrawn_.clear();  // request ids are the connection's
  reconnect_->ArmAt(time_.Now() + rng_->Between(absl::Milliseconds(20), absl::Milliseconds(300)),
                    [this] { Connect(); });
}

void SimClient::CheckTimeouts() {
  const MonoTime now = time_.Now();
  for (const auto& [id, p] : pending_) {
    if (now - p.t_send > p.timeout) {
      // The request timed out: give up on the connection (the client library reconnects).
      sim_->CutConnection(conn_);
      break;
    }
  }
  timeouts_->ArmAt(now + absl::Milliseconds(50), [this] { CheckTimeouts(); });
}

void SimClient::Drop(const std::string& lock) {
  auto it = held_.find(lock);
  if (it == held_.end()) return;
  it->second->MarkLost(LossReason::kReleased);
  held_.erase(it);
}

void SimClient::Heartbeat() {
  absl::Duration shortest = session_ttl_;
  for (const auto& [lock, lease] : held_) shortest = std::min(shortest, lease->ttl());
  const absl::Duration period = shortest * (1 - sim_->options().safety_margin) / 3;
  if (conn_ >= 0 && session_ != 0) {
    wire::Request r;
    r.mutable_keep_alive()->set_session_id(session_);
    Pending p{.kind = Pending::Kind::kKeepAlive, .timeout = kRequestTimeout};
    for (const auto& [lock, lease] : held_) {
      auto* ref = r.mutable_keep_alive()->add_locks();
      ref->set_lock(lock);
      ref->set_token(lease->token());
      p.renewed.emplace_back(lock, lease->token());
    }
    Send(std::move(p), r);
  }
  heartbeat_->ArmAt(time_.Now() + period, [this] { Heartbeat(); });
}

void SimClient::Work() {
  const MonoTime now = time_.Now();
  // The critical section: checkStillHeld before each step.
  std::vector<std::string> lost;
  for (const auto& [lock, lease] : held_) {
    if (lease->Check(now) != LossReason::kNone) {
      lost.push_back(lock);
      continue;
    }
    sim_->CheckHeld(node_, lock, lease->token());
  }
  for (const std::string& lock : lost) Drop(lock);
  if (conn_ >= 0 && session_ != 0) {
    if (!held_.empty() && rng_->Chance(0.15)) {
      const auto& [lock, lease] = *held_.begin();
      wire::Request r;
      r.mutable_release()->set_session_id(session_);
      r.mutable_release()->set_lock(lock);
      r.mutable_release()->set_token(lease->token());
      Send(Pending{.kind = Pending::Kind::kRelease, .timeout = kRequestTimeout, .lock = lock,
                   .token = lease->token()},
           r);
      Drop(lock);  // the caller gave it up at once
    } else if (acquiring_ && pending_.contains(acquire_id_) &&
               !pending_.at(acquire_id_).withdrawn && rng_->Chance(0.05)) {
      // The caller gives up waiting: withdraw the Acquire from the lock's queue. A grant that
      // crosses it is given back.
      pending_.at(acquire_id_).withdrawn = true;
      acquiring_ = false;
      wire::Request r;
      r.mutable_withdraw_acquire()->set_session_id(session_);
      r.mutable_withdraw_acquire()->set_acquire_request_id(acquire_id_);
      Send(Pending{.kind = Pending::Kind::kWithdraw, .timeout = kRequestTimeout,
                   .acquire_id = acquire_id_},
           r);
    } else if (held_.empty() && !acquiring_ && rng_->Chance(0.5)) {
      const std::string lock = absl::StrCat("lock-", rng_->Below(sim_->options().locks));
      const absl::Duration ttl = rng_->Between(absl::Seconds(1), absl::Seconds(4));
      const absl::Duration wait =
          rng_->Chance(0.5) ? absl::ZeroDuration() : rng_->Between(absl::Milliseconds(100), absl::Seconds(3));
      wire::Request r;
      r.mutable_acquire()->set_session_id(session_);
      r.mutable_acquire()->set_lock(lock);
      r.mutable_acquire()->set_ttl_ms(absl::ToInt64Milliseconds(ttl));
      r.mutable_acquire()->set_wait_timeout_ms(absl::ToInt64Milliseconds(wait));
      acquiring_ = true;
      Send(Pending{.kind = Pending::Kind::kAcquire, .timeout = wait + kRequestTimeout, .lock = lock,
                   .ttl = ttl},
           r);
      acquire_id_ = next_request_;
    } else if (held_.empty() && !acquiring_ && rng_->Chance(0.01)) {
      wire::Request r;
      r.mutable_close_session()->set_session_id(session_);
      Send(Pending{.kind = Pending::Kind::kClose, .timeout = kRequestTimeout}, r);
      session_ = 0;
    }
  }
  if (session_ == 0 && conn_ >= 0 && !opening_) {
    wire::Request open;
    open.mutable_open_session()->set_ttl_ms(absl::ToInt64Milliseconds(session_ttl_));
    opening_ = true;
    Send(Pending{.kind = Pending::Kind::kOpen, .timeout = kRequestTimeout}, open);
  }
  work_->ArmAt(now + rng_->Between(absl::Milliseconds(10), absl::Milliseconds(150)), [this] { Work(); });
}

void SimClient::OnResponse(int conn, const wire::Response& r) {
  auto it = pending_.find(r.request_id());
  if (it == pending_.end()) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  const MonoTime now = time_.Now();
  if (r.code() == wire::PERMISSION_DENIED) {
    // Every client drives only its own session, resumed with its own secret first.
    sim_->Fail(absl::StrCat("lockd refused client ", node_, "'s own session ", session_, ": ",
                            r.message()));
  }
  if (r.code() == wire::SESSION_NOT_FOUND && session_ != 0 && p.kind != Pending::Kind::kOpen) {
    // lockd no longer has the session: every lock it held is gone.
    DropAll();
    session_ = 0;
    session_deadline_ = MonoTime::Min();
  }
  switch (p.kind) {
    case Pending::Kind::kHello:
    case Pending::Kind::kResume:
    case Pending::Kind::kClose:
      break;
    case Pending::Kind::kWithdraw:
      if (r.code() == wire::OK && r.withdraw_acquire().withdrawn()) {
        withdrawn_.insert(p.acquire_id);
        sim_->CountWithdrawal();
      }
      break;
    case Pending::Kind::kOpen:
      opening_ = false;
      if (r.code() == wire::OK) {
        session_ = r.open_session().session_id();
        secret_ = r.open_session().secret();
        session_deadline_ = Deadline(p.t_send, session_ttl_);
      }
      break;
    case Pending::Kind::kAcquire: {
      if (!p.withdrawn) acquiring_ = false;
      if (withdrawn_.erase(r.request_id()) > 0 && r.code() != wire::CANCELLED) {
        sim_->Fail(absl::StrCat("lockd answered Acquire ", r.request_id(), " of client ", node_,
                                " with ", wire::Code_Name(r.code()),
                                " after it said it had withdrawn it"));
      }
      if (r.code() != wire::OK || !r.acquire().granted()) break;
      const FenceToken token = r.acquire().token();
      sim_->CountGrant(token);
      if (session_ == 0) break;
      if (p.withdrawn) {
        // The grant crossed the withdrawal: nobody waits for it, so give it back.
        wire::Request back;
        back.mutable_release()->set_session_id(session_);
        back.mutable_release()->set_lock(p.lock);
        back.mutable_release()->set_token(token);
        back.mutable_release()->set_relinquish(true);
        Send(Pending{.kind = Pending::Kind::kRelease, .timeout = kRequestTimeout, .lock = p.lock,
                     .token = token},
             back);
        break;
      }
      // The lease runs from the acquire's send, never from the reply (D1), and ends no later
      // than the session's own estimate would.
      auto lease = std::make_shared<LeaseState>(
          p.lock, token, p.ttl, std::min(Deadline(p.t_send, p.ttl), session_deadline_));
      if (lease->Check(now) != LossReason::kNone) break;  // granted too late to use
      held_[p.lock] = std::move(lease);
      break;
    }
    case Pending::Kind::kKeepAlive: {
      if (r.code() != wire::OK) break;  // a failure never extends a deadline (D5)
      session_deadline_ = std::max(session_deadline_, Deadline(p.t_send, session_ttl_));
      const auto& codes = r.keep_alive().lock_codes();
      for (size_t i = 0; i < p.renewed.size() && i < static_cast<size_t>(codes.size()); ++i) {
        const auto& [lock, token] = p.renewed[i];
        if (codes[i] == wire::OK && sim_->WasStale(conn, r.request_id(), lock)) {
          sim_->Fail(absl::StrCat("lockd renewed ", lock, " for token ", token,
                                  ", which was stale when the renewal arrived"));
        }
        if (codes[i] == wire::FENCED_OUT) sim_->CountFencedOut();
        auto h = held_.find(lock);
        if (h == held_.end() || h->second->token() != token) continue;
        if (codes[i] == wire::OK) {
          // D5: a later success never moves the deadline earlier; Extend refuses a lease that
          // already ran out.
          if (!h->second->Extend(Deadline(p.t_send, std::min(h->second->ttl(), session_ttl_)), now)) {
            held_.erase(h);
          }
        } else {
          h->second->MarkLost(LossReason::kFencedOut);
          held_.erase(h);
        }
      }
      break;
    }
    case Pending::Kind::kRelease:
      if (r.code() == wire::OK && sim_->WasStale(conn, r.request_id(), p.lock)) {
        sim_->Fail(absl::StrCat("lockd accepted a release of ", p.lock, " with token ", p.token,
                                ", which was stale when it arrived"));
      }
      if (r.code() == wire::FENCED_OUT) sim_->CountFencedOut();
      break;
  }
}

}  // namespace

std::string CheckOptions(const SimOptions& o) {
  if (o.duration <= absl::ZeroDuration() || o.duration > absl::Hours(24)) {
    return "--duration must be positive and at most 24h";
  }
  if (o.clients < 1 || o.clients > 1000) return "--clients must be 1 to 1000";
  if (o.locks < 1 || o.locks > 1000) return "--locks must be 1 to 1000";
  if (!(o.safety_margin > 0 && o.safety_margin < 1)) return "--margin must be in (0, 1)";
  if (!(o.clock_rate_bound >= 0 && o.clock_rate_bound < 0.5)) {
    return "--clock-rate-bound must be in [0, 0.5)";
  }
  if (!(o.lockd_fast_clock >= 0 && o.lockd_fast_clock <= 10)) {
    return "--lockd-fast-clock must be in [0, 10]";
  }
  return "";
}

SimResult Simulate(const SimOptions& options) {
  Simulation sim(options);
  return sim.Run();
}

std::string ReplayCommand(const SimOptions& o) {
  std::string cmd = absl::StrCat("fencelock-sim --seeds=1 --from=", o.seed, " --duration=",
                                 absl::FormatDuration(o.duration), " --clients=", o.clients,
                                 " --locks=", o.locks, " --margin=", o.safety_margin,
                                 " --clock-rate-bound=", o.clock_rate_bound);
  if (o.lockd_fast_clock > 0) absl::StrAppend(&cmd, " --lockd-fast-clock=", o.lockd_fast_clock);
  if (!o.network_faults) absl::StrAppend(&cmd, " --network-faults=false");
  if (!o.disk_faults) absl::StrAppend(&cmd, " --disk-faults=false");
  if (!o.crashes) absl::StrAppend(&cmd, " --crashes=false");
  if (!o.pauses) absl::StrAppend(&cmd, " --pauses=false");
  return cmd + " --verbose";
}

}  // namespace fencelock::sim
