// `lockctl pool run --pool=P --profile=A --slot=S [--owner=O] [--ttl=D] -- CMD [ARGS...]`: a
// shell manager's whole admission of one worker (seed ADR-0003's lease lifecycle). It acquires
// a provisional lease for the slot, asking again every 2 s while there are no units (each ask
// refreshes the profile's demand, seed ADR-0006), activates it, and only then starts CMD; once
// CMD exits it releases the exact lease and exits with CMD's status (128 + N for a signal N).
// SIGINT, SIGTERM and SIGHUP go to CMD while it runs; before it starts they end the wait, and a
// lease already granted is released. A lease it cannot release (lockd unreachable for 30 s) is
// named on stderr, exit 1, for a replacement manager or an operator to settle.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "lockctl_pool.h"
#include "logging/logging.h"
#include "protocol/defaults.h"

ABSL_DECLARE_FLAG(std::string, pool);
ABSL_DECLARE_FLAG(std::string, profile);
ABSL_DECLARE_FLAG(std::string, slot);
ABSL_DECLARE_FLAG(std::string, owner);
ABSL_DECLARE_FLAG(absl::Duration, ttl);

namespace fencelock {
namespace {

std::atomic<int> g_signal{0};  // the last SIGINT, SIGTERM or SIGHUP received
std::atomic<pid_t> g_child{0};

void OnSignal(int sig) {
  g_signal.store(sig);
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, sig);
}

// Deadlines here are on the monotonic clock: a wall clock stepped an hour back must not make
// a 2 s wait an hour long.
std::chrono::steady_clock::time_point After(absl::Duration d) {
  return std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(d);
}

// Sleeps `d`, or less if a signal arrives.
void Wait(absl::Duration d) {
  const auto until = After(d);
  while (g_signal.load() == 0 && std::chrono::steady_clock::now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
}

int Fail(const absl::Status& s) {
  const LockctlCode c = LockctlCodeOf(s);
  logging::Program().Error(absl::StrFormat("%s: %s", c.name, std::string(s.message()).c_str()));
  return c.exit;
}

// Releases the exact lease, trying for 30 s while lockd cannot be reached. 0, or 1 naming the
// lease that is left.
int Release(PoolClient& c, const std::string& pool, const std::string& profile,
            const std::string& slot, uint64_t token, const PoolOwnerId& owner) {
  const auto give_up = After(absl::Seconds(30));
  absl::Status s;
  for (;;) {
    s = c.release(pool, profile, slot, token, owner).status();
    if (s.ok() || absl::IsNotFound(s)) return 0;  // released (or gone: expired, reconciled)
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) break;
    if (std::chrono::steady_clock::now() > give_up) break;
    absl::SleepFor(absl::Seconds(1));
  }
  logging::Program().Error(absl::StrFormat(
      "could not release %s/%s/%s token %llu (%s): it stays leased until its manager releases it "
      "(lockctl pool release) or an operator recovers it", pool.c_str(), profile.c_str(),
      slot.c_str(), static_cast<unsigned long long>(token), s.ToString().c_str()));
  return 1;
}

}  // namespace

int PoolRun(const PoolClientOptions& client_options, const PoolOwnerId& owner,
            const std::vector<std::string>& command) {
  const std::string pool = absl::GetFlag(FLAGS_pool);
  const std::string profile = absl::GetFlag(FLAGS_profile);
  const std::string slot = absl::GetFlag(FLAGS_slot);
  auto client = PoolClient::Create(client_options);
  if (!client.ok()) return Fail(client.status());
  PoolClient& c = **client;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);

  // A provisional lease, asked for again at the fixed managers' cadence while there are none.
  uint64_t token = 0;
  bool told = false;
  while (token == 0) {
    if (g_signal.load() != 0) return 128 + g_signal.load();
    auto g = c.acquire(pool, profile, slot, owner, absl::GetFlag(FLAGS_ttl));
    if (!g.ok()) return Fail(g.status());
    if (g->granted) {
      token = g->token;
      break;
    }
    if (!told) {
      logging::Program().Info(absl::StrFormat(
          "waiting for units (asking every %s): %s",
          absl::FormatDuration(defaults::kPoolAcquireRetry).c_str(), g->refusal.c_str()));
      told = true;
    }
    Wait(defaults::kPoolAcquireRetry);
  }
  if (g_signal.load() != 0) {
    Release(c, pool, profile, slot, token, owner);
    return 128 + g_signal.load();
  }
  // Only an active lease lets a worker start (seed ADR-0003).
  if (auto d = c.activate(pool, profile, slot, token, owner); !d.ok()) {
    const int code = Fail(d.status());
    Release(c, pool, profile, slot, token, owner);
    return code;
  }
  logging::Program().Info(absl::StrFormat(
      "running %s under %s/%s/%s token %llu (active)", command[0].c_str(), pool.c_str(),
      profile.c_str(), slot.c_str(), static_cast<unsigned long long>(token)));
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int code = Fail(absl::InternalError(absl::StrCat("fork: ", std::strerror(errno))));
    Release(c, pool, profile, slot, token, owner);
    return code;
  }
  if (pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    std::vector<char*> argv;
    for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    logging::Program().Error(absl::StrFormat("cannot run %s: %s", argv[0], std::strerror(errno)));
    ::_exit(127);
  }
  g_child.store(pid);
  if (const int sig = g_signal.load(); sig != 0) ::kill(pid, sig);  // arrived before g_child
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child.store(0);
  const int released = Release(c, pool, profile, slot, token, owner);
  if (released != 0) return released;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace fencelock
