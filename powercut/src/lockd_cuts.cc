// fencelock-powercut: lockd under load on a file system that forgets what was never synced
// (fencelock-forgetfs), with the power cut again and again (issue 38, docs/durability.md).
//
//   fencelock-powercut lockd --cuts=50 --seed=1
//
// Each round starts lockd on what the last cut left, checks it against what lockd had
// acknowledged before the cut, and puts load on it (sessions opened and closed, locks acquired
// and released, segments rolled and snapshots taken by a small --wal-segment-bytes) for a
// random time; then lockd is killed (SIGKILL) and the power cut: the unsynced writes are
// dropped, kept in part and out of order, or the newest torn at a sector or page boundary. The
// checks, after each restart:
//   - every session whose open was acknowledged, and whose close was not sent, resumes;
//   - every lock whose grant was acknowledged, and whose release (or its session's close) was
//     not sent, is held under that token; no lock is held under a token below the last
//     acknowledged grant of it, or under a token nobody was granted or sent an acquire for;
//   - every token granted after the restart is above every token acknowledged before.
// A lockd that refuses to start fails the run (a correct lockd serves whatever a cut leaves of
// what it synced); with --allow-refusals the refusal must name a file of the state directory,
// and the run goes on from a fresh state. Exits 0 when every check held, 1 otherwise, 2 on bad
// arguments.
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "fencelock/wire.pb.h"
#include "lock-server/blocking_connection.h"
#include "powercut/control.h"
#include "process/flags.h"
#include "process/process.h"
#include "protocol/requests.h"

ABSL_FLAG(int, cuts, 50, "power cuts in the run (1 to 100000)");
ABSL_FLAG(uint64_t, seed, 0, "the run's seed; 0 draws one from the clock (printed)");
ABSL_FLAG(std::string, dir, "", "where the run goes; default: a fresh folder under $TMPDIR");
ABSL_FLAG(bool, keep, false, "keep the run's folder after a green run (a failed one is kept)");
ABSL_FLAG(std::string, lockd_binary, LOCKD_BINARY, "the lockd executable");
ABSL_FLAG(std::string, forgetfs_binary, FORGETFS_BINARY, "the fencelock-forgetfs executable");
ABSL_FLAG(bool, allow_refusals, false,
          "count a lockd that refuses to start (naming the damaged file) as a pass, and go on from "
          "a fresh state; by default a refusal fails the run");
ABSL_FLAG(uint64_t, wal_segment_bytes, 64 << 10,
          "lockd --wal-segment-bytes: small, so that segments roll and snapshots follow often");

namespace fencelock::powercut {
namespace {

namespace req = protocol::request;
using server::BlockingConnection;

constexpr absl::Duration kSessionTtl = absl::Seconds(60);  // nothing expires within a round
constexpr int kLoadThreads = 4;
constexpr int kLockNames = 64;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// What the clients were told, and what they sent, since the last check.
class Acknowledged {
 public:
  struct Lock {
    uint64_t last_granted = 0;        // the highest acknowledged grant
    uint64_t last_granted_session = 0;
    std::set<uint64_t> released;      // tokens whose Release was sent
    int unanswered = 0;  // Acquires sent and not answered (at the cut: lost with lockd)
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

  std::map<uint64_t, std::string> sessions_;
  std::set<uint64_t> closing_;
  std::map<std::string, Lock> locks_;
  int64_t grants_ = 0, releases_ = 0;
  uint64_t max_token_ = 0;  // over the whole run
  std::mutex mu_;
};

class Run {
 public:
  Run(std::string dir, uint64_t seed) : dir_(std::move(dir)), rng_(seed), seed_(seed) {}
  ~Run() {
    lockd_.Stop(absl::Seconds(2));
    if (fs_.running()) {
      umount2(Mount().c_str(), MNT_DETACH);
      fs_.Stop(absl::Seconds(5));
    }
  }

  int Main(int cuts) {
    if (absl::Status s = MountFs(); !s.ok()) return Fail(s.ToString());
    if (absl::Status s = Init(); !s.ok()) return Fail(s.ToString());
    for (int round = 1; round <= cuts; ++round) {
      round_ = round;
      if (absl::Status s = Round(); !s.ok()) return Fail(s.ToString());
      if (!violations_.empty()) break;
    }
    std::printf("%d power cuts (seed %lu): %ld grants and %ld releases acknowledged, %ld "
                "acknowledged locks and %ld sessions checked after restarts, %ld unsynced writes "
                "at the cuts (%ld pieces kept, %ld dropped; %d cuts with a write in flight), "
                "%ld names lost, %d refusals to start; %zu violations\n",
                round_, static_cast<unsigned long>(seed_), static_cast<long>(ack_.grants_),
                static_cast<long>(ack_.releases_), static_cast<long>(locks_checked_),
                static_cast<long>(sessions_checked_), static_cast<long>(unsynced_),
                static_cast<long>(kept_), static_cast<long>(dropped_), in_flight_,
                static_cast<long>(names_lost_), refusals_, violations_.size());
    for (const std::string& v : violations_) std::printf("VIOLATION: %s\n", v.c_str());
    return violations_.empty() ? 0 : 1;
  }

