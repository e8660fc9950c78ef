// The power-cut run of lockd alone (fencelock-powercut lockd; docs/durability.md): lockd under
// load on a file system that forgets what was never synced, with the power cut again and again.
//
// Each round starts lockd on what the last cut left, checks it against what lockd had
// acknowledged before the cut, and puts load on it for a random time: sessions opened and
// closed, locks acquired and released, a pool manager publishing policy generations, claiming
// its profile and acquiring, activating and releasing leases, segments rolled and snapshots
// taken by a small --wal-segment-bytes. Then lockd is killed (SIGKILL) and the power cut: the
// unsynced writes are dropped, kept in part and out of order, or the newest torn at a sector or
// page boundary. The checks, after each restart:
//   - every session whose open was acknowledged, and whose close was not sent, resumes;
//   - every lock whose grant was acknowledged, and whose release (or its session's close) was
//     not sent, is held under that token; no lock is held under a token below the last
//     acknowledged grant of it, or under a token nobody was granted or sent an acquire for;
//   - the pool's policy generation, its profile's owner epoch and its decision sequence are at
//     least what was acknowledged, and every lease whose activation was acknowledged, and whose
//     release was not sent, is there, active, under its token;
//   - every token granted after the restart (locks and leases) is above every token
//     acknowledged before.
// A lockd that refuses to start fails the run (a correct lockd serves whatever a cut leaves of
// what it synced); with allow_refusals the refusal must name a file of the state directory,
// and the run goes on from a fresh state.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "fencelock/wire.pb.h"
#include "net/blocking_connection.h"
#include "powered_mount.h"
#include "process/process.h"
#include "protocol/requests.h"
#include "runs.h"

namespace fencelock::powercut {
namespace {

namespace req = protocol::request;
using net::BlockingConnection;

constexpr absl::Duration kSessionTtl = absl::Seconds(60);  // nothing expires within a round
constexpr int kLoadThreads = 4;
constexpr int kLockNames = 64;
constexpr char kPool[] = "cuts";
constexpr char kProfile[] = "p";
constexpr uint64_t kPoolBudget = 8;

// What the clients were told, and what they sent, since the last check.
class Acknowledged {
 public:
  struct Lock {
    uint64_t last_granted = 0;        // the highest acknowledged grant
    uint64_t last_granted_session = 0;
    std::set<uint64_t> released;      // tokens whose Release was sent
    int unanswered = 0;  // Acquires sent and not answered (at the cut: lost with lockd)
  };
  // The pool manager's.
  struct Pool {
    uint64_t generation = 0;  // the last acknowledged publish (over the state's life)
    uint64_t epoch = 0;       // the last acknowledged claim
    uint64_t decision = 0;    // the highest acknowledged decision
    std::map<std::string, uint64_t> active;  // slot → token: activation acknowledged, release
                                             // not sent
  };

  void Opened(uint64_t session, std::string secret) {
    std::lock_guard<std::mutex> l(mu_);
    sessions_[session] = std::move(secret);
  }
  void CloseSent(uint64_t session) {
    std::lock_guard<std::mutex> l(mu_);
    closing_.insert(session);
  }
  void AcquireSent(const std::string& lock) {
    std::lock_guard<std::mutex> l(mu_);
    ++locks_[lock].unanswered;
  }
  void Granted(const std::string& lock, uint64_t session, uint64_t token) {
    std::lock_guard<std::mutex> l(mu_);
    Lock& k = locks_[lock];
    if (token > k.last_granted) {
      k.last_granted = token;
      k.last_granted_session = session;
    }
    ++grants_;
    max_token_ = std::max(max_token_, token);
  }
  void Answered(const std::string& lock) {
    std::lock_guard<std::mutex> l(mu_);
    --locks_[lock].unanswered;
  }
  void ReleaseSent(const std::string& lock, uint64_t token) {
    std::lock_guard<std::mutex> l(mu_);
    locks_[lock].released.insert(token);
  }
  void Released() {
    std::lock_guard<std::mutex> l(mu_);
    ++releases_;
  }
  // The pool manager: each acknowledgement raises what must survive.
  void PoolLeaseGranted(uint64_t token, uint64_t decision) {
    std::lock_guard<std::mutex> l(mu_);
    max_token_ = std::max(max_token_, token);
    pool_.decision = std::max(pool_.decision, decision);
    ++pool_decisions_;
  }
  void PoolDecided(uint64_t decision) {
    std::lock_guard<std::mutex> l(mu_);
    pool_.decision = std::max(pool_.decision, decision);
    ++pool_decisions_;
  }
  void PoolActivated(const std::string& slot, uint64_t token, uint64_t decision) {
    std::lock_guard<std::mutex> l(mu_);
    pool_.active[slot] = token;
    pool_.decision = std::max(pool_.decision, decision);
    ++pool_decisions_;
  }
  void PoolReleaseSent(const std::string& slot) {
    std::lock_guard<std::mutex> l(mu_);
    pool_.active.erase(slot);
  }

