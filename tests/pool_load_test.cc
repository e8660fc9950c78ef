// ADR-0003's "concurrent acquisition never exceeds a synthetic budget", from many real
// connections at once: 8 threads, each with its own PoolClient, and 2 shell loops of lockctl
// (other processes) run 2,000 acquire, activate and release cycles in all on one pool, while
// lockd is killed with SIGKILL and started again 5 times.
//
// Every participant keeps one ledger, a file under flock(2): it adds a lease's units once the
// activation is confirmed and takes them away before it sends the release, so the ledger never
// counts more than lockd really holds. A lockd that granted units it had already given (a lease
// forgotten in a crash, a budget check gone wrong) would push the ledger over the budget; every
// change checks it. Answers lost in a crash are settled the way a manager settles them: a grant
// whose answer was lost is found again ("already leased (token N)"), a repeated activation or
// release is answered as the first was, and a provisional lease left behind expires.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lock-client/pool_client.h"
#include "lockd_process.h"
#include "process/process.h"

namespace fencelock {
namespace {

using testing::LockdProcess;

constexpr uint64_t kBudget = 8;
constexpr int kThreads = 8;
constexpr int kThreadCycles = 240;  // 1,920
constexpr int kLoops = 2;
constexpr int kLoopCycles = 40;     // 80: 2,000 in all
constexpr int kKills = 5;

// The shared ledger: "<units held> <most held>" in `path`, changed under flock on path.lock.
class Ledger {
 public:
  explicit Ledger(std::string path) : path_(std::move(path)) {
    std::ofstream(path_) << "0 0\n";
  }
  // Adds `units` (negative: takes away); whether the sum stays within the budget.
  bool Add(int64_t units) const {
    const int fd = ::open((path_ + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) return false;
    int64_t held = 0, most = 0;
    {
      std::ifstream in(path_);
      in >> held >> most;
    }
    held += units;
    most = std::max(most, held);
    std::ofstream(path_) << held << " " << most << "\n";
    ::close(fd);  // lets go of the lock
    return held >= 0 && held <= static_cast<int64_t>(kBudget);
  }
  std::pair<int64_t, int64_t> Read() const {
    int64_t held = -1, most = -1;
    std::ifstream(path_) >> held >> most;
    return {held, most};
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool Unreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

// The token in "slot p/a/x is already leased (token N, provisional)", or 0.
uint64_t LeasedToken(absl::string_view message) {
  const size_t at = message.find("(token ");
  if (at == absl::string_view::npos) return 0;
  absl::string_view rest = message.substr(at + 7);
  uint64_t token = 0;
  return absl::SimpleAtoi(rest.substr(0, rest.find(',')), &token) ? token : 0;
}

// What the crashes did to the threads' cycles.
struct Stats {
  std::atomic<int> unreachable{0};  // times a thread found lockd gone
  std::atomic<int> found_again{0};  // grants whose answer was lost, found by the retry
  std::atomic<int> expired{0};      // provisional leases gone before their activation
};

// One thread's cycles; returns what went wrong, or "".
std::string Cycles(const std::string& server, const std::string& profile, uint64_t cost,
                   const PoolOwnerId& owner, int thread, const Ledger& ledger,
                   std::atomic<int>* done, Stats& stats) {
  auto made = PoolClient::Create({.server = server, .timeout = absl::Seconds(5)});
  if (!made.ok()) return made.status().ToString();
  PoolClient& c = **made;
  // lockd is down for a restart at a time (well under a second); a minute means it is gone.
  absl::Time unreachable_since = absl::InfiniteFuture();
  const auto pause = [&](const absl::Status& s) {
    if (!Unreachable(s)) {
      unreachable_since = absl::InfiniteFuture();
    } else if (unreachable_since == absl::InfiniteFuture()) {
      unreachable_since = absl::Now();
      ++stats.unreachable;
    }
    absl::SleepFor(absl::Milliseconds(10));
    return absl::Now() - unreachable_since < absl::Minutes(1);
  };
  int attempt = 0;
  for (int cycle = 0; cycle < kThreadCycles;) {
    const std::string slot = absl::StrCat("t", thread, "-", attempt++);
    uint64_t token = 0;
    while (token == 0) {
      auto g = c.acquire("p", profile, slot, owner, absl::ZeroDuration());
      if (g.ok() && g->granted) {
        token = g->token;
      } else if (g.ok() || Unreachable(g.status())) {
        if (!pause(g.status())) return absl::StrCat(slot, " acquire: ", g.status().ToString());
      } else if (absl::IsFailedPrecondition(g.status()) &&
                 LeasedToken(g.status().message()) != 0) {
        token = LeasedToken(g.status().message());  // granted, but the answer was lost
        ++stats.found_again;
      } else {
        return absl::StrCat(slot, " acquire: ", g.status().ToString());
      }
    }
    bool active = false;
    for (;;) {
      auto d = c.activate("p", profile, slot, token, owner);
      if (d.ok()) {
        active = true;
        break;
      }
      if (absl::IsNotFound(d.status())) {  // it expired while lockd was down: next slot
        ++stats.expired;
        break;
      }
      if (!Unreachable(d.status()) || !pause(d.status())) {
        return absl::StrCat(slot, " activate: ", d.status().ToString());
      }
    }
    if (!active) continue;
    if (!ledger.Add(static_cast<int64_t>(cost))) {
      return absl::StrCat("over the budget after ", slot, " token ", token, " was activated");
    }
    if (!ledger.Add(-static_cast<int64_t>(cost))) return "the ledger went wrong";
    for (;;) {
      auto r = c.release("p", profile, slot, token, owner);
      if (r.ok() || absl::IsNotFound(r.status())) break;  // NotFound: a lost answer's repeat
      if (!Unreachable(r.status()) || !pause(r.status())) {
        return absl::StrCat(slot, " release: ", r.status().ToString());
      }
    }
    ++cycle;
    ++*done;
  }
  return "";
}

// One lockctl loop, as a shell manager would write it; exits non-zero on anything unexpected.
constexpr char kLoop[] = R"sh(
lockctl="$1"; server="$2"; owner="$3"; id="$4"; cycles="$5"; ledger="$6"; budget="$7"
pool() { "$lockctl" --server="$server" pool "$@"; }
add() {
  flock "$ledger.lock" sh -c 'read h m < "$0"; h=$((h + $1)); [ $h -gt $m ] && m=$h;
    echo "$h $m" > "$0"; [ $h -ge 0 ] && [ $h -le $2 ]' "$ledger" "$1" "$budget"
}
done_cycles=0; attempt=0
while [ $done_cycles -lt "$cycles" ]; do
  slot="$id-$attempt"; attempt=$((attempt + 1)); token=""
  while [ -z "$token" ]; do
    rc=0; out="$(pool acquire --pool=p --profile=e --slot="$slot" --owner="$owner" 2>"$ledger.$id.err")" || rc=$?
    case $rc in
      0) token="$out" ;;
      1|3) sleep 0.01 ;;
      5) token="$(sed -n 's/.*(token \([0-9]*\),.*/\1/p' "$ledger.$id.err")"
         [ -n "$token" ] || { cat "$ledger.$id.err" >&2; exit 1; } ;;
      *) cat "$ledger.$id.err" >&2; exit 1 ;;
    esac
  done
  active=no
  while :; do
    rc=0; pool activate --pool=p --profile=e --slot="$slot" --token="$token" --owner="$owner" >/dev/null 2>"$ledger.$id.err" || rc=$?
    case $rc in
      0) active=yes; break ;;
      4) break ;;
      1) sleep 0.01 ;;
      *) cat "$ledger.$id.err" >&2; exit 1 ;;
    esac
  done
  [ $active = yes ] || continue
  add 1 || { echo "over the budget after $slot token $token was activated" >&2; exit 3; }
  add -1 || exit 3
  while :; do
    rc=0; pool release --pool=p --profile=e --slot="$slot" --token="$token" --owner="$owner" >/dev/null 2>"$ledger.$id.err" || rc=$?
    case $rc in
      0|4) break ;;
      1) sleep 0.01 ;;
      *) cat "$ledger.$id.err" >&2; exit 1 ;;
    esac
  done
  done_cycles=$((done_cycles + 1))
