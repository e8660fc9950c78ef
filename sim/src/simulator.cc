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
#include "lock-client/core/client_core.h"
#include "lock-client/core/lease.h"
#include "lock-server/commit_log.h"
#include "lock-server/local_commit_log.h"
#include "lock-server/server_core.h"
#include "lock-server/storage.h"
#include "protocol/frame.h"
#include "protocol/requests.h"
#include "protocol/session.h"
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

// A client: the client library's own core (lock-client/core) on the node's clock, over the
// simulated network, with a worker that acquires, checks, steps, releases, gives up waiting
// and closes its session at random. The transport here (dial, Hello, frames) is the
// simulator's; every lease rule is the core's.
class SimClient {
 public:
  SimClient(Simulation* sim, int node, World* world, Rng* rng)
      : sim_(sim), node_(node), world_(world), rng_(rng), time_(world, node) {}
  void Start();
  void OnResponse(int conn, const wire::Response& r);
  void OnDisconnected(int conn);
  int node() const { return node_; }

 private:
  struct Held {
    std::shared_ptr<LeaseState> lease;
    SessionId session = 0;
  };
  // Carries out what the core asked for, and arms its timer.
  void Apply();
  void Dial(const client_core::Dial& dial);
  void DialFailed(const absl::Status& status, const std::string& leader);
  // Checks lockd's reply to a request of this client against what was true when it arrived.
  void Observe(int conn, const wire::Response& r);
  void Work();
  // An irreversible step under `held`, taken after a check that may be long past: lockd's
  // fence (Validate) must refuse a stale token.
  void Step(const std::string& lock, Held held);
  void GiveUp(const std::string& lock, uint64_t token, SessionId session, const char* why) {
    if (session != 0) given_up_[{lock, token}] = GivenUp{session, why};
  }

  Simulation* sim_;
  int node_;
  World* world_;
  Rng* rng_;
  NodeTime time_;
  std::unique_ptr<client_core::ClientCore> core_;
  uint64_t next_request_ = 0;
  // The dial under way: its connection, the replica, and its Hello's request id.
  int dialing_ = -1;
  size_t dial_replica_ = 0;
  uint64_t hello_id_ = 0;
  std::unique_ptr<Timer> work_, wake_, dial_timeout_;
  std::map<std::string, Held> held_;
  // The acquire in flight (0: none), its lock, and the request id of its Acquire once sent.
  uint64_t acquire_op_ = 0;
  std::string acquiring_;
  uint64_t acquire_rid_ = 0;
  SessionId acquire_session_ = 0;
  bool acquire_cancelled_ = false;
  std::set<uint64_t> completed_;  // operations the core completed
  // Requests sent and not answered, by request id: the connection and the request.
  std::map<uint64_t, std::pair<int, wire::Request>> sent_;
  // Acquires lockd said it withdrew: none of them may be granted.
  std::set<uint64_t> withdrawn_;
  // Acquires this client withdrew (the caller gave up waiting), by request id.
  std::set<uint64_t> withdrawn_acquires_;
  // Sessions lockd said it no longer has: no lease of theirs may pass a check after that.
  std::set<SessionId> gone_sessions_;
  // Locks this client gave up (released, lost at their deadline, a grant nobody waited for),
  // not yet answered by lockd: (lock, token) to its session and why.
  struct GivenUp {
    SessionId session;
    const char* why;
  };
  std::map<std::pair<std::string, uint64_t>, GivenUp> given_up_;
  // A session resumed on connection `conn`: what it owed lockd then, and the last request id
  // sent with the resume's handling. A reply to a later request shows lockd read them all.
  struct Resumed {
    uint64_t last_request = 0;
    std::vector<std::pair<std::string, uint64_t>> owed;
    SessionId session = 0;
  };
  std::map<int, Resumed> resumed_;
  // Locks lockd holds for this client's session with a token the client holds no handle for:
  // since when (true time).
  std::map<std::pair<std::string, uint64_t>, int64_t> orphans_;
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
  void CheckHeld(int client, const std::string& lock, FenceToken token, SessionId session);
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
  // Since when (true time) lockd has run without a restart or a pause: leases it restored
  // or postponed run their full TTL from then.
  int64_t lockd_undisturbed_since() {
    return std::max(lockd_started_at_, world_.node(kLockd).paused_until);
  }
  // Whether lockd ended `session` on its own (the fault EndASession): until its client hears
  // so, its leases may overlap another's.
  bool ended_by_fault(SessionId session) const { return ended_sessions_.contains(session); }
  // Who holds `lock` on lockd now; nullptr when it is free or lockd is down.
  const server::HolderState* Holder(const std::string& lock) const {
    return core_ ? core_->service().state().FindHolder(lock) : nullptr;
  }