  std::map<uint64_t, std::string> sessions_;
  std::set<uint64_t> closing_;
  std::map<std::string, Lock> locks_;
  Pool pool_;
  int64_t grants_ = 0, releases_ = 0, pool_decisions_ = 0;
  uint64_t max_token_ = 0;  // over the whole run
  std::mutex mu_;
};

class Run {
 public:
  explicit Run(const RunOptions& options)
      : options_(options), mount_(options.dir, options.forgetfs_binary), rng_(options.seed) {}
  ~Run() { lockd_.Stop(absl::Seconds(2)); }

  int Main() {
    if (absl::Status s = mount_.Mount(); !s.ok()) return Fail(s.ToString());
    if (absl::Status s = Init(); !s.ok()) return Fail(s.ToString());
    for (int round = 1; round <= options_.cuts; ++round) {
      round_ = round;
      if (absl::Status s = Round(); !s.ok()) return Fail(s.ToString());
      if (!violations_.empty()) break;
    }
    std::printf("%d power cuts (seed %lu): %ld grants and %ld releases acknowledged, %ld pool "
                "decisions acknowledged, %ld acknowledged locks, %ld pool leases and %ld "
                "sessions checked after restarts, %s, %d refusals to start; %zu violations\n",
                tally_.cuts, static_cast<unsigned long>(options_.seed),
                static_cast<long>(ack_.grants_), static_cast<long>(ack_.releases_),
                static_cast<long>(ack_.pool_decisions_), static_cast<long>(locks_checked_),
                static_cast<long>(leases_checked_), static_cast<long>(sessions_checked_),
                tally_.Describe().c_str(), refusals_, violations_.size());
    for (const std::string& v : violations_) std::printf("VIOLATION: %s\n", v.c_str());
    return violations_.empty() ? 0 : 1;
  }

 private:
  std::string State() const { return mount_.path() + "/state"; }
  // The Unix socket pools are served on (ADR 0004): outside the mount, which has no sockets.
  std::string Socket() const { return options_.dir + "/lockd.sock"; }

  int Fail(const std::string& why) {
    std::printf("round %d (seed %lu): %s\n", round_, static_cast<unsigned long>(options_.seed),
                why.c_str());
    return 1;
  }
  void Violation(const std::string& what) {
    std::lock_guard<std::mutex> l(violations_mu_);
    violations_.push_back(absl::StrCat("round ", round_, ": ", what));
  }

  std::vector<std::string> LockdArgs(std::vector<std::string> args) const {
    args.push_back("--data-dir=" + State());
    args.push_back(absl::StrCat("--wal-segment-bytes=", options_.wal_segment_bytes));
    return args;
  }

  absl::Status Init() {
    const std::string log = options_.dir + "/logs/lockd.log";
    auto init = process::Child::Spawn(options_.lockd_binary, LockdArgs({"init"}),
                                      {.stdout_file = log, .stderr_file = log});
    if (!init.ok()) return init.status();
    if (const int status = *init->Wait(); status != 0) {
      return absl::InternalError(absl::StrCat("lockd init ", process::DescribeStatus(status)));
    }
    // A fresh state issues tokens from the start again: nothing before it counts.
    ack_.sessions_.clear();
    ack_.closing_.clear();
    ack_.locks_.clear();
    ack_.pool_ = {};
    ack_.max_token_ = 0;
    floor_ = 0;
    return absl::OkStatus();
  }

