// The simulator's parts, shared by its files: the recording commit log, the simulated
// connections, the clients (SimClient: the client library's core as a worker drives it) and
// the run (Simulation: lockd's replicas, the network, the faults and every check). Internal to
// sim/; sim/simulator.h is the interface.
#ifndef FENCELOCK_SIM_SIMULATION_H_
#define FENCELOCK_SIM_SIMULATION_H_

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


namespace fencelock::sim::internal {

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
  void Snapshot(const StateMachine& state) override;
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
  uint64_t snapshots_seen_ = 0;  // the inner log's stats().snapshots when last looked at
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
    return Belief{FenceToken(it->second.lease->token()), it->second.session,
                  it->second.lease->mode()};
  }

 private:
  struct Held {
    std::shared_ptr<LeaseState> lease;
    SessionId session;
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
  void GiveUp(const std::string& lock, FenceToken token, SessionId session, const char* why) {
    if (session != SessionId()) given_up_[{lock, token}] = GivenUp{session, why};
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
  SessionId acquire_session_;
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
  std::map<std::pair<std::string, FenceToken>, GivenUp> given_up_;
  // A session resumed on connection `conn`: what it owed lockd then, and the last request id
  // sent with the resume's handling. A reply to a later request shows lockd read them all.
  struct Resumed {
    uint64_t last_request = 0;
    std::vector<std::pair<std::string, FenceToken>> owed;
    SessionId session;
  };
  std::map<int, Resumed> resumed_;
  // Locks lockd holds for this client's session with a token the client holds no handle for:
  // since when (true time).
  std::map<std::pair<std::string, FenceToken>, int64_t> orphans_;
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
  // Replica `replica` begins a snapshot of `state`, after record `lsn`.
  void OnSnapshot(int replica, uint64_t lsn, const StateMachine& state);
  // Replica `replica` wrote a snapshot: each snapshot file not checked yet must hold the state
  // as it was when lockd began it (OnSnapshot), however the state changed while it was read.
  void CheckSnapshots(int replica);
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
  // The state at each lsn lockd began a snapshot at (on its local log): a snapshot holds the
  // state as it was then, which is not the log replayed (a delay that ended was forgotten, and
  // the end is no record), so recovery from it is checked against this plus the log after it.
  std::map<uint64_t, StateMachine> snapshot_states_;
  uint64_t snapshot_checked_lsn_ = 0;  // the newest snapshot file CheckSnapshots read
  uint64_t committed_lsn_ = 0;
  FenceToken max_token_appended_;                 // in this run of lockd
  FenceToken max_token_sent_;                     // the highest token in any reply that left lockd
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


}  // namespace fencelock::sim::internal

#endif  // FENCELOCK_SIM_SIMULATION_H_