  class Sink;

 private:
  void StartLockd();
  void Crash();
  void ScheduleFaults();
  // lockd loses a client's session while the client still holds its leases, as a replica that
  // lost it would: the client's connection is cut, and the session is ended at once (by a
  // stranger with its secret) before the client can resume it.
  void EndASession();
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
  // Each session's opening connection and secret, as lockd's reply carried them.
  std::map<SessionId, std::pair<int, std::string>> secrets_by_session_;
  std::set<SessionId> ended_sessions_;
  std::set<std::tuple<uint64_t, uint64_t, std::string>> stale_;  // conn, request, lock
  std::vector<std::pair<std::string, SessionId>> grants_this_event_;
  bool lockd_up_ = false;
  int64_t lockd_started_at_ = 0;
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
      if (conns_[id]->client != env_node_) clients_[conns_[id]->client - 1]->OnDisconnected(id);
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
  } else if (request.has_validate()) {
    note(request.validate().lock(), request.validate().token());
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
      if (c.client == sim->env_node_) continue;  // a stranger's: nobody reads it
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
            [this, conn, client] {
              if (client != env_node_) clients_[client - 1]->OnDisconnected(conn);
            });
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
  lockd_started_at_ = world_.now();
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
    if (r.has_open_session()) {
      committed(session_lsn_, r.open_session().session_id(), "session");
      secrets_by_session_[r.open_session().session_id()] = {conn, r.open_session().secret()};
    }
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