  // lockd on what the last cut left; false (with the refusal checked) if it would not start.
  absl::StatusOr<bool> StartLockd() {
    const std::string port_file = options_.dir + "/lockd.port";
    std::filesystem::remove(port_file);
    std::filesystem::remove(Socket());
    const std::string log = absl::StrCat(options_.dir, "/logs/lockd-", round_, ".log");
    auto lockd = process::Child::Spawn(
        options_.lockd_binary,
        LockdArgs({"serve", "--port=0", "--port-file=" + port_file, "--metrics-port=-1",
                   "--unix-socket=" + Socket()}),
        {.stdout_file = log, .stderr_file = log});
    if (!lockd.ok()) return lockd.status();
    lockd_ = std::move(*lockd);
    auto port = process::AwaitPortFile(port_file, lockd_, absl::Seconds(30));
    if (port.ok()) {
      port_ = *port;
      return true;
    }
    const std::optional<int> status = lockd_.Wait(absl::Seconds(5));
    if (!status.has_value()) return port.status();
    // A refusal must name what it refuses: a file of the state directory.
    const std::string said = ReadFile(log);
    const std::string last = LastLine(said);
    ++refusals_;
    if (!absl::StrContains(said, State() + "/")) {
      Violation(absl::StrCat("lockd refused to start without naming a file of ", State(), ": ",
                             last));
    } else if (!options_.allow_refusals) {
      // Every cut here leaves what a disk may leave of a lockd that syncs what it should: a
      // correct lockd serves it. A refusal is a finding, unless asked to accept it.
      Violation(absl::StrCat("lockd refused to start after the cut: ", last));
    } else {
      std::printf("round %d: lockd refused to start: %s", round_, last.c_str());
    }
    return false;
  }

  absl::StatusOr<std::unique_ptr<BlockingConnection>> Connect(bool unix_socket = false) {
    return BlockingConnection::Connect(
        {.server = unix_socket ? "unix:" + Socket() : absl::StrCat("127.0.0.1:", port_),
         .timeout = absl::Seconds(10)});
  }

  // After a restart: what was acknowledged is there.
  absl::Status Check() {
    auto c = Connect();
    if (!c.ok()) return c.status();
    for (const auto& [session, secret] : ack_.sessions_) {
      auto r = (*c)->Call(req::Resume(session, secret));
      if (!r.ok()) return r.status();
      ++sessions_checked_;
      if (r->code() != wire::OK && ack_.closing_.count(session) == 0) {
        Violation(absl::StrCat("session ", session, ", whose open was acknowledged, does not "
                               "resume: ", wire::Code_Name(r->code()), " ", r->message()));
      }
    }
    std::map<std::string, wire::LockInfo> held;
    for (std::string after;;) {
      auto r = (*c)->Call(req::ListLocks({.start_after = after, .limit = 1000}));
      if (!r.ok()) return r.status();
      for (const wire::LockInfo& l : r->list().locks()) held[l.lock()] = l;
      if (!r->list().more() || r->list().locks().empty()) break;
      after = r->list().locks().rbegin()->lock();
    }
    for (const auto& [name, lock] : ack_.locks_) {
      if (lock.last_granted == 0) continue;
      ++locks_checked_;
      auto h = held.find(name);
      const bool let_go = lock.released.count(lock.last_granted) > 0 ||
                          ack_.closing_.count(lock.last_granted_session) > 0;
      if (h == held.end()) {
        if (!let_go) {
          Violation(absl::StrCat(name, ": its grant under token ", lock.last_granted,
                                 " was acknowledged and never released, and lockd restored it "
                                 "free"));
        }
        continue;
      }
      const uint64_t token = h->second.token();
      if (token < lock.last_granted) {
        Violation(absl::StrCat(name, ": restored under token ", token, ", below its last "
                               "acknowledged grant ", lock.last_granted));
      } else if (token > lock.last_granted && lock.unanswered == 0) {
        Violation(absl::StrCat(name, ": restored under token ", token,
                               ", which no acquire was sent for"));
      } else if (token > lock.last_granted && !let_go) {
        Violation(absl::StrCat(name, ": restored under token ", token, " although token ",
                               lock.last_granted, " was acknowledged and never released"));
      }
    }
    for (const auto& [name, lock] : held) {
      floor_ = std::max(floor_.load(), lock.token());
      if (ack_.locks_.count(name) == 0 || ack_.locks_[name].last_granted == 0) {
        if (ack_.locks_[name].unanswered == 0) {
          Violation(absl::StrCat(name, ": restored under token ", lock.token(),
                                 ", although no acquire of it was sent"));
        }
      }
    }
    // Every session ends: the next round starts from no locks held.
    for (const auto& [session, secret] : ack_.sessions_) {
      auto r = (*c)->Call(req::Close(session));
      if (!r.ok()) return r.status();
    }
    ack_.sessions_.clear();
    ack_.closing_.clear();
    ack_.locks_.clear();
    if (absl::Status s = CheckPool(); !s.ok()) return s;
    floor_ = std::max(floor_.load(), ack_.max_token_);
    return absl::OkStatus();
  }

