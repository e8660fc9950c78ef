#include "sim/simulator.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
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
#include "lock-server/etcd_commit_log.h"
#include "lock-server/local_commit_log.h"
#include "lock-server/server_core.h"
#include "lock-server/storage.h"
#include "protocol/frame.h"
#include "protocol/requests.h"
#include "protocol/session.h"
#include "protocol/version.h"
#include "etcd_net.h"
#include "sim/sim_etcd.h"
#include "sim_disk.h"
#include "world.h"

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
// Nodes: the lockd replicas first (one on its local log, or 2 or 3 on the simulated etcd), then
// the clients; the last node is the environment (faults, and etcd's own events), which never
// pauses or restarts.
constexpr absl::Duration kRequestTimeout = absl::Milliseconds(800);
// The replicas' prefix on the simulated etcd, the TTL of their ownership, and how long one etcd
// request may take (lockd's default: a third of the usable ownership).
constexpr char kPrefix[] = "/fencelock/sim";
constexpr absl::Duration kOwnerTtl = absl::Seconds(2);
constexpr uint64_t kReservationBlock = 7;
const absl::Duration kEtcdRequestTimeout = kOwnerTtl * (1 - server::kEtcdOwnerMargin) / 3;

class Simulation;

// Records every record lockd appends and learns which are committed, for the checks.
class RecordingLog final : public CommitLog, public CommitLogListener {
 public:
  RecordingLog(std::unique_ptr<CommitLog> inner, Simulation* sim, int replica)
      : inner_(std::move(inner)), sim_(sim), replica_(replica) {}
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
  const int replica_;
  CommitLogListener* listener_ = nullptr;
  std::map<uint64_t, uint64_t> batch_last_lsn_;
  uint64_t reported_ = 0;  // the highest batch OnCommitted() was told of
};

struct Connection {
  int client = 0;
  int replica = 0;  // the lockd replica it goes to
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
  // The token, session and mode this client holds `lock` with, if its checkStillHeld would
  // pass now.
  struct Belief {
    FenceToken token;
    SessionId session;
    LockMode mode;
  };
  std::optional<Belief> Believes(const std::string& lock) const {
    auto it = held_.find(lock);
    if (it == held_.end() || it->second.lease->Check(time_.Now()) != LossReason::kNone) {
      return std::nullopt;
    }
    return Belief{it->second.lease->token(), it->second.session, it->second.lease->mode()};
  }

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
        world_(options.replicas + options.clients + 1),
        replica_count_(options.replicas),
        env_node_(options.replicas + options.clients) {
    result_.seed = options.seed;
  }
  SimResult Run();