 private:
  std::string Mount() const { return dir_ + "/mnt"; }
  std::string State() const { return Mount() + "/state"; }

  int Fail(const std::string& why) {
    std::printf("round %d (seed %lu): %s\n", round_, static_cast<unsigned long>(seed_), why.c_str());
    return 1;
  }
  void Violation(const std::string& what) {
    std::lock_guard<std::mutex> l(violations_mu_);
    violations_.push_back(absl::StrCat("round ", round_, ": ", what));
  }

  absl::Status MountFs() {
    std::filesystem::create_directories(Mount());
    std::filesystem::create_directories(dir_ + "/logs");
    auto fs = process::Child::Spawn(
        absl::GetFlag(FLAGS_forgetfs_binary),
        {"--store=" + dir_ + "/store", "--control=" + dir_ + "/control", Mount()},
        {.stdout_file = dir_ + "/logs/forgetfs.log", .stderr_file = dir_ + "/logs/forgetfs.log"});
    if (!fs.ok()) return fs.status();
    fs_ = std::move(*fs);
    for (int i = 0; i < 500; ++i) {
      if (Read("/proc/self/mounts").find(" " + Mount() + " fuse.forgetfs ") != std::string::npos &&
          Control(dir_ + "/control", "stats").ok()) {
        return absl::OkStatus();
      }
      if (fs_.Wait(absl::ZeroDuration()).has_value()) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::UnavailableError(absl::StrCat("forgetfs did not mount on ", Mount(), "; see ",
                                               dir_, "/logs/forgetfs.log"));
  }

  absl::Status Init() {
    auto init = process::Child::Spawn(
        absl::GetFlag(FLAGS_lockd_binary),
        {"init", "--data-dir=" + State(),
         absl::StrCat("--wal-segment-bytes=", absl::GetFlag(FLAGS_wal_segment_bytes))},
        {.stdout_file = dir_ + "/logs/lockd.log", .stderr_file = dir_ + "/logs/lockd.log"});
    if (!init.ok()) return init.status();
    if (const int status = *init->Wait(); status != 0) {
      return absl::InternalError(absl::StrCat("lockd init ", process::DescribeStatus(status)));
    }
    // A fresh state issues tokens from the start again: nothing before it counts.
    ack_.sessions_.clear();
    ack_.closing_.clear();
    ack_.locks_.clear();
    ack_.max_token_ = 0;
    floor_ = 0;
    return absl::OkStatus();
  }

  // lockd on what the last cut left; false (with the refusal checked) if it would not start.
  absl::StatusOr<bool> StartLockd() {
    const std::string port_file = dir_ + "/lockd.port";
    std::filesystem::remove(port_file);
    const std::string log = absl::StrCat(dir_, "/logs/lockd-", round_, ".log");
    auto lockd = process::Child::Spawn(
        absl::GetFlag(FLAGS_lockd_binary),
        {"serve", "--data-dir=" + State(), "--port=0", "--port-file=" + port_file,
         "--metrics-port=-1",
         absl::StrCat("--wal-segment-bytes=", absl::GetFlag(FLAGS_wal_segment_bytes))},
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
    const std::string said = Read(log);
    const std::string last = said.substr(said.rfind('\n', said.size() - 2) + 1);
    ++refusals_;
    if (!absl::StrContains(said, State() + "/")) {
      Violation(absl::StrCat("lockd refused to start without naming a file of ", State(), ": ",
                             last));
    } else if (!absl::GetFlag(FLAGS_allow_refusals)) {
      // Every cut here leaves what a disk may leave of a lockd that syncs what it should: a
      // correct lockd serves it. A refusal is a finding, unless asked to accept it.
      Violation(absl::StrCat("lockd refused to start after the cut: ", last));
    } else {
      std::printf("round %d: lockd refused to start: %s", round_, last.c_str());
    }
    return false;
  }

  absl::StatusOr<std::unique_ptr<BlockingConnection>> Connect() {
    return BlockingConnection::Connect(
        {.server = absl::StrCat("127.0.0.1:", port_), .timeout = absl::Seconds(10)});
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
    floor_ = std::max(floor_.load(), ack_.max_token_);
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
          if (token <= floor_) {
            Violation(absl::StrCat(name, ": granted token ", token, " after the restart, not above ",
                                   floor_.load(), ", the highest acknowledged before it"));
          }
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

  absl::Status Round() {
    auto started = StartLockd();
    if (!started.ok()) return started.status();
    if (!*started) {
      // Refused, naming the damage: a fresh state, as an operator would restore from elsewhere.
      lockd_.Stop();
      std::filesystem::remove_all(State());
      if (absl::Status s = Init(); !s.ok()) return s;
      return absl::OkStatus();
    }
    if (absl::Status s = Check(); !s.ok()) return s;
    // Load for 20 ms to 1.5 s, then the power goes; in half the rounds it goes at a write
    // drawn from the first 400 (a WAL append, a segment or snapshot being made), with that
    // write in flight.
    const bool armed = rng_() % 2 == 0;
    if (armed) {
      if (auto a = Control(dir_ + "/control", absl::StrCat("arm ", 1 + rng_() % 400)); !a.ok()) {
        return a.status();
      }
    }
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < kLoadThreads; ++i) {
      threads.emplace_back([this, i, &stop, seed = rng_()] { Load(seed + i, stop); });
    }
    const absl::Time until =
        absl::Now() + absl::Milliseconds(20 + static_cast<int64_t>(rng_() % 1480));
    while (absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(5));
      if (!armed) continue;
      auto stats = Control(dir_ + "/control", "stats");
      if (stats.ok() && absl::StrContains(*stats, "frozen=1")) {
        ++in_flight_;
        break;
      }
    }
    // The cut goes before lockd is reaped: a thread of lockd's caught in a write that the
    // freeze holds cannot die until that write returns, which the cut makes it do (with EIO);
    // the cut itself waits for lockd's files to close.
    lockd_.Signal(SIGKILL);
    stop = true;
    static const char* const kModes[] = {"drop", "keep-some", "tear-sector", "tear-page"};
    const std::string mode = kModes[rng_() % 4];
    auto cut = Control(dir_ + "/control", absl::StrCat("cut ", mode, " seed=", rng_()));
    lockd_.Wait();
    for (std::thread& t : threads) t.join();  // their connections closed with lockd
    if (!cut.ok()) return cut.status();
    // "N files written back, U unsynced writes and truncations, K pieces of them kept, D
    // dropped; L names ..."
    long files = 0, unsynced = 0, kept = 0, dropped = 0, lost = 0;
    if (std::sscanf(cut->c_str(),
                    "%ld files written back, %ld unsynced writes and truncations, %ld pieces of "
                    "them kept, %ld dropped; %ld names",
                    &files, &unsynced, &kept, &dropped, &lost) == 5) {
      unsynced_ += unsynced;
      kept_ += kept;
      dropped_ += dropped;
      names_lost_ += lost;
    }
    return absl::OkStatus();
  }

  const std::string dir_;
  std::mt19937_64 rng_;
  const uint64_t seed_;
  process::Child fs_, lockd_;
  int port_ = 0;
  int round_ = 0;
  Acknowledged ack_;
  std::atomic<uint64_t> floor_{0};  // tokens granted from now on must be above it
  std::mutex violations_mu_;
  std::vector<std::string> violations_;  // guarded by violations_mu_ while the load runs
  int64_t locks_checked_ = 0, sessions_checked_ = 0, unsynced_ = 0, kept_ = 0, dropped_ = 0,
          names_lost_ = 0;
  int refusals_ = 0;
  int in_flight_ = 0;  // cuts that came with a write in flight (armed)
};

int Main(const std::vector<std::string>& args) {
  const int cuts = absl::GetFlag(FLAGS_cuts);
  if (args.size() != 1 || args[0] != "lockd") {
    std::fprintf(stderr, "usage: fencelock-powercut lockd [--cuts=N] [--seed=S] [--dir=D]\n");
    return 2;
  }
  if (cuts < 1 || cuts > 100000) {
    std::fprintf(stderr, "fencelock-powercut: --cuts must be 1 to 100000, got %d\n", cuts);
    return 2;
  }
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) % 1000000 + 1;
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/fencelock-powercut-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) {
      std::fprintf(stderr, "fencelock-powercut: cannot make %s\n", dir.c_str());
      return 1;
    }
  }
  std::printf("fencelock-powercut lockd --cuts=%d --seed=%lu --dir=%s\n", cuts,
              static_cast<unsigned long>(seed), dir.c_str());
  std::fflush(stdout);
  int status;
  {
    Run run(dir, seed);
    status = run.Main(cuts);
  }
  if (status == 0 && !absl::GetFlag(FLAGS_keep)) {
    std::filesystem::remove_all(dir);
  } else {
    std::printf("kept: %s\n", dir.c_str());
  }
  return status;
}

}  // namespace
}  // namespace fencelock::powercut

int main(int argc, char** argv) {
  std::vector<std::string> args = fencelock::process::ParseFlags(argc, argv);
  args.erase(args.begin());
  signal(SIGPIPE, SIG_IGN);
  return fencelock::powercut::Main(args);
}