  // The pool: what the manager was told is there; then a new manager releases every lease, so
  // that the next round starts with the budget free.
  absl::Status CheckPool() {
    auto c = Connect(/*unix_socket=*/true);
    if (!c.ok()) return c.status();
    auto r = (*c)->Call(req::PoolStatus(kPool));
    if (!r.ok()) return r.status();
    const Acknowledged::Pool& acked = ack_.pool_;
    if (r->code() == wire::NOT_FOUND) {
      if (acked.generation > 0) {
        Violation(absl::StrCat("pool ", kPool, ": its publish of generation ", acked.generation,
                               " was acknowledged, and lockd restored no such pool"));
      }
      pool_generation_ = 0;
      return absl::OkStatus();
    }
    if (r->code() != wire::OK) {
      return absl::InternalError(absl::StrCat("pool status: ", wire::Code_Name(r->code()), " ",
                                              r->message()));
    }
    const wire::PoolStatusReply& status = r->pool_status();
    if (status.generation() < acked.generation) {
      Violation(absl::StrCat("pool ", kPool, ": restored at generation ", status.generation(),
                             ", below its acknowledged publish of generation ",
                             acked.generation));
    }
    if (status.decision() < acked.decision) {
      Violation(absl::StrCat("pool ", kPool, ": restored at decision ", status.decision(),
                             ", below the acknowledged decision ", acked.decision));
    }
    for (const wire::PoolProfileInfo& p : status.profiles()) {
      if (p.id() == kProfile && p.owner_epoch() < acked.epoch) {
        Violation(absl::StrCat("pool ", kPool, ": profile ", kProfile, " restored at epoch ",
                               p.owner_epoch(), ", below its acknowledged claim at epoch ",
                               acked.epoch));
      }
    }
    std::map<std::string, const wire::PoolLeaseInfo*> leases;
    for (const wire::PoolLeaseInfo& l : status.leases()) {
      leases[l.slot()] = &l;
      floor_ = std::max(floor_.load(), l.token());
    }
    for (const auto& [slot, token] : acked.active) {
      ++leases_checked_;
      auto l = leases.find(slot);
      if (l == leases.end() || l->second->token() != token || !l->second->active()) {
        Violation(absl::StrCat(
            "pool ", kPool, ": the activation of slot ", slot, " under token ", token,
            " was acknowledged and its release never sent, and lockd restored ",
            l == leases.end() ? std::string("no lease of it")
                              : absl::StrCat(l->second->active() ? "an active" : "a provisional",
                                             " lease under token ", l->second->token())));
      }
    }
    pool_generation_ = status.generation();
    // A replacement manager reconciles: a new epoch, and every lease let go.
    auto claimed = (*c)->Call(req::PoolClaim(kPool, kProfile, status.generation()));
    if (!claimed.ok()) return claimed.status();
    if (claimed->code() != wire::OK) {
      return absl::InternalError(absl::StrCat("pool claim after the restart: ",
                                              wire::Code_Name(claimed->code()), " ",
                                              claimed->message()));
    }
    const wire::PoolOwnerRef owner = claimed->pool_claim().owner();
    ack_.pool_.epoch = owner.epoch();
    for (const wire::PoolLeaseInfo& l : status.leases()) {
      auto released = (*c)->Call(req::PoolRelease(kPool, l.profile(), l.slot(), l.token(), owner));
      if (!released.ok()) return released.status();
      if (released->code() != wire::OK) {
        return absl::InternalError(absl::StrCat("pool release of ", l.slot(), " after the restart: ",
                                                wire::Code_Name(released->code()), " ",
                                                released->message()));
      }
      ack_.PoolDecided(released->pool_lease().decision());
    }
    ack_.pool_.active.clear();
    return absl::OkStatus();
  }