  // Called by the parts.
  World* world() { return &world_; }
  Rng* rng() { return &rng_; }
  const SimOptions& options() const { return options_; }
  int OpenConnection(int client_node, int replica);
  void ClientSend(int conn, const wire::Request& r);
  void CutConnection(int conn);
  void OnAppended(int replica, uint64_t lsn, const Record& r);
  // Every record the serving replica applied (renewals too), just after it was applied.
  void OnApplied(int replica, const Record& r);
  void OnCommittedLsn(int replica, uint64_t lsn) {
    committed_lsn_ = std::max(committed_lsn_, lsn);
    if (replica == current_) current_committed_lsn_ = std::max(current_committed_lsn_, lsn);
  }
  void OnDiskFault() {
    ++result_.disk_faults;
    // An operator restarts lockd once the disk is fixed.
    world_.At(world_.now() + Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(1))),
              env_node_, [this] { Crash(0); });
  }
  // With FENCELOCK_SIM_TRACE set, what the replicas and etcd do goes to stderr (for a failing
  // seed's story); it changes nothing in the run.
  void Trace(const std::string& line) {
    if (trace_) std::fprintf(stderr, "t=%.6fs %s\n", world_.now() / 1e9, line.c_str());
  }
  void Fail(const std::string& what) {
    // The same violation seen twice (as the core reports an act and as its reply leaves) once.
    if (!failed_.insert(what).second) return;
    if (result_.failures.size() < 20) {
      result_.failures.push_back(absl::StrFormat("t=%.6fs: %s", world_.now() / 1e9, what));
    }
    result_.ok = false;
  }
  // checkStillHeld said "held" for `token` on `lock`, held in `mode`.
  void CheckHeld(int client, const std::string& lock, FenceToken token, SessionId session,
                 LockMode mode);
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
    if (current_ < 0) return world_.now();
    const Replica& r = replicas_[current_];
    return std::max(r.started_at, world_.node(r.node).paused_until);
  }
  // Whether lockd ended `session` on its own (the fault EndASession): until its client hears
  // so, its leases may overlap another's.
  bool ended_by_fault(SessionId session) const { return ended_sessions_.contains(session); }
  // `session`'s hold of `lock` on lockd now; nullptr when it holds none or lockd is down.
  const server::HolderState* HolderOf(const std::string& lock, SessionId session) const {
    const ServerCore* core = ServingCore();
    const server::LockState* held = core ? core->service().state().FindLock(lock) : nullptr;
    return held ? held->FindSession(session) : nullptr;
  }
  // The address clients dial for replica `i`.
  std::string ReplicaAddress(int i) const { return absl::StrCat("lockd-", i, ":7420"); }
  int replica_count() const { return replica_count_; }
  bool on_etcd() const { return replica_count_ > 1; }
  // How likely a client is to release a lock it holds at each step of its work.
  double release_chance() const { return long_holders_ ? 0.002 : 0.15; }

  class Sink;

 private:
  // A lockd replica: node i, one process at a time (a new incarnation after each crash or exit).
  struct Replica {
    int node = 0;
    std::unique_ptr<NodeTime> time;
    std::unique_ptr<ServerCore> core;  // serving, or (on etcd) a standby's while it waits
    uint64_t core_gen = 0;             // counts the cores it had, so that none is mistaken
    std::unique_ptr<LoopTime> standby_loop;  // the standby core's own loop, gone with it
    server::StandingBy* standing_by = nullptr;  // the standby core's leadership, while it lives
    bool up = false;                   // accepting connections
    bool serving = false;              // `core` serves the state
    int64_t started_at = 0;            // true time it began to serve
    // On etcd:
    uint64_t incarnation = 0;
    std::string owner;                 // what it writes into P/owner
    std::shared_ptr<bool> dead;        // set at a crash: nothing more reaches etcd
    std::unique_ptr<server::EtcdLogOpening> opening;
    MonoTime owned_until = MonoTime::Min();  // the ownership deadline the log last reported
  };

  // The core of the replica serving now, or nullptr.
  const ServerCore* ServingCore() const {
    return current_ >= 0 && replicas_[current_].serving ? replicas_[current_].core.get() : nullptr;
  }
  ServerCore* ServingCore() {
    return current_ >= 0 && replicas_[current_].serving ? replicas_[current_].core.get() : nullptr;
  }
  ServerCore* CoreOf(int conn) { return replicas_[conns_[conn]->replica].core.get(); }
  int NodeOf(int conn) const { return replicas_[conns_[conn]->replica].node; }
  SimClient* ClientAt(int node) { return clients_[node - replica_count_].get(); }

  void StartLockd();
  void Crash(int replica);
  // On etcd: a replica process starts, standing by until it owns the prefix.
  void StartReplica(int i);
  void OnReplicaOpened(int i, absl::StatusOr<server::OpenedCommitLog> opened);
  // The replica's process ends (a crash: `crashed`; else it gave its ownership back) and a
  // supervisor starts it again a moment later.
  void StopReplica(int i, bool crashed);
  // Checks of the replicas: what they act on, and who commits in etcd.
  // `leaving`: the reply leaves the replica now (else it was handed to the reply gate, which
  // holds it until what it reflects is committed).
  void CheckAct(int i, server::Act::Kind kind, const std::string& lock, uint64_t token,
                bool leaving);
  void OnEtcdEvent(const etcdserverpb::Event& e);
  // P/sequences as etcd holds it now.
  server::Sequences EtcdSequences();
  // Recovery gives exactly the committed log; nothing acknowledged is lost.
  void CheckRecovered(const server::OpenedCommitLog& opened, MonoTime now, const std::string& who);
  server::CoreOptions CoreOptions();
  void ScheduleFaults();
  // The simulated etcd's: elections, replies lost after commits, a slow member, a replica cut
  // off from etcd, NOSPACE, and P/owner deleted by hand.
  void ScheduleEtcdFaults();
  // lockd loses a client's session while the client still holds its leases, as a replica that
  // lost it would: the client's connection is cut, and the session is ended at once (by a
  // stranger with its secret) before the client can resume it.
  void EndASession();
  // One of the connections now open, or -1.
  int RandomOpenConnection();
  void DeliverToLockd(int conn, std::string payload, wire::Request request);
  // Runs one lockd event with the FIFO check around it.
  void RunLockdEvent(int node, const std::function<void()>& fn);
  void CheckReplyGate(int conn, std::string_view frames);

  SimOptions options_;
  Rng rng_;
  Rng secrets_;  // session secrets, apart from rng_ so that they change no other draw
  World world_;
  SimResult result_;
  const int replica_count_;
  const bool trace_ = std::getenv("FENCELOCK_SIM_TRACE") != nullptr;
  // On etcd, some runs have holders that keep their locks for seconds: long stretches with
  // nothing to commit, only renewals and confirmations.
  bool long_holders_ = false;
  std::set<std::string> failed_;
  SimDisk disk_;
  std::vector<Replica> replicas_;
  int current_ = -1;  // the replica that began to serve last
  uint64_t current_committed_lsn_ = 0;  // the highest lsn it reported committed
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
  // ADR 0006, checked on the records of the serving replica as it applies them, against a
  // shadow of each lock's holders and pending delays kept here on that replica's clock (a
  // grant's time is its lease's end less its TTL): no exclusive grant overlaps any holder, no
  // shared grant overlaps an exclusive one, no grant falls inside a delay that blocks it, and a
  // lease that ran out delays from its end, not later. Rebuilt from the state whenever a core
  // begins to serve (ResetShadow), since what it restored is all it knows.
  struct ShadowHolder {
    server::LockMode mode;
    absl::Duration delay;
    MonoTime expires_at;
  };
  struct ShadowLock {
    std::map<FenceToken, ShadowHolder> holders;
    MonoTime all_until = MonoTime::Min();      // no grant before
    MonoTime writers_until = MonoTime::Min();  // no exclusive grant before
  };
  std::map<std::string, ShadowLock> shadow_;
  void ResetShadow(const ServerCore& core);
  int64_t handoff_at_ = 0;  // when the log's last completion reaches lockd's thread
  const int env_node_;
  // One-way partitions of a client's link: nothing it sends (or nothing sent to it) arrives
  // before these true times; TCP then delivers what was sent, in order.
  std::map<int, int64_t> blocked_to_server_, blocked_to_client_;
  // The simulated etcd (replicas > 1).
  std::unique_ptr<WorldClock> etcd_clock_;
  std::unique_ptr<SimEtcd> etcd_;
  std::unique_ptr<EtcdNet> etcd_net_;
  std::string etcd_owner_;                  // P/owner's value now
  bool deleting_by_hand_ = false;
  struct OwnerKey {
    int64_t created = 0;
    int64_t gone = INT64_MAX;
    bool by_hand = false;
  };
  std::map<std::string, OwnerKey> owner_keys_;  // by P/owner value
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
  sim_->OnApplied(replica_, record);
  const uint64_t before = inner_->last_lsn();
  inner_->Append(record);
  if (inner_->last_lsn() == before) return;  // renewals are not logged
  batch_last_lsn_[inner_->newest_batch()] = inner_->last_lsn();
  sim_->OnAppended(replica_, inner_->last_lsn(), record);
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
    sim_->OnCommittedLsn(replica_, it->second);
    it = batch_last_lsn_.erase(it);
  }
  listener_->OnCommitted(batch);
}

void RecordingLog::OnCommitFault(const absl::Status& status) {
  // On etcd a commit fault ends the replica's service (CoreOptions::on_ending_fault).
  if (!sim_->on_etcd()) sim_->OnDiskFault();
  listener_->OnCommitFault(status);
}

// ---- the network ----

