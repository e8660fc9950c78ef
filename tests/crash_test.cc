// lockd killed with SIGKILL at random moments under load from several client processes, then
// restarted from its state directory, many times over. After every restart:
//   - every token issued is greater than every token any client saw before the crash;
//   - every grant a client saw acknowledged, and did not start to release, is still held with
//     the same token.
// FENCELOCK_CRASH_CYCLES sets the number of kills (default 50; the `stress` variant runs 1000);
// FENCELOCK_CRASH_SEED re-runs a given seed.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "fencelock/wire.pb.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using testing::LockdProcess;
using testing::RawConnection;
using testing::TempDir;

constexpr int kClients = 4;

process::Child SpawnClient(const std::vector<std::string>& args) {
  auto child = process::Child::Spawn(CRASH_LOAD_CLIENT_BINARY, args);
  if (!child.ok()) {
    ADD_FAILURE() << child.status();
    return process::Child();
  }
  return std::move(*child);
}

void WaitOrKill(process::Child& client) {
  if (!client.Wait(absl::Seconds(30)).has_value()) {
    ADD_FAILURE() << "load client " << client.pid() << " did not exit after lockd died";
    client.Signal(SIGKILL);
    client.Wait();
  }
}

struct Event {
  char kind;
  std::string lock;
  uint64_t token;
};

std::vector<Event> ReadLog(const std::string& path) {
  std::vector<Event> events;
  std::ifstream in(path);
  Event e;
  while (in >> e.kind >> e.lock >> e.token) events.push_back(e);
  return events;
}

// Every held lock whose name starts with `prefix`, page by page.
std::map<std::string, uint64_t> HeldLocks(int port, const std::string& prefix) {
  RawConnection admin = RawConnection::Tcp(port);
  admin.Hello();
  std::map<std::string, uint64_t> held;
  std::string after;
  for (;;) {
    const wire::Response reply =
        admin.Call(testing::request::ListLocks({.prefix = prefix, .start_after = after}));
    EXPECT_EQ(reply.code(), wire::OK) << reply.message();
    for (const auto& l : reply.list().locks()) held[l.lock()] = l.token();
    if (!reply.list().more() || reply.list().locks().empty()) return held;
    after = reply.list().locks().rbegin()->lock();
  }
}

TEST(CrashTest, KilledAndRestartedLockdNeverReissuesATokenNorLosesAGrant) {
  const char* cycles_env = std::getenv("FENCELOCK_CRASH_CYCLES");
  const int cycles = cycles_env != nullptr ? std::atoi(cycles_env) : 50;
  const char* seed_env = std::getenv("FENCELOCK_CRASH_SEED");
  const unsigned seed = seed_env != nullptr ? static_cast<unsigned>(std::atoi(seed_env)) : 20261129;
  std::printf("crash test: %d cycles, seed=%u (FENCELOCK_CRASH_SEED re-runs it)\n", cycles, seed);
  std::mt19937 rng(seed);

  TempDir tmp;
  // Small segments so that the run also crosses rotations and snapshots.
  LockdProcess lockd(LockdProcess::Options{.segment_bytes = 64 * 1024});
  uint64_t max_seen = 0;
  std::set<uint64_t> all_tokens;
  uint64_t grants = 0, checked_held = 0;

  for (int cycle = 0; cycle < cycles; ++cycle) {
    std::vector<process::Child> clients;
    std::vector<std::string> logs;
    for (int c = 0; c < kClients; ++c) {
      logs.push_back(absl::StrCat(tmp.path(), "/cycle", cycle, "-client", c, ".log"));
      clients.push_back(SpawnClient({"--server=" + lockd.tcp_address(), "--log=" + logs.back(),
                                     absl::StrCat("--prefix=c", cycle, "-client", c),
                                     absl::StrCat("--shared_prefix=c", cycle, "-shared"),
                                     absl::StrCat("--seed=", rng())}));
    }
    // Kill while the load runs: once every client has logged its first grant (a sanitized
    // client takes a few hundred milliseconds to start), then at a random moment.
    const auto started_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < started_by &&
           !std::all_of(logs.begin(), logs.end(), [](const std::string& log) {
             std::error_code ec;
             return std::filesystem::file_size(log, ec) > 0 && !ec;
           })) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 180));
    lockd.Kill();
    for (process::Child& client : clients) WaitOrKill(client);

    std::map<std::pair<std::string, uint64_t>, bool> outstanding;  // grant -> release started
    uint64_t cycle_min = UINT64_MAX, cycle_max = 0;
    for (const std::string& log : logs) {
      for (const Event& e : ReadLog(log)) {
        if (e.kind == 'G') {
          ++grants;
          ASSERT_TRUE(all_tokens.insert(e.token).second)
              << "cycle " << cycle << ": token " << e.token << " issued twice";
          outstanding[{e.lock, e.token}] = false;
          cycle_min = std::min(cycle_min, e.token);
          cycle_max = std::max(cycle_max, e.token);
        } else {
          outstanding[{e.lock, e.token}] = true;
        }
      }
    }
    if (cycle_min != UINT64_MAX) {
      ASSERT_GT(cycle_min, max_seen) << "cycle " << cycle << " (seed " << seed
                                     << "): a token at or below one seen before the crash";
    }
    max_seen = std::max(max_seen, cycle_max);

    lockd.Restart();
    const auto held = HeldLocks(lockd.port(), absl::StrCat("c", cycle, "-"));
    for (const auto& [grant, release_started] : outstanding) {
      if (release_started) continue;
      auto it = held.find(grant.first);
      ASSERT_TRUE(it != held.end()) << "cycle " << cycle << " (seed " << seed
                                    << "): acknowledged grant of " << grant.first << " token "
                                    << grant.second << " lost in the crash";
      ASSERT_EQ(it->second, grant.second) << grant.first;
      ++checked_held;
    }
  }
  // One more grant after the last restart is still above everything seen.
  ClientOptions options;
  options.server = lockd.tcp_address();
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto last = (*client)->acquire("after-the-last-crash", absl::Seconds(5));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_GT(last->token(), max_seen);
  std::printf("crash test: %d kills, %lu grants seen, %lu acknowledged holders checked after "
              "restarts, highest token %lu\n",
              cycles, static_cast<unsigned long>(grants), static_cast<unsigned long>(checked_held),
              static_cast<unsigned long>(last->token()));
  EXPECT_GT(grants, static_cast<uint64_t>(cycles));  // the load was real
}

}  // namespace
}  // namespace fencelock