  // One client: a session, locks taken without waiting and let go in a random order, now and
  // then its session closed and another opened.
  void Load(uint64_t seed, const std::atomic<bool>& stop) {
    std::mt19937_64 rng(seed);
    auto c = Connect();
    if (!c.ok()) return;
    uint64_t session = 0;
    std::map<std::string, uint64_t> mine;
    while (!stop) {
      if (session == 0) {
        auto r = (*c)->Call(req::OpenSession(kSessionTtl));
        if (!r.ok() || r->code() != wire::OK) return;
        session = r->open_session().session_id();
        ack_.Opened(session, r->open_session().secret());
        continue;
      }
      const uint64_t dice = rng() % 100;
      if (dice == 0) {
        ack_.CloseSent(session);
        auto r = (*c)->Call(req::Close(session));
        if (!r.ok()) return;
        session = 0;
        mine.clear();
      } else if (dice < 55 || mine.empty()) {
        const std::string name = absl::StrCat("lock/", rng() % kLockNames);
        if (mine.count(name) > 0) continue;
        ack_.AcquireSent(name);
        auto r = (*c)->Call(req::Acquire(session, name));
        if (!r.ok()) return;
        if (r->code() == wire::OK && r->acquire().granted()) {
          const uint64_t token = r->acquire().token();
          AboveFloor(name, token);
          ack_.Granted(name, session, token);
          mine[name] = token;
        }
        ack_.Answered(name);
      } else {
        auto it = std::next(mine.begin(), static_cast<long>(rng() % mine.size()));
        ack_.ReleaseSent(it->first, it->second);
        auto r = (*c)->Call(req::Release(session, it->first, it->second));
        if (!r.ok()) return;
        if (r->code() == wire::OK) ack_.Released();
        mine.erase(it);
      }
    }
  }

  void AboveFloor(const std::string& what, uint64_t token) {
    if (token <= floor_) {
      Violation(absl::StrCat(what, ": granted token ", token, " after the restart, not above ",
                             floor_.load(), ", the highest acknowledged before it"));
    }
  }

  // A refusal the load's well-formed requests should never get ends the manager's round, and
  // the run with it.
  bool Refused(const char* what, const absl::StatusOr<wire::Response>& r) {
    if (!r.ok()) return true;  // lockd is gone: the cut
    if (r->code() == wire::OK) return false;
    Violation(absl::StrCat("pool manager: ", what, " refused: ", wire::Code_Name(r->code()), " ",
                           r->message()));
    return true;
  }