int Simulation::OpenConnection(int client_node, int replica) {
  const int id = static_cast<int>(conns_.size());
  auto c = std::make_unique<Connection>();
  c->client = client_node;
  c->replica = replica;
  const int64_t arrive =
      std::max(world_.now() + Ns(rng_.Between(absl::Microseconds(50), absl::Microseconds(500))),
               blocked_to_server_[client_node]);
  c->last_to_server = arrive;
  conns_.push_back(std::move(c));
  sinks_.push_back(std::make_unique<Sink>(this, id));
  if (!replicas_[replica].up) {
    // Nobody listens: the connection is refused.
    world_.At(arrive, client_node, [this, id] {
      conns_[id]->open = false;
      if (conns_[id]->client != env_node_) ClientAt(conns_[id]->client)->OnDisconnected(id);
    });
    return id;
  }
  world_.At(arrive, replicas_[replica].node, [this, id] {
    if (!conns_[id]->open) return;
    if (ServerCore* core = CoreOf(id)) conns_[id]->server_id = core->Connect(sinks_[id].get());
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
  world_.At(at, NodeOf(conn), [this, conn, payload = std::move(payload), r] {
    DeliverToLockd(conn, payload, r);
  });
}

void Simulation::DeliverToLockd(int conn, std::string payload, wire::Request request) {
  Connection& c = *conns_[conn];
  ServerCore* core = CoreOf(conn);
  if (!c.open || c.server_id == 0 || !core) return;
  world_.Mix(payload);
  // Which lock renewals and releases are stale on arrival: lockd must never accept those.
  const auto& state = core->service().state();
  auto note = [&](const std::string& lock, FenceToken token) {
    const server::LockState* held = state.FindLock(lock);
    if (held == nullptr || held->FindToken(token) == nullptr) {
      stale_.insert({conn, request.request_id(), lock});
    }
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
  core->Receive(c.server_id, std::span<const std::string>(&payload, 1));
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
      sim->ClientAt(c.client)->OnResponse(conn, r);
      if (!c.open) break;
    }
  });
}

void Simulation::Sink::CloseAfterSend() {
  Simulation* sim = sim_;
  const int conn = conn_;
  const int64_t at = sim->conns_[conn]->last_to_client + 1;
  sim->world_.At(at, sim->NodeOf(conn), [sim, conn] { sim->CutConnection(conn); });
}