void Simulation::CheckHeld(int client, const std::string& lock, FenceToken token,
                           SessionId session) {
  ++result_.checks_passed;
  if (!core_) return;
  const auto* holder = core_->service().state().FindHolder(lock);
  if (holder == nullptr || holder->token == token) return;
  ++result_.overlaps;
  if (bounds_hold() && !ended_by_fault(session)) {
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
  if (options_.network_faults && rng_.Chance(0.2)) {
    world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this] { EndASession(); });
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

void Simulation::EndASession() {
  if (!core_) return;
  // A session with a lock held.
  std::vector<SessionId> candidates;
  for (int l = 0; l < options_.locks; ++l) {
    const auto* h = Holder(absl::StrCat("lock-", l));
    if (h != nullptr && secrets_by_session_.contains(h->session)) candidates.push_back(h->session);
  }
  if (candidates.empty()) return;
  const SessionId session = candidates[rng_.Below(candidates.size())];
  ended_sessions_.insert(session);
  world_.Mix(session | (uint64_t{0xE} << 56));
  const int client = conns_[secrets_by_session_.at(session).first]->client;
  for (size_t i = 0; i < conns_.size(); ++i) {
    if (conns_[i]->open && conns_[i]->client == client) CutConnection(static_cast<int>(i));
  }
  // The stranger's requests reach lockd at once, before the client can reconnect.
  const int stranger = static_cast<int>(conns_.size());
  auto c = std::make_unique<Connection>();
  c->client = env_node_;
  conns_.push_back(std::move(c));
  sinks_.push_back(std::make_unique<Sink>(this, stranger));
  std::vector<std::string> payloads;
  wire::Request r = protocol::HelloRequest("stranger");
  r.set_request_id(1);
  payloads.push_back(r.SerializeAsString());
  r = protocol::request::Resume(session, secrets_by_session_.at(session).second);
  r.set_request_id(2);
  payloads.push_back(r.SerializeAsString());
  r = protocol::request::Close(session);
  r.set_request_id(3);
  payloads.push_back(r.SerializeAsString());
  world_.At(world_.now(), kLockd, [this, stranger, payloads = std::move(payloads)] {
    if (!core_ || !conns_[stranger]->open) return;
    conns_[stranger]->server_id = core_->Connect(sinks_[stranger].get());
    core_->Receive(conns_[stranger]->server_id, std::span<const std::string>(payloads));
  });
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

void SimClient::Start() {
  client_core::CoreOptions options;
  options.replicas = {"lockd:7420"};
  options.session_ttl = rng_->Between(absl::Seconds(2), absl::Seconds(5));
  options.safety_margin = sim_->options().safety_margin;
  options.request_timeout = kRequestTimeout;
  options.connect_timeout = kRequestTimeout;
  options.next_request_id = [this] { return ++next_request_; };
  core_ = std::make_unique<client_core::ClientCore>(std::move(options));
  work_ = time_.NewTimer();
  wake_ = time_.NewTimer();
  dial_timeout_ = time_.NewTimer();
  work_->ArmAt(time_.Now() + rng_->Between(absl::Milliseconds(1), absl::Milliseconds(50)),
               [this] {
                 core_->Start(time_.Now());
                 Apply();
                 Work();
               });
}

void SimClient::Apply() {
  for (;;) {
    client_core::Actions a = core_->TakeActions();
    if (a.empty()) break;
    for (const auto& line : a.logs) world_->Mix(line.message);
    for (uint64_t conn : a.close) sim_->CutConnection(static_cast<int>(conn) - 1);
    for (auto& out : a.sends) {
      const int conn = static_cast<int>(out.conn) - 1;
      const wire::Request& r = out.request;
      if (r.has_acquire() && acquire_op_ != 0 && r.acquire().lock() == acquiring_) {
        acquire_rid_ = r.request_id();
        acquire_session_ = r.acquire().session_id();
      }
      sent_[r.request_id()] = {conn, r};
      sim_->ClientSend(conn, r);
    }
    for (const auto& lease : a.lost) {
      auto it = held_.find(lease->lock());
      if (it == held_.end() || it->second.lease != lease) continue;
      if (lease->Check(MonoTime::Min()) == LossReason::kDeadlinePassed) {
        GiveUp(lease->lock(), lease->token(), it->second.session, "its deadline passed");
      }
      held_.erase(it);
    }
    for (const auto& c : a.completions) {
      if (!completed_.insert(c.op).second) {
        sim_->Fail(absl::StrCat("client ", node_, ": operation ", c.op, " completed twice"));
      }
      if (c.op != acquire_op_) continue;
      if (c.lease != nullptr) {
        if (acquire_cancelled_) {
          sim_->Fail(absl::StrCat("client ", node_, ": the withdrawn acquire of ", acquiring_,
                                  " was handed over as granted (token ", c.lease->token(), ")"));
        }
        held_[c.lease->lock()] = Held{c.lease, acquire_session_};
        orphans_.erase({c.lease->lock(), c.lease->token()});
      }
      acquire_op_ = 0;
      acquire_rid_ = 0;
    }
    if (a.dial) Dial(*a.dial);
  }
  const MonoTime next = core_->NextWakeup();
  if (next == MonoTime::Max()) {
    wake_->Cancel();
  } else if (wake_->armed_for() != next) {
    wake_->ArmAt(next, [this] {
      core_->OnTick(time_.Now());
      Apply();
    });
  }
}

void SimClient::Dial(const client_core::Dial& dial) {
  dialing_ = sim_->OpenConnection(node_);
  dial_replica_ = dial.replica;
  wire::Request hello = protocol::HelloRequest("sim-client");
  hello.set_request_id(hello_id_ = ++next_request_);
  sim_->ClientSend(dialing_, hello);
  dial_timeout_->ArmAt(time_.Now() + dial.timeout, [this] {
    if (dialing_ < 0) return;
    sim_->CutConnection(dialing_);
    DialFailed(absl::DeadlineExceededError("no Hello answer in time"), "");
  });
}

void SimClient::DialFailed(const absl::Status& status, const std::string& leader) {
  dialing_ = -1;
  dial_timeout_->Cancel();
  core_->OnDialFailed(time_.Now(), dial_replica_, status, leader);
  Apply();
}

void SimClient::OnDisconnected(int conn) {
  if (conn == dialing_) return DialFailed(absl::UnavailableError("connection refused"), "");
  // Every request in flight on it is unanswered for good.
  for (auto it = sent_.begin(); it != sent_.end();) {
    it = it->second.first == conn ? sent_.erase(it) : std::next(it);
  }
  resumed_.erase(conn);
  core_->OnDisconnected(time_.Now(), static_cast<uint64_t>(conn) + 1);
  Apply();
}

void SimClient::OnResponse(int conn, const wire::Response& r) {
  if (conn == dialing_ && r.request_id() == hello_id_) {
    const int d = dialing_;
    dialing_ = -1;
    dial_timeout_->Cancel();
    std::string leader;
    auto version = protocol::ReadHelloReply(r, "lockd:7420", &leader);
    if (!version.ok()) {
      sim_->CutConnection(d);
      core_->OnDialFailed(time_.Now(), dial_replica_, version.status(), leader);
    } else {
      core_->OnDialed(time_.Now(), dial_replica_, static_cast<uint64_t>(d) + 1, *version);
    }
    Apply();
    return;
  }
  Observe(conn, r);
  const bool resume_ok = [&] {
    auto it = sent_.find(r.request_id());
    return it != sent_.end() && it->second.second.has_resume_session() && r.code() == wire::OK;
  }();
  sent_.erase(r.request_id());
  std::vector<std::pair<std::string, uint64_t>> owed;
  if (resume_ok) {
    for (const auto& [key, session] : given_up_) owed.push_back(key);
  }
  core_->OnResponse(time_.Now(), static_cast<uint64_t>(conn) + 1, r);
  Apply();
  if (resume_ok) resumed_[conn] = Resumed{next_request_, std::move(owed), core_->session_id()};
}

void SimClient::Observe(int conn, const wire::Response& r) {
  auto it = sent_.find(r.request_id());
  if (it == sent_.end()) return;
  const wire::Request& q = it->second.second;
  if (r.code() == wire::PERMISSION_DENIED) {
    // Every client drives only its own session, resumed with its own secret first.
    sim_->Fail(absl::StrCat("lockd refused client ", node_, "'s own request: ", r.message()));
  }
  if (r.code() == wire::SESSION_NOT_FOUND) {
    SessionId s = 0;
    if (q.has_keep_alive()) s = q.keep_alive().session_id();
    if (q.has_resume_session()) s = q.resume_session().session_id();
    if (q.has_acquire()) s = q.acquire().session_id();
    if (q.has_release()) s = q.release().session_id();
    if (s != 0) gone_sessions_.insert(s);
  }
  // lockd read every request sent with a resume's handling: what the client owed it then
  // (relinquishes unanswered when the old connection broke) has been given back.
  if (auto res = resumed_.find(conn);
      res != resumed_.end() && r.request_id() > res->second.last_request) {
    for (const auto& [lock, token] : res->second.owed) {
      const auto* h = sim_->Holder(lock);
      auto g = given_up_.find({lock, token});
      if (h != nullptr && h->token == token && h->session == res->second.session &&
          g != given_up_.end()) {
        sim_->Fail(absl::StrCat("client ", node_, " gave up ", lock, " (token ", token, ": ",
                                g->second.why,
                                ") and resumed its session on a new connection, and lockd still "
                                "holds it for the session: it was not given back again"));
      }
    }
    resumed_.erase(res);
  }
  if (q.has_withdraw_acquire() && r.code() == wire::OK && r.withdraw_acquire().withdrawn()) {
    withdrawn_.insert(q.withdraw_acquire().acquire_request_id());
    sim_->CountWithdrawal();
  }
  if (q.has_acquire()) {
    if (withdrawn_.erase(r.request_id()) > 0 && r.code() != wire::CANCELLED) {
      sim_->Fail(absl::StrCat("lockd answered Acquire ", r.request_id(), " of client ", node_,
                              " with ", wire::Code_Name(r.code()),
                              " after it said it had withdrawn it"));
    }
    if (r.code() == wire::OK && r.acquire().granted()) {
      sim_->CountGrant(r.acquire().token());
      // A grant nobody waits for any more (withdrawn, or its wait ran out) is given back.
      if (r.request_id() != acquire_rid_ || acquire_op_ == 0 || acquire_cancelled_) {
        GiveUp(q.acquire().lock(), r.acquire().token(), q.acquire().session_id(),
               withdrawn_acquires_.contains(r.request_id())
                   ? "a grant that crossed its withdrawal"
                   : "a grant nobody waited for any more");
      }
    }
  }
  if (q.has_keep_alive() && r.code() == wire::OK) {
    const auto& codes = r.keep_alive().lock_codes();
    for (int i = 0; i < q.keep_alive().locks_size() && i < codes.size(); ++i) {
      const auto& l = q.keep_alive().locks(i);
      if (codes[i] == wire::OK && sim_->WasStale(conn, r.request_id(), l.lock())) {
        sim_->Fail(absl::StrCat("lockd renewed ", l.lock(), " for token ", l.token(),
                                ", which was stale when the renewal arrived"));
      }
      if (codes[i] == wire::FENCED_OUT) sim_->CountFencedOut();
    }
  }
  if (q.has_release()) {
    if (r.code() == wire::OK && sim_->WasStale(conn, r.request_id(), q.release().lock())) {
      sim_->Fail(absl::StrCat("lockd accepted a release of ", q.release().lock(), " with token ",
                              q.release().token(), ", which was stale when it arrived"));
    }
    if (r.code() == wire::FENCED_OUT) sim_->CountFencedOut();
    given_up_.erase({q.release().lock(), q.release().token()});  // answered: settled
  }
  if (q.has_validate()) {
    if (r.code() == wire::OK && sim_->WasStale(conn, r.request_id(), q.validate().lock())) {
      sim_->Fail(absl::StrCat("lockd confirmed ", q.validate().lock(), " for token ",
                              q.validate().token(), ", which was stale when the step arrived"));
    }
    if (r.code() == wire::FENCED_OUT) sim_->CountFencedOut();
  }
}

void SimClient::Step(const std::string& lock, Held held) {
  // The caller checked long ago and acts now: the resource asks lockd whether the token still
  // holds the lock (fence 1 for a resource that stores no tokens), on the client's connection
  // beside the core's requests, whatever the client believes.
  const uint64_t conn = core_->conn();
  if (conn == 0) return;
  wire::Request validate = protocol::request::Validate(lock, held.lease->token());
  validate.set_request_id(++next_request_);
  sent_[validate.request_id()] = {static_cast<int>(conn) - 1, validate};
  sim_->ClientSend(static_cast<int>(conn) - 1, validate);
}

void SimClient::Work() {
  const MonoTime now = time_.Now();
  // The critical section: checkStillHeld before each step.
  std::vector<std::string> lost;
  for (const auto& [lock, held] : held_) {
    if (held.lease->Check(now) != LossReason::kNone) {
      lost.push_back(lock);
      continue;
    }
    if (gone_sessions_.contains(held.session)) {
      sim_->Fail(absl::StrCat("client ", node_, " passed checkStillHeld for ", lock, " (token ",
                              held.lease->token(), ") after lockd told it that session ",
                              held.session, " is gone"));
    }
    sim_->CheckHeld(node_, lock, held.lease->token(), held.session);
    // Now and then the check asks lockd too (checkStillHeld with Confirm::kWithServer).
    if (rng_->Chance(0.05)) core_->Validate(now, held.lease);
    if (rng_->Chance(0.1)) {
      // The caller checked, then stalls before its step (a GC pause, a slow hop).
      const absl::Duration stall = rng_->Chance(0.5) ? absl::ZeroDuration()
                                                     : rng_->Between(absl::Milliseconds(1), absl::Seconds(3));
      Held h = held;
      std::string name = lock;
      world_->At(world_->now() + Ns(stall), node_, [this, name, h] { Step(name, h); });
    }
  }
  for (const std::string& lock : lost) held_.erase(lock);
  // Locks lockd keeps for this client's session that it neither holds a handle for nor is
  // acquiring (a grant handed to nobody, or one it gave up): lockd's own expiry ends one
  // within its TTL (4 s at most) unless the client keeps renewing it.
  const SessionId session = core_->session_id();
  if (session != 0) {
    for (int l = 0; l < sim_->options().locks; ++l) {
      const std::string lock = absl::StrCat("lock-", l);
      const auto* h = sim_->Holder(lock);
      if (h == nullptr || h->session != session) continue;
      auto mine = held_.find(lock);
      if ((mine != held_.end() && mine->second.lease->token() == h->token) ||
          (acquire_op_ != 0 && acquiring_ == lock)) {
        orphans_.erase({lock, h->token});
        continue;
      }
      // A grant whose answer was lost with its connection is unknown to the client; lockd
      // ends it within its TTL (at most 4 s) of when it last restarted or stalled.
      auto [it, fresh] = orphans_.try_emplace({lock, h->token}, world_->now());
      const int64_t since = std::max(it->second, sim_->lockd_undisturbed_since());
      if (!fresh && world_->now() - since > Ns(absl::Seconds(5))) {
        auto g = given_up_.find({lock, h->token});
        sim_->Fail(absl::StrCat("lockd has kept ", lock, " (token ", h->token, ") for client ",
                                node_, "'s session ", session,
                                " for 5 s, and the client holds no handle for it",
                                g == given_up_.end() ? "" : " (it gave it up: ",
                                g == given_up_.end() ? "" : g->second.why,
                                g == given_up_.end() ? "" : ")"));
        orphans_.erase(it);
      }
    }
  }
  if (acquire_op_ != 0 && !acquire_cancelled_ && rng_->Chance(0.05)) {
    // The caller gives up waiting: the core withdraws the Acquire from the lock's queue.
    acquire_cancelled_ = core_->Cancel(now, acquire_op_);
    if (acquire_cancelled_ && acquire_rid_ != 0) withdrawn_acquires_.insert(acquire_rid_);
  } else if (!held_.empty() && rng_->Chance(0.15)) {
    auto it = std::next(held_.begin(), static_cast<long>(rng_->Below(held_.size())));
    const Held held = it->second;
    const std::string lock = it->first;
    held_.erase(it);
    // Released; awaited, or sent with the next request (releaseWithNextRequest).
    const bool await = rng_->Chance(0.5);
    GiveUp(lock, held.lease->token(), held.session,
           await ? "released" : "released with the next request");
    core_->Release(now, held.lease, await);
  } else if (held_.empty() && acquire_op_ == 0 && rng_->Chance(0.5)) {
    acquiring_ = absl::StrCat("lock-", rng_->Below(sim_->options().locks));
    const absl::Duration ttl = rng_->Between(absl::Seconds(1), absl::Seconds(4));
    const absl::Duration wait =
        rng_->Chance(0.5) ? absl::ZeroDuration() : rng_->Between(absl::Milliseconds(100), absl::Seconds(3));
    acquire_cancelled_ = false;
    acquire_rid_ = 0;
    acquire_op_ = core_->Acquire(now, acquiring_, wait, ttl);
  } else if (held_.empty() && acquire_op_ == 0 && rng_->Chance(0.01)) {
    core_->Close(now);
  }
  Apply();
  work_->ArmAt(now + rng_->Between(absl::Milliseconds(10), absl::Milliseconds(150)), [this] { Work(); });
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