  // The pool manager: publishes the policy (now and then a new generation), claims its profile
  // (a new epoch each round), and acquires, activates and releases leases on up to 6 of the 8
  // units.
  void PoolLoad(uint64_t seed, const std::atomic<bool>& stop) {
    std::mt19937_64 rng(seed);
    auto c = Connect(/*unix_socket=*/true);
    if (!c.ok()) return;
    wire::PoolProfile profile;
    profile.set_id(kProfile);
    profile.set_cost(1);
    wire::PoolOwnerRef owner;
    auto publish = [&]() {
      auto r = (*c)->Call(req::PoolPublish(kPool, pool_generation_ + 1, kPoolBudget, {profile}));
      if (Refused("publish", r)) return false;
      pool_generation_ = r->pool_publish().generation();
      std::lock_guard<std::mutex> l(ack_.mu_);
      ack_.pool_.generation = std::max(ack_.pool_.generation, pool_generation_);
      return true;
    };
    auto acknowledge = [&]() {
      return !Refused("ack", (*c)->Call(req::PoolAck(kPool, kProfile, owner, pool_generation_)));
    };
    if ((pool_generation_ == 0 || rng() % 4 == 0) && !publish()) return;
    auto claimed = (*c)->Call(req::PoolClaim(kPool, kProfile, pool_generation_));
    if (Refused("claim", claimed)) return;
    owner = claimed->pool_claim().owner();
    {
      std::lock_guard<std::mutex> l(ack_.mu_);
      ack_.pool_.epoch = std::max(ack_.pool_.epoch, owner.epoch());
    }
    if (!acknowledge()) return;
    std::map<std::string, uint64_t> provisional, active;
    while (!stop) {
      const uint64_t dice = rng() % 100;
      if (dice == 0) {
        // A new generation, which the manager enforces at once.
        if (!publish() || !acknowledge()) return;
      } else if (dice < 40 && provisional.size() + active.size() < 6) {
        const std::string slot = absl::StrCat("s", next_slot_++);
        auto r = (*c)->Call(req::PoolAcquire(kPool, kProfile, slot, owner));
        if (Refused("acquire", r)) return;
        if (!r->pool_acquire().granted()) continue;
        AboveFloor(absl::StrCat("pool ", kPool, " slot ", slot), r->pool_acquire().token());
        ack_.PoolLeaseGranted(r->pool_acquire().token(), r->pool_acquire().decision());
        provisional[slot] = r->pool_acquire().token();
      } else if (dice < 70 && !provisional.empty()) {
        auto it = std::next(provisional.begin(), static_cast<long>(rng() % provisional.size()));
        auto r = (*c)->Call(req::PoolActivate(kPool, kProfile, it->first, it->second, owner));
        if (Refused("activate", r)) return;
        ack_.PoolActivated(it->first, it->second, r->pool_lease().decision());
        active.insert(*it);
        provisional.erase(it);
      } else {
        std::map<std::string, uint64_t>& from = active.empty() ? provisional : active;
        if (from.empty()) continue;
        auto it = std::next(from.begin(), static_cast<long>(rng() % from.size()));
        ack_.PoolReleaseSent(it->first);
        auto r = (*c)->Call(req::PoolRelease(kPool, kProfile, it->first, it->second, owner));
        if (Refused("release", r)) return;
        ack_.PoolDecided(r->pool_lease().decision());
        from.erase(it);
      }
    }
  }

  absl::Status Round() {
    auto started = StartLockd();
    if (!started.ok()) return started.status();
    if (!*started) {
      // Refused, naming the damage: a fresh state, as an operator would restore from elsewhere.
      lockd_.Stop();
      std::filesystem::remove_all(State());
      return Init();
    }
    if (absl::Status s = Check(); !s.ok()) return s;
    // Load for 20 ms to 1.5 s, then the power goes; in half the rounds it goes at a write
    // drawn from the first 400 (a WAL append, a segment or snapshot being made), with that
    // write in flight.
    auto armed = mount_.MaybeArm(rng_);
    if (!armed.ok()) return armed.status();
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < kLoadThreads; ++i) {
      threads.emplace_back([this, i, &stop, seed = rng_()] { Load(seed + i, stop); });
    }
    threads.emplace_back([this, &stop, seed = rng_()] { PoolLoad(seed, stop); });
    const bool frozen = mount_.RunUntil(
        absl::Milliseconds(20 + static_cast<int64_t>(rng_() % 1480)), *armed, absl::Milliseconds(5));
    // The cut goes before lockd is reaped: a thread of lockd's caught in a write that the
    // freeze holds cannot die until that write returns, which the cut makes it do (with EIO);
    // the cut itself waits for lockd's files to close.
    lockd_.Signal(SIGKILL);
    stop = true;
    const absl::Status cut = mount_.Cut(rng_, frozen, tally_);
    lockd_.Wait();
    for (std::thread& t : threads) t.join();  // their connections closed with lockd
    return cut;
  }

  const RunOptions options_;
  PoweredMount mount_;
  std::mt19937_64 rng_;
  process::Child lockd_;
  int port_ = 0;
  int round_ = 0;
  Acknowledged ack_;
  std::atomic<uint64_t> floor_{0};  // tokens granted from now on must be above it
  uint64_t pool_generation_ = 0;    // the pool's current generation (0: not published)
  uint64_t next_slot_ = 1;
  std::mutex violations_mu_;
  std::vector<std::string> violations_;  // guarded by violations_mu_ while the load runs
  int64_t locks_checked_ = 0, leases_checked_ = 0, sessions_checked_ = 0;
  CutTally tally_;
  int refusals_ = 0;
};

}  // namespace

int RunLockdCuts(const RunOptions& options) { return Run(options).Main(); }

}  // namespace fencelock::powercut