void Simulation::CutConnection(int conn) {
  Connection& c = *conns_[conn];
  if (!c.open) return;
  c.open = false;
  world_.Mix(static_cast<uint64_t>(conn) | (uint64_t{0xC} << 56));
  if (c.server_id != 0 && CoreOf(conn) != nullptr) {
    const ConnectionId id = c.server_id;
    const uint64_t gen = replicas_[c.replica].core_gen;
    world_.At(world_.now() + Ns(absl::Microseconds(100)), NodeOf(conn),
              [this, conn, id, gen] {
                // Only the core it was connected to: a takeover replaces a standby's core.
                const Replica& r = replicas_[conns_[conn]->replica];
                if (r.core && r.core_gen == gen) r.core->Disconnect(id);
              });
  }
  const int client = c.client;
  world_.At(world_.now() + Ns(absl::Microseconds(100)), client,
            [this, conn, client] {
              if (client != env_node_) ClientAt(client)->OnDisconnected(conn);
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
                                            .now = [this] { return replicas_[0].time->Now(); },
                                            .log = [](const std::string&) {}};
  log_options.schedule_writer = [this](std::function<void()> step) {
    absl::Duration latency = rng_.Between(absl::Microseconds(100), absl::Milliseconds(1));
    if (options_.disk_faults && rng_.Chance(0.02)) {
      latency = rng_.Between(absl::Milliseconds(50), absl::Milliseconds(400));  // a slow sync
    }
    world_.At(world_.now() + Ns(latency), replicas_[0].node, std::move(step));
  };
  // The writer hands its completions to lockd's thread across threads: they arrive in order,
  // each some microseconds later, and lockd may run other events (an inline sync) meanwhile.
  auto opened = server::OpenLocalCommitLog(
      log_options, replicas_[0].time->Now(), [this](std::function<void()> f) {
        handoff_at_ = std::max(handoff_at_, world_.now() + rng_.Between(0, Ns(absl::Microseconds(500))));
        world_.At(handoff_at_, replicas_[0].node, std::move(f));
      });
  if (!opened.ok()) {
    Fail(absl::StrCat("lockd does not recover after a crash: ", opened.status().ToString()));
    return;
  }
  CheckRecovered(*opened, replicas_[0].time->Now(), "lockd");
  current_ = 0;
  current_committed_lsn_ = committed_lsn_;
  opened->log = std::make_unique<RecordingLog>(std::move(opened->log), this, 0);
  Replica& r = replicas_[0];
  r.core = std::make_unique<ServerCore>(CoreOptions(), r.time.get(), std::move(*opened));
  ++r.core_gen;
  r.core->Start();
  ResetShadow(*r.core);
  r.up = r.serving = true;
  r.started_at = world_.now();
}

void Simulation::Crash(int replica) {
  if (on_etcd()) return StopReplica(replica, true);
  if (!replicas_[0].up) return;
  ++result_.crashes;
  world_.Mix(uint64_t{0xDEAD});
  Replica& r = replicas_[0];
  r.up = r.serving = false;
  world_.Restart(r.node);  // every pending lockd event (timers, disk steps, deliveries) is gone
  r.core.reset();
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
  world_.At(back, replicas_[0].node, [this] { StartLockd(); });
}

server::CoreOptions Simulation::CoreOptions() {
  server::CoreOptions options{
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
  return options;
}

void Simulation::CheckRecovered(const server::OpenedCommitLog& opened, MonoTime now,
                                const std::string& who) {
  // Nothing committed may be lost, and recovery must give exactly the log up to where it ends.
  const uint64_t recovered_lsn = opened.log->last_lsn();
  if (recovered_lsn < committed_lsn_) {
    Fail(absl::StrCat(who, ": recovery ends at lsn ", recovered_lsn, " but lsn ", committed_lsn_,
                      " was committed (acknowledged state lost)"));
  }
  appended_.erase(appended_.upper_bound(recovered_lsn), appended_.end());
  max_token_appended_ = 0;
  committed_lsn_ = recovered_lsn;
  StateMachine replayed;
  for (const auto& [lsn, r] : appended_) replayed.Apply(r, now);
  if (replayed.DebugString() != opened.state.DebugString()) {
    Fail(absl::StrCat(who, ": recovered state differs from the committed log: recovered {",
                      opened.state.DebugString(), "} log {", replayed.DebugString(), "}"));
  }
  if (!acked_tokens_.empty() && opened.state.last_token() < *acked_tokens_.rbegin()) {
    Fail(absl::StrCat(who, ": after recovery the next token would be ", opened.state.last_token() + 1,
                      ", but token ", *acked_tokens_.rbegin(), " was acknowledged"));
  }
}

namespace {
const char* Shared(LockMode mode) { return mode == LockMode::kShared ? " (shared)" : ""; }
const char* Shared(server::LockMode mode) {
  return mode == server::LockMode::kShared ? " (shared)" : "";
}
}  // namespace

void Simulation::ResetShadow(const ServerCore& core) {
  shadow_.clear();
  for (const auto& [lock, held] : core.service().state().locks()) {
    ShadowLock& s = shadow_[lock];
    for (const server::HolderState& h : held.holders) {
      s.holders[h.token] = ShadowHolder{h.mode, h.lock_delay, h.expires_at};
    }
    if (held.delay_all) s.all_until = held.delay_all->until;
    if (held.delay_writers) s.writers_until = held.delay_writers->until;
  }
}

void Simulation::OnApplied(int replica, const Record& r) {
  if (replica != current_ || replicas_[replica].core == nullptr) return;
  const server::StateMachine& state = replicas_[replica].core->service().state();
  if (const auto* g = std::get_if<server::record::LockGranted>(&r)) {
    const server::HolderState* h = state.FindLock(g->lock)->FindToken(g->token);
    const MonoTime granted_at = h->expires_at - g->ttl;
    ShadowLock& s = shadow_[g->lock];
    for (const auto& [token, other] : s.holders) {
      if (g->mode == server::LockMode::kExclusive || other.mode == server::LockMode::kExclusive) {
        Fail(absl::StrCat("lock ", g->lock, " granted with token ", g->token, Shared(g->mode),
                          " while token ", token, Shared(other.mode), " holds it"));
      }
    }
    const MonoTime until = g->mode == server::LockMode::kExclusive
                               ? std::max(s.all_until, s.writers_until)
                               : s.all_until;
    if (granted_at < until) {
      Fail(absl::StrCat("lock ", g->lock, " granted with token ", g->token, Shared(g->mode), " ",
                        absl::FormatDuration(until - granted_at),
                        " before the end of a lock delay that blocks it"));
    }
    s.holders[g->token] = ShadowHolder{g->mode, g->lock_delay, h->expires_at};
    if (g->mode == server::LockMode::kShared) ++result_.shared_grants;
  } else if (const auto* renewed = std::get_if<server::record::LockRenewed>(&r)) {
    auto s = shadow_.find(renewed->lock);
    if (s == shadow_.end()) return;
    auto h = s->second.holders.find(renewed->token);
    const server::LockState* held = state.FindLock(renewed->lock);
    if (h != s->second.holders.end() && held != nullptr && held->FindToken(renewed->token)) {
      h->second.expires_at = held->FindToken(renewed->token)->expires_at;
    }
  } else if (const auto* released = std::get_if<server::record::LockReleased>(&r)) {
    auto s = shadow_.find(released->lock);
    if (s == shadow_.end()) return;
    auto h = s->second.holders.find(released->token);
    if (h == s->second.holders.end()) return;
    const ShadowHolder gone = h->second;
    s->second.holders.erase(h);
    if (released->reason == server::ReleaseReason::kReleased ||
        gone.delay <= absl::ZeroDuration()) {
      return;
    }
    ++result_.delays_started;
    const server::LockState* held = state.FindLock(released->lock);
    const auto& delay = gone.mode == server::LockMode::kExclusive
                            ? (held ? held->delay_all : std::nullopt)
                            : (held ? held->delay_writers : std::nullopt);
    // A lease that ran out was lost at its end, which this shadow knows (renewals included);
    // when lockd stalled, it postponed that end, so the delay can only be later than this.
    MonoTime until = delay ? delay->until : MonoTime::Min();
    if (released->reason == server::ReleaseReason::kLeaseExpired &&
        until < gone.expires_at + gone.delay) {
      Fail(absl::StrCat("lock ", released->lock, " token ", released->token,
                        " lost at its lease's end: its delay of ", absl::FormatDuration(gone.delay),
                        " ends ", absl::FormatDuration(gone.expires_at + gone.delay - until),
                        " early"));
      until = gone.expires_at + gone.delay;
    }
    MonoTime& shadow_until =
        gone.mode == server::LockMode::kExclusive ? s->second.all_until : s->second.writers_until;
    shadow_until = std::max(shadow_until, until);
  }
}

void Simulation::OnAppended(int replica, uint64_t lsn, const Record& r) {
  // A deposed replica's records are never committed (its transactions are guarded by its
  // ownership; CheckTxn); only the serving one's count.
  if (replica != current_) return;
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
    // On etcd every act is checked again as it leaves the replica, whatever the core said.
    if (on_etcd() && conns_[conn]->client != env_node_) {
      if (r.has_acquire() && r.acquire().granted()) {
        CheckAct(conns_[conn]->replica, server::Act::kGrant, r.acquire().lock(), r.acquire().token(),
                 true);
      } else if (r.has_keep_alive()) {
        CheckAct(conns_[conn]->replica, server::Act::kRenew, "-", 0, true);
      } else if (r.has_validate()) {
        CheckAct(conns_[conn]->replica, server::Act::kValidate, "-", 0, true);
      }
    }
    // The lsns are the serving replica's; a deposed one's acts are CheckAct's.
    if (conns_[conn]->replica != current_) continue;
    auto committed = [&](const std::map<uint64_t, uint64_t>& lsns, uint64_t key,
                         const char* what) {
      auto it = lsns.find(key);
      if (it != lsns.end() && it->second > current_committed_lsn_) {
        Fail(absl::StrCat("reply acknowledging ", what, " ", key, " left lockd before lsn ",
                          it->second, " was committed (committed: ", current_committed_lsn_, ")"));
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

void Simulation::RunLockdEvent(int node, const std::function<void()>& fn) {
  // FIFO: a grant to a waiter while an earlier waiter for the same lock stays queued skips it.
  // Waiters are told apart by id: a session may queue again in the same event as it is
  // granted, and may have two waiters for one lock.
  Replica& r = replicas_[node];
  const uint64_t gen = r.core_gen;
  const bool serving = r.serving;
  std::map<std::string, std::vector<std::pair<server::WaiterId, SessionId>>> before;
  if (serving) {
    for (int l = 0; l < options_.locks; ++l) {
      const std::string lock = absl::StrCat("lock-", l);
      before[lock] = r.core->service().QueuedWaiters(lock);
    }
  }
  grants_this_event_.clear();
  fn();
  if (!serving || !r.serving || r.core_gen != gen) return;
  ServerCore* core = r.core.get();
  for (const auto& [lock, session] : grants_this_event_) {
    const auto& queue = before[lock];
    const auto after = core->service().QueuedWaiters(lock);
    auto waits = [&](server::WaiterId id) {
      return std::any_of(after.begin(), after.end(), [&](const auto& w) { return w.first == id; });
    };
    // The granted waiter: the first of the session's that left the queue.
    auto pos = std::find_if(queue.begin(), queue.end(),
                            [&](const auto& w) { return w.second == session && !waits(w.first); });
    if (pos == queue.end()) continue;  // not a waiter
    for (auto it = queue.begin(); it != pos; ++it) {
      if (waits(it->first)) {
        Fail(absl::StrCat("lock ", lock, " went to waiting session ", session,
                          " while session ", it->second, ", queued before it, still waits"));
      }
    }
  }
}

void Simulation::CheckHeld(int client, const std::string& lock, FenceToken token,
                           SessionId session, LockMode mode) {
  ++result_.checks_passed;
  // On the simulated timeline, whatever lockd's state: no other client believes it holds the
  // lock with another token right now (its own checkStillHeld would pass), unless both hold
  // it shared.
  if (bounds_hold() && !ended_by_fault(session)) {
    for (const auto& other : clients_) {
      if (other->node() == client) continue;
      const auto believed = other->Believes(lock);
      if (!believed || believed->token == token || ended_by_fault(believed->session)) continue;
      if (mode == LockMode::kShared && believed->mode == LockMode::kShared) continue;
      ++result_.overlaps;
      Fail(absl::StrCat("client ", client, " passed checkStillHeld for ", lock, " with token ",
                        token, Shared(mode), " while client ", other->node(),
                        " would pass it too with token ", believed->token,
                        Shared(believed->mode)));
    }
  }
  const ServerCore* core = ServingCore();
  if (core == nullptr) return;
  const server::LockState* held = core->service().state().FindLock(lock);
  if (held == nullptr || !held->held() || held->FindToken(token) != nullptr) return;
  ++result_.overlaps;
  if (bounds_hold() && !ended_by_fault(session)) {
    const server::HolderState& holder = held->holders.front();
    Fail(absl::StrCat("client ", client, " passed checkStillHeld for ", lock, " with token ",
                      token, " while session ", holder.session, " holds it with token ",
                      holder.token, Shared(holder.mode)));
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
      world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this] {
        // On etcd, mostly the serving replica.
        int replica = 0;
        if (on_etcd()) {
          replica = current_ >= 0 && rng_.Chance(0.7) ? current_
                                                     : static_cast<int>(rng_.Below(replica_count_));
        }
        Crash(replica);
      });
    }
  }
  if (options_.network_faults && rng_.Chance(0.2)) {
    world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this] { EndASession(); });
  }
  if (options_.disk_faults && !on_etcd() && rng_.Chance(0.25)) {
    world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this] {
      if (replicas_[0].up) disk_.FailNextSync();
    });
  }
  if (on_etcd()) ScheduleEtcdFaults();
  if (options_.pauses) {
    for (int i = 0, n = static_cast<int>(rng_.Below(4)); i < n; ++i) {
      const int node = static_cast<int>(rng_.Below(replica_count_ + options_.clients));
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
        const int client = replica_count_ + static_cast<int>(rng_.Below(options_.clients));
        const int64_t heal = world_.now() + Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(4)));
        auto& blocked = rng_.Chance(0.5) ? blocked_to_server_ : blocked_to_client_;
        blocked[client] = std::max(blocked[client], heal);
        world_.Mix(static_cast<uint64_t>(client) | (uint64_t{0xB} << 56));
      });
    }
  }
}