done
)sh";

TEST(PoolLoadTest, ThreadsAndLockctlLoopsNeverExceedTheBudgetWhileLockdIsKilled) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true,
                                           .extra_args = {"--pool-provisional-ttl=1s"}});
  const std::string server = lockd.unix_address();
  auto op = PoolClient::Create({.server = server});
  ASSERT_TRUE(op.ok()) << op.status();
  const std::vector<PoolProfileDef> profiles = {
      {.id = "a", .cost = 2, .reserved = 2},
      {.id = "b", .cost = 1, .reserved = 2, .lendable = true},
      {.id = "c", .cost = 1, .borrow = true},
      {.id = "d", .cost = 1},
      {.id = "e", .cost = 1, .reserved = 1},
  };
  ASSERT_TRUE((*op)->publish("p", 1, kBudget, profiles).ok());
  std::map<std::string, PoolOwnerId> owners;
  for (const PoolProfileDef& p : profiles) {
    auto o = (*op)->claim("p", p.id, 1);
    ASSERT_TRUE(o.ok()) << o.status();
    ASSERT_TRUE((*op)->ack("p", p.id, *o, 1).ok());
    owners[p.id] = *o;
  }
  testing::TempDir tmp;
  const Ledger ledger(tmp.path() + "/ledger");

  std::vector<process::Child> loops;
  for (int i = 0; i < kLoops; ++i) {
    auto loop = process::Child::Spawn(
        "/bin/sh", {"-c", kLoop, "loop", LOCKCTL_BINARY, server, owners["e"].ToString(),
                    absl::StrCat("l", i), std::to_string(kLoopCycles), ledger.path(),
                    std::to_string(kBudget)});
    ASSERT_TRUE(loop.ok()) << loop.status();
    loops.push_back(std::move(*loop));
  }
  std::atomic<int> done{0};
  std::atomic<int> finished{0};
  Stats stats;
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    const PoolProfileDef& p = profiles[t / 2];
    const PoolOwnerId owner = owners[p.id];
    threads.emplace_back([&, t, p, owner] {
      failures[t] = Cycles(server, p.id, p.cost, owner, t, ledger, &done, stats);
      ++finished;
    });
  }
  // Kills spread over the threads' progress.
  const int total = kThreads * kThreadCycles;
  for (int k = 1; k <= kKills; ++k) {
    const int at = total * k / (kKills + 1);
    while (done.load() < at && finished.load() < kThreads) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    lockd.Kill();
    lockd.Restart();
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  for (process::Child& loop : loops) {
    auto status = loop.Wait(absl::Minutes(5));
    ASSERT_TRUE(status.has_value()) << "a lockctl loop did not finish";
    EXPECT_EQ(*status, 0) << "a lockctl loop failed";
  }
  const auto [held, most] = ledger.Read();
  EXPECT_EQ(held, 0);
  EXPECT_LE(most, static_cast<int64_t>(kBudget));
  EXPECT_GE(most, 2) << "the cycles never overlapped: the test would not catch an over-grant";
  // Every active lease was released; provisional ones whose grant was lost expire within 1 s.
  absl::SleepFor(absl::Milliseconds(1500));
  auto view = (*op)->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->used_units, 0u);
  std::printf("pool_load_test: %d thread cycles and %d lockctl cycles, %d lockd kills (lockd "
              "found gone %d times, %d grants found again after a lost answer, %d provisional "
              "leases expired before activation); at most %lld of %llu units held at once by "
              "the ledger; %llu decisions\n",
              done.load(), kLoops * kLoopCycles, kKills, stats.unreachable.load(),
              stats.found_again.load(), stats.expired.load(), static_cast<long long>(most),
              static_cast<unsigned long long>(kBudget),
              static_cast<unsigned long long>(view->decision));
}

}  // namespace
}  // namespace fencelock