void Simulation::EndASession() {
  if (ServingCore() == nullptr) return;
  // A session with a lock held.
  std::vector<SessionId> candidates;
  for (int l = 0; l < options_.locks; ++l) {
    const server::LockState* held =
        ServingCore()->service().state().FindLock(absl::StrCat("lock-", l));
    if (held == nullptr) continue;
    for (const server::HolderState& h : held->holders) {
      if (secrets_by_session_.contains(h.session)) candidates.push_back(h.session);
    }
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
  c->replica = current_;
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
  world_.At(world_.now(), NodeOf(stranger), [this, stranger, payloads = std::move(payloads)] {
    ServerCore* core = CoreOf(stranger);
    if (core == nullptr || !conns_[stranger]->open) return;
    conns_[stranger]->server_id = core->Connect(sinks_[stranger].get());
    core->Receive(conns_[stranger]->server_id, std::span<const std::string>(payloads));
  });
}

SimResult Simulation::Run() {
  const int64_t bound_ppm = static_cast<int64_t>(options_.clock_rate_bound * 1e6);
  for (int n = 0; n < replica_count_ + options_.clients; ++n) {
    World::Node& node = world_.node(n);
    node.rate_ppm = rng_.Between(-bound_ppm, bound_ppm);
    node.origin = Ns(absl::Hours(1)) + rng_.Between(0, Ns(absl::Hours(100)));
  }
  replicas_.resize(replica_count_);
  for (int i = 0; i < replica_count_; ++i) {
    if (options_.lockd_fast_clock > 0) {
      world_.node(i).rate_ppm = static_cast<int64_t>(options_.lockd_fast_clock * 1e6);
    }
    replicas_[i].node = i;
    replicas_[i].time = std::make_unique<NodeTime>(&world_, i);
  }
  if (on_etcd()) {
    long_holders_ = rng_.Chance(0.3);
    etcd_clock_ = std::make_unique<WorldClock>(&world_);
    etcd_ = std::make_unique<SimEtcd>(etcd_clock_.get());
    etcd_net_ = std::make_unique<EtcdNet>(&world_, &rng_, env_node_, etcd_.get());
    etcd_->SetObserver([this](const etcdserverpb::Event* e) {
      etcd_net_->OnChange();
      if (e != nullptr) OnEtcdEvent(*e);
    });
    server::EtcdCommitLogOptions init{.prefix = kPrefix, .reservation_block = 7};
    if (absl::Status s = server::InitEtcdPrefixOn(init, *etcd_->Connect("init")); !s.ok()) {
      Fail(absl::StrCat("init: ", s.ToString()));
      return result_;
    }
    for (int i = 0; i < replica_count_; ++i) {
      world_.At(i == 0 ? 0 : rng_.Between(0, Ns(absl::Milliseconds(300))), i,
                [this, i] { StartReplica(i); });
    }
  } else {
    if (absl::Status s = server::InitDataDir(&disk_, kDataDir, 16 << 10); !s.ok()) {
      Fail(absl::StrCat("init: ", s.ToString()));
      return result_;
    }
    RunLockdEvent(0, [&] { StartLockd(); });
  }
  for (int c = 0; c < options_.clients; ++c) {
    clients_.push_back(std::make_unique<SimClient>(this, replica_count_ + c, &world_, &rng_));
  }
  for (auto& c : clients_) c->Start();
  ScheduleFaults();
  const int64_t end = Ns(options_.duration);
  while (result_.ok &&
         world_.Step(end, [this](int node, const std::function<void()>& fn) {
           if (node < replica_count_) {
             RunLockdEvent(node, fn);
           } else {
             fn();
           }
         })) {
  }
  result_.events = world_.events();
  result_.trace_hash = world_.hash();
  // Timers and clients refer to the cores: tear down in order. Nothing more reaches etcd.
  for (Replica& r : replicas_) {
    if (r.dead) *r.dead = true;
    r.core.reset();
    r.standby_loop.reset();
    r.opening.reset();
  }
  clients_.clear();
  return result_;
}

// ---- replicas on the simulated etcd ----

void Simulation::StartReplica(int i) {
  Replica& r = replicas_[i];
  ++r.incarnation;
  r.dead = std::make_shared<bool>(false);
  r.owner = absl::StrCat("lockd-", i, " #", r.incarnation, " (tcp ", ReplicaAddress(i), ")");
  r.owned_until = MonoTime::Min();
  world_.Mix(r.owner);
  Trace(absl::StrCat(r.owner, " starts"));
  // It listens at once, answering NOT_LEADER (naming the owner once it knows it) while it
  // waits for the prefix, as `lockd serve --etcd-standby` does.
  server::OpenedCommitLog nothing;
  nothing.log = server::StandbyCommitLog(kPrefix);
  auto standing_by = std::make_unique<server::StandingBy>();
  r.standing_by = standing_by.get();
  nothing.leadership = std::move(standing_by);
  r.standby_loop = std::make_unique<LoopTime>(r.time.get());
  r.core = std::make_unique<ServerCore>(CoreOptions(), r.standby_loop.get(), std::move(nothing));
  ++r.core_gen;
  r.core->Start();
  ResetShadow(*r.core);
  r.up = true;
  r.serving = false;
  server::EtcdCommitLogOptions o{.endpoints = {"sim-etcd-0", "sim-etcd-1", "sim-etcd-2"},
                                 .prefix = kPrefix,
                                 .reservation_block = kReservationBlock,
                                 .request_timeout = kEtcdRequestTimeout,
                                 .owner_ttl = kOwnerTtl,
                                 .owner_wait = absl::InfiniteDuration(),
                                 .snapshot_min_bytes = 8 << 10,
                                 .max_value_bytes = 4 << 10,
                                 .owner = r.owner,
                                 .member_probe = absl::ZeroDuration()};
  const uint64_t incarnation = r.incarnation;
  o.on_owned = [this, i, incarnation](MonoTime, MonoTime until) {
    Replica& r = replicas_[i];
    if (r.incarnation != incarnation) return;
    r.owned_until = until;
    // lockd gives up before etcd could: the deadline comes before etcd's own expiry of the
    // lease P/owner is on.
    const auto key = etcd_->Get(absl::StrCat(kPrefix, "/owner"));
    if (!key || key->value() != r.owner) return;
    const auto expires = etcd_->LeaseExpiresAt(key->lease());
    const int64_t deadline = r.time->TrueTimeOf(until);
    if (expires && deadline > expires->nanos()) {
      Fail(absl::StrCat(r.owner, " holds its ownership until ", deadline / 1e9,
                        " s, after etcd's expiry of its lease at ", expires->nanos() / 1e9, " s"));
    }
  };
  o.on_standby = [this, i, incarnation](const std::string& owner) {
    Replica& r = replicas_[i];
    if (r.incarnation != incarnation || r.standing_by == nullptr) return;
    // "lockd-<j> #<n> (tcp lockd-<j>:7420)": the address is what the clients dial.
    r.standing_by->SetLeader(server::LeaderOfOwner(owner));
  };
  o.log = [this, i](const std::string& line) {
    world_.Mix(line);
    Trace(absl::StrCat("lockd-", i, " log: ", line));
  };
  const std::string owner = r.owner;
  EtcdNet::TxnCheck check;
  auto before = std::make_shared<std::string>();
  check.before = [this, before](const etcdserverpb::TxnRequest&) { *before = etcd_owner_; };
  check.after = [this, before, owner](const etcdserverpb::TxnRequest& request,
                                      const absl::StatusOr<etcdserverpb::TxnResponse>& response) {
    if (!response.ok() || !response->succeeded() || *before == owner) return;
    // Only the owner's transactions may change lockd's state under the prefix.
    for (const auto& op : request.success()) {
      const std::string& key = op.has_request_put() ? op.request_put().key()
                               : op.has_request_delete_range() ? op.request_delete_range().key()
                                                               : std::string();
      if (key.empty() || key == absl::StrCat(kPrefix, "/owner")) continue;
      Fail(absl::StrCat(owner, " committed a write of ", key, " while ",
                        before->empty() ? std::string("nobody") : *before, " owned the prefix"));
      return;
    }
  };
  r.opening = server::OpenEtcdCommitLogOn(
      o, r.time.get(), etcd_net_->Connect(r.node, absl::StrCat("lockd-", i), kEtcdRequestTimeout, r.dead,
                                          std::move(check)),
      [this, i](absl::StatusOr<server::OpenedCommitLog> opened) {
        OnReplicaOpened(i, std::move(opened));
      });
}

void Simulation::OnReplicaOpened(int i, absl::StatusOr<server::OpenedCommitLog> opened) {
  Replica& r = replicas_[i];
  if (!opened.ok()) {
    world_.Mix(opened.status().ToString());
    if (opened.status().code() == absl::StatusCode::kDataLoss ||
        opened.status().code() == absl::StatusCode::kInvalidArgument) {
      Fail(absl::StrCat(r.owner, " cannot restore the state: ", opened.status().ToString()));
    }
    // It exits, and its supervisor starts it again.
    return StopReplica(i, false);
  }
  Trace(absl::StrCat(r.owner, " serves"));
  CheckRecovered(*opened, r.time->Now(), absl::StrCat(r.owner, " taking over"));
  // Before it answers anyone, a new owner reserves a block of tokens and session ids above
  // everything it restored.
  const server::Sequences reserved = EtcdSequences();
  if (reserved.token_hwm < opened->state.last_token() + kReservationBlock ||
      reserved.session_hwm < opened->state.last_session_id() + kReservationBlock) {
    Fail(absl::StrCat(r.owner, " serves with P/sequences at token ", reserved.token_hwm,
                      " and session ", reserved.session_hwm, ", not a block above the restored token ",
                      opened->state.last_token(), " and session ", opened->state.last_session_id()));
  }
  ++result_.takeovers;
  // The standby's connections close; the same port serves from now on.
  for (size_t c = 0; c < conns_.size(); ++c) {
    if (conns_[c]->open && conns_[c]->replica == i) CutConnection(static_cast<int>(c));
  }
  renewals_.clear();
  grant_lsn_.clear();
  session_lsn_.clear();
  current_ = i;
  current_committed_lsn_ = committed_lsn_;
  opened->log = std::make_unique<RecordingLog>(std::move(opened->log), this, i);
  server::CoreOptions options = CoreOptions();
  const uint64_t incarnation = r.incarnation;
  options.on_act = [this, i](const server::Act& act) {
    if (trace_) Trace(absl::StrCat("lockd-", i, " act ", act.kind, " ", act.key, " token ", act.token, " at ",
                       act.at.nanos(), " owned until ", act.owned_until.nanos()));
    CheckAct(i, act.kind, act.key, act.token, false);
  };
  options.on_ending_fault = [this, i, incarnation](const absl::Status& fault) {
    Replica& r = replicas_[i];
    if (r.incarnation != incarnation) return;
    world_.Mix(fault.ToString());
    // It stops accepting, refuses what it held, closes its connections 200 ms later, gives its
    // lease back and exits (status 3); a supervisor starts it again.
    r.up = false;
    world_.At(world_.now() + Ns(absl::Milliseconds(200)), r.node, [this, i, incarnation] {
      if (replicas_[i].incarnation == incarnation) StopReplica(i, false);
    });
  };
  r.standing_by = nullptr;
  r.core = std::make_unique<ServerCore>(options, r.time.get(), std::move(*opened));
  r.standby_loop.reset();
  ++r.core_gen;
  r.core->Start();
  ResetShadow(*r.core);
  r.serving = true;
  r.started_at = world_.now();
}

void Simulation::StopReplica(int i, bool crashed) {
  Replica& r = replicas_[i];
  if (!r.core && !r.opening) return;
  world_.Mix(uint64_t{crashed ? 0xDEADu : 0xE817u} | (uint64_t(i) << 32));
  Trace(absl::StrCat(r.owner, crashed ? " crashes" : " exits"));
  if (crashed) {
    ++result_.crashes;
    *r.dead = true;  // what it sent still arrives; nothing more leaves
    world_.Restart(r.node);
  }
  r.up = false;
  r.serving = false;
  for (size_t c = 0; c < conns_.size(); ++c) {
    if (conns_[c]->open && conns_[c]->replica == i) {
      conns_[c]->server_id = 0;
      CutConnection(static_cast<int>(c));
    }
  }
  // A clean exit gives the lease back (the log's destructor revokes it); a crash cannot.
  r.standing_by = nullptr;
  r.core.reset();
  r.standby_loop.reset();
  r.opening.reset();
  *r.dead = true;
  if (!crashed) world_.Restart(r.node);
  const int64_t back = world_.now() + Ns(rng_.Between(absl::Milliseconds(100), absl::Seconds(2)));
  world_.At(back, r.node, [this, i] { StartReplica(i); });
}

void Simulation::CheckAct(int i, server::Act::Kind kind, const std::string& lock,
                          uint64_t token, bool leaving) {
  if (kind == server::Act::kFencedOut) return;
  static constexpr const char* kWhat[] = {"a grant", "a renewal", "a confirmation (Validate)"};
  const Replica& r = replicas_[i];
  const std::string what =
      absl::StrCat(r.owner, " answered ", kWhat[kind], lock == "-" ? "" : " of ", lock == "-" ? "" : lock,
                   token != 0 ? absl::StrCat(" (token ", token, ")") : "");
  if (!r.serving) Fail(absl::StrCat(what, " while not serving"));
  if (current_ != i) {
    Fail(absl::StrCat(what, " after ", replicas_[current_].owner, " took over"));
  }
  if (r.time->Now() >= r.owned_until) {
    Fail(absl::StrCat(what, " at ", r.time->Now().nanos(), " on its clock, at or after its ownership deadline ",
                      r.owned_until.nanos()));
  }
  // A token is reserved in etcd before it is handed out.
  if (leaving && kind == server::Act::kGrant && token > EtcdSequences().token_hwm) {
    Fail(absl::StrCat(what, " above the reservation in P/sequences (", EtcdSequences().token_hwm, ")"));
  }
  auto key = owner_keys_.find(r.owner);
  if (key == owner_keys_.end()) return Fail(absl::StrCat(what, " without ever owning the prefix"));
  const int64_t now = world_.now();
  if (!key->second.by_hand && now >= key->second.gone) {
    Fail(absl::StrCat(what, " ", (now - key->second.gone) / 1e6,
                      " ms after etcd let its ownership go (its lease ran out or was revoked)"));
  }
  // Deleted by hand: it stops within its usable ownership (its deadline moves only while
  // P/owner is its own), however long its lease lives.
  const int64_t usable = static_cast<int64_t>(Ns(kOwnerTtl) * (1 - server::kEtcdOwnerMargin) *
                                              (1 + 2 * options_.clock_rate_bound));
  if (key->second.by_hand && now >= key->second.gone + usable) {
    Fail(absl::StrCat(what, " ", (now - key->second.gone) / 1e6,
                      " ms after its P/owner was deleted by hand"));
  }
}

server::Sequences Simulation::EtcdSequences() {
  const auto kv = etcd_->Get(absl::StrCat(kPrefix, "/sequences"));
  if (!kv) return {};
  auto decoded = server::DecodeSequences("P/sequences", kv->value());
  if (!decoded.ok()) {
    Fail(absl::StrCat("P/sequences does not decode: ", decoded.status().ToString()));
    return {};
  }
  return *decoded;
}

void Simulation::OnEtcdEvent(const etcdserverpb::Event& e) {
  if (e.kv().key() != absl::StrCat(kPrefix, "/owner")) return;
  const int64_t now = world_.now();
  Trace(absl::StrCat("etcd: P/owner ", etcdserverpb::Event::EventType_Name(e.type()), " ",
                     e.kv().value(), deleting_by_hand_ ? " (by hand)" : ""));
  auto gone = [&] {
    if (etcd_owner_.empty()) return;
    OwnerKey& k = owner_keys_[etcd_owner_];
    k.gone = std::min(k.gone, now);
    k.by_hand = deleting_by_hand_;
  };
  if (e.type() == etcdserverpb::Event::DELETE) {
    gone();
    etcd_owner_.clear();
    return;
  }
  if (e.kv().value() == etcd_owner_ && e.kv().create_revision() != e.kv().mod_revision()) return;
  gone();
  etcd_owner_ = e.kv().value();
  // A replica that lost its key while it waited to take over may create it again. One that
  // served keeps its record: it must not act on a key it lost, whatever comes after.
  const bool serving = current_ >= 0 && replicas_[current_].owner == etcd_owner_ &&
                       replicas_[current_].serving;
  if (!serving) owner_keys_[etcd_owner_] = OwnerKey{.created = now};
}

void Simulation::ScheduleEtcdFaults() {
  const int64_t end = Ns(options_.duration);
  const std::string owner_key = absl::StrCat(kPrefix, "/owner");
  for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
    // A leader election: etcd answers nothing for a while.
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Between(absl::Milliseconds(100), absl::Seconds(3)));
    world_.At(at, env_node_, [this, length] {
      ++result_.etcd_faults;
      etcd_->SetUnavailable(true);
      world_.At(world_.now() + length, env_node_, [this] { etcd_->SetUnavailable(false); });
    });
  }
  for (int i = 0, n = static_cast<int>(rng_.Below(4)); i < n; ++i) {
    world_.At(rng_.Between(0, end), env_node_, [this] {
      ++result_.etcd_faults;
      etcd_->LoseRepliesAfterCommit(1 + static_cast<int>(rng_.Below(3)));
    });
  }
  for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
    // A slow member: calls take up to 600 ms each way, some past the request timeout.
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Between(absl::Milliseconds(300), absl::Seconds(4)));
    world_.At(at, env_node_, [this, length] {
      ++result_.etcd_faults;
      etcd_net_->SlowUntil(world_.now() + length);
    });
  }
  for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
    // One replica cut off from etcd (not from its clients).
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(4)));
    const int replica = static_cast<int>(rng_.Below(replica_count_));
    world_.At(at, env_node_, [this, length, replica] {
      ++result_.etcd_faults;
      const std::string name = absl::StrCat("lockd-", replica);
      etcd_->Partition(name, true);
      world_.At(world_.now() + length, env_node_, [this, name] { etcd_->Partition(name, false); });
    });
  }
  for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
    // The serving replica stalls while a lease renewal of its is in flight.
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Chance(0.5) ? rng_.Between(absl::Milliseconds(300), absl::Seconds(1))
                                               : rng_.Between(absl::Seconds(1), absl::Seconds(3)));
    world_.At(at, env_node_, [this, length] {
      if (current_ < 0) return;
      ++result_.etcd_faults;
      etcd_net_->StallAtNextRenewal(replicas_[current_].node, length);
    });
  }
  if (rng_.Chance(0.1)) {
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(2)));
    world_.At(at, env_node_, [this, length] {
      ++result_.etcd_faults;
      etcd_->SetNoSpace(true);
      world_.At(world_.now() + length, env_node_, [this] { etcd_->SetNoSpace(false); });
    });
  }
  if (rng_.Chance(0.3)) {
    // An operator deletes P/owner by hand (etcdctl del).
    // Half the time while the standbys are cut off from etcd for a moment: nobody takes over
    // and revokes the lease the key was on, so only the serving replica's own watch and its
    // reads of the key end its service.
    const bool alone = rng_.Chance(0.5);
    const int64_t cut = Ns(rng_.Between(absl::Seconds(1), absl::Seconds(3)));
    world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this, owner_key, alone, cut] {
      ++result_.etcd_faults;
      Trace(absl::StrCat("an operator deletes P/owner", alone ? ", the standbys cut off" : ""));
      for (int i = 0; alone && i < replica_count_; ++i) {
        if (i == current_) continue;
        const std::string name = absl::StrCat("lockd-", i);
        etcd_->Partition(name, true);
        world_.At(world_.now() + cut, env_node_, [this, name] { etcd_->Partition(name, false); });
      }
      deleting_by_hand_ = true;
      etcd_->Delete(owner_key);
      deleting_by_hand_ = false;
    });
  }
}

// ---- the client ----

void SimClient::Start() {
  client_core::CoreOptions options;
  for (int i = 0; i < sim_->replica_count(); ++i) options.replicas.push_back(sim_->ReplicaAddress(i));
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
  dialing_ = sim_->OpenConnection(node_, static_cast<int>(dial.replica));
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
    auto version =
        protocol::ReadHelloReply(r, sim_->ReplicaAddress(static_cast<int>(dial_replica_)), &leader);
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
      const auto* h = sim_->HolderOf(lock, res->second.session);
      auto g = given_up_.find({lock, token});
      if (h != nullptr && h->token == token && g != given_up_.end()) {
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
    sim_->CheckHeld(node_, lock, held.lease->token(), held.session, held.lease->mode());
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
      const auto* h = sim_->HolderOf(lock, session);
      if (h == nullptr) continue;
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
  } else if (!held_.empty() && rng_->Chance(sim_->release_chance())) {
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
    // ADR 0006: shared now and then, and sometimes with a lock delay that its loss starts.
    const LockMode mode = rng_->Chance(0.4) ? LockMode::kShared : LockMode::kExclusive;
    std::optional<absl::Duration> delay;
    if (rng_->Chance(0.3)) delay = rng_->Between(absl::Milliseconds(50), absl::Milliseconds(800));
    acquire_cancelled_ = false;
    acquire_rid_ = 0;
    acquire_op_ = core_->Acquire(now, acquiring_, wait, ttl, mode, delay);
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
  if (o.replicas < 1 || o.replicas > 3) {
    return "--replicas must be 1 (lockd on its local log) or 2 to 3 (replicas on the simulated etcd)";
  }
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
  if (o.replicas != 1) absl::StrAppend(&cmd, " --replicas=", o.replicas);
  if (o.lockd_fast_clock > 0) absl::StrAppend(&cmd, " --lockd-fast-clock=", o.lockd_fast_clock);
  if (!o.network_faults) absl::StrAppend(&cmd, " --network-faults=false");
  if (!o.disk_faults) absl::StrAppend(&cmd, " --disk-faults=false");
  if (!o.crashes) absl::StrAppend(&cmd, " --crashes=false");
  if (!o.pauses) absl::StrAppend(&cmd, " --pauses=false");
  return cmd + " --verbose";
}

}  // namespace fencelock::sim
