// lockctl against a real lockd: tables for people, JSON for scripts, a clear failure when lockd
// is not there.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs lockctl with `args` (redirections included); returns its exit status and what it wrote
// to the pipe: standard output, and standard error unless `args` sends it elsewhere.
std::pair<int, std::string> LockctlRaw(const std::string& args) {
  FILE* pipe = popen((std::string(LOCKCTL_BINARY) + " " + args).c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  return {WEXITSTATUS(status), out};
}

// Runs lockctl with `args`; returns its exit status and standard output and error together.
std::pair<int, std::string> Lockctl(const std::string& args) { return LockctlRaw(args + " 2>&1"); }

TEST(LockctlTest, ShowsHoldersTokensAndWaitersAsTablesAndJson) {
  testing::LockdProcess lockd;
  ClientOptions options;
  options.server = lockd.tcp_address();
  auto holder = Client::Create(options);
  auto waiter = Client::Create(options);
  ASSERT_TRUE(holder.ok() && waiter.ok());
  auto held = (*holder)->acquire("payout-42", absl::Seconds(5));
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE((*holder)->acquire("payout-43", absl::Seconds(5)).ok());
  std::thread waiting([&] { (void)(*waiter)->acquire("payout-42", absl::Seconds(20)); });
  const std::string server = "--server=" + lockd.tcp_address();
  for (int i = 0; i < 500 && Lockctl(server + " waiters").second.find("payout-42") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }

  auto [status_rc, status] = Lockctl(server + " status");
  EXPECT_EQ(status_rc, 0);
  EXPECT_THAT(status, HasSubstr("locks held        2"));
  EXPECT_THAT(status, HasSubstr("waiters           1"));
  EXPECT_THAT(status, HasSubstr("health            ok"));

  auto [locks_rc, locks] = Lockctl(server + " locks");
  EXPECT_EQ(locks_rc, 0);
  EXPECT_THAT(locks, HasSubstr("payout-42"));
  EXPECT_THAT(locks, HasSubstr(absl::StrCat(held->token())));
  EXPECT_THAT(Lockctl(server + " locks --prefix=payout-43").second, Not(HasSubstr("payout-42")));

  auto [waiters_rc, waiters] = Lockctl(server + " waiters");
  EXPECT_THAT(waiters, HasSubstr("payout-42"));
  EXPECT_THAT(waiters, Not(HasSubstr("payout-43")));

  auto [json_rc, json] = Lockctl(server + " --json locks");
  EXPECT_EQ(json_rc, 0);
  EXPECT_THAT(json, HasSubstr("\"lock\": \"payout-42\""));
  EXPECT_THAT(json, HasSubstr(absl::StrCat("\"token\": \"", held->token(), "\"")));
  EXPECT_THAT(json, HasSubstr("\"waiters\": 1"));
  EXPECT_THAT(Lockctl(server + " --json sessions").second, HasSubstr("\"locks_held\": 2"));
  EXPECT_THAT(Lockctl(server + " --json status").second, HasSubstr("\"locks_held\": \"2\""));

  ASSERT_TRUE((*holder)->release(*held).ok());
  waiting.join();
}

// ADR 0006: a lock's mode and every holder, and a lock in a delay with the time left and what
// it blocks.
TEST(LockctlTest, ShowsModesEveryHolderAndALockInDelay) {
  testing::LockdProcess lockd;
  ClientOptions options;
  options.server = lockd.tcp_address();
  auto a = Client::Create(options);
  auto b = Client::Create(options);
  ASSERT_TRUE(a.ok() && b.ok());
  auto ra = (*a)->acquireShared("report", absl::Seconds(5));
  auto rb = (*b)->acquireShared("report", absl::Seconds(5));
  ASSERT_TRUE(ra.ok() && rb.ok());
  // A holder that never renews: its lease ends after 100 ms and starts a 30 s delay.
  testing::RawConnection lost = testing::RawConnection::Tcp(lockd.port());
  const uint64_t session = lost.HelloAndOpenSession(absl::Seconds(60));
  ASSERT_EQ(lost.Call(testing::request::Acquire(session, "ledger", absl::ZeroDuration(),
                                                absl::Milliseconds(100), wire::EXCLUSIVE,
                                                absl::Seconds(30)))
                .code(),
            wire::OK);
  absl::SleepFor(absl::Milliseconds(300));
  const std::string server = "--server=" + lockd.tcp_address();
  auto [rc, locks] = Lockctl(server + " locks");
  EXPECT_EQ(rc, 0) << locks;
  EXPECT_THAT(locks, ::testing::ContainsRegex(absl::StrCat("report +shared +", ra->token(), " ")));
  EXPECT_THAT(locks, ::testing::ContainsRegex(absl::StrCat("\n +", rb->token(), " ")));
  EXPECT_THAT(locks,
              ::testing::ContainsRegex("ledger +free +- +- +- +0 +(29|30)\\.[0-9]s \\(all\\)"));
  auto [json_rc, json] = Lockctl(server + " --json locks");
  EXPECT_EQ(json_rc, 0);
  EXPECT_THAT(json, HasSubstr("\"mode\": \"SHARED\""));
  EXPECT_THAT(json, HasSubstr("\"delay_blocks_shared\": true"));
}

// An identity whose permissions allow "list" but not "inspect" sees lock names and leases,
// and "-" where the holder and the token would be; sessions it may not list at all.
TEST(LockctlTest, WithoutTheInspectRightHoldersAndTokensAreNotShown) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/permissions") << "anonymous acquire payout-\nanonymous list\n";
  testing::LockdProcess lockd({.extra_args = {"--permissions=" + dir.path() + "/permissions"}});
  ClientOptions options;
  options.server = lockd.tcp_address();
  auto holder = Client::Create(options);
  ASSERT_TRUE(holder.ok()) << holder.status();
  auto held = (*holder)->acquire("payout-77", absl::Seconds(5));
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string server = "--server=" + lockd.tcp_address();
  auto [rc, locks] = Lockctl(server + " locks");
  EXPECT_EQ(rc, 0) << locks;
  EXPECT_THAT(locks, ::testing::ContainsRegex("payout-77 +exclusive +- +- "));
  EXPECT_THAT(locks, Not(HasSubstr(absl::StrCat(" ", held->token(), " "))));
  auto [sessions_rc, sessions] = Lockctl(server + " sessions");
  // A refusal has its own exit status, not 1 ("lockd unreachable"): issue 33.
  EXPECT_EQ(sessions_rc, 7) << sessions;
  EXPECT_THAT(sessions, HasSubstr("PERMISSION_DENIED: "));
  EXPECT_THAT(sessions, HasSubstr("may list locks but not sessions"));
}

// Issue 33: a full pool table was reported as UNAVAILABLE, lockctl's exit status for an
// unreachable lockd. Each kind of refusal has its own; unreachable stays 1.
TEST(LockctlTest, RefusalsAndAnUnreachableLockdExitDifferently) {
  testing::LockdProcess lockd(testing::LockdProcess::Options{.unix_socket = true});
  const std::string server = "--server=unix:" + lockd.unix_path();  // pools: ADR 0004
  for (int i = 0; i < 64; ++i) {
    auto [rc, out] = Lockctl(absl::StrCat(server, " pool publish --pool=p", i,
                                          " --generation=1 --budget=1 --profiles=a"));
    ASSERT_EQ(rc, 0) << out;
  }
  auto [full_rc, full] =
      Lockctl(server + " pool publish --pool=one-too-many --generation=1 --budget=1 --profiles=a");
  EXPECT_EQ(full_rc, 9) << full;
  EXPECT_THAT(full, HasSubstr("LIMIT_EXCEEDED"));
  auto [gone_rc, gone] = Lockctl(absl::StrCat("--server=127.0.0.1:", testing::FreeLoopbackPort(),
                                              " --timeout=2s status"));
  EXPECT_EQ(gone_rc, 1) << gone;
}

TEST(LockctlTest, AStateLargerThanAFrameIsListedPageByPage) {
  // 10,000 locks with 300-byte names: about 3.5 MB of listing, over three times lockd's frame.
  testing::LockdProcess lockd({.segment_bytes = 16 << 20});
  const std::string prefix = std::string(290, 'n') + "/";
  testing::RawConnection holder = testing::HoldLocks(lockd.port(), 10000, 1000, prefix);
  const std::string server = "--server=" + lockd.tcp_address();
  auto [rc, out] = Lockctl(server + " locks");
  EXPECT_EQ(rc, 0) << out.substr(0, 500);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 10001) << "header and one line per lock";
  EXPECT_THAT(out, Not(HasSubstr("exceeds")));
  auto [json_rc, json] = Lockctl(server + " --json locks");
  EXPECT_EQ(json_rc, 0);
  size_t locks = 0;
  for (size_t at = 0; (at = json.find("\"lock\": \"", at)) != std::string::npos; ++at) ++locks;
  EXPECT_EQ(locks, 10000u);
  auto [sessions_rc, sessions] = Lockctl(server + " sessions");
  EXPECT_EQ(sessions_rc, 0);
  EXPECT_EQ(std::count(sessions.begin(), sessions.end(), '\n'), 11) << sessions;
}

TEST(LockctlTest, UnreachableServerAndBadUsageAreClearErrors) {
  auto [rc, out] = Lockctl("--server=127.0.0.1:1 status");
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(out, HasSubstr("cannot connect to lockd at 127.0.0.1:1"));
  auto [usage_rc, usage] = Lockctl("--server=127.0.0.1:1 frobnicate");
  EXPECT_EQ(usage_rc, 2);
  EXPECT_THAT(usage, HasSubstr("unknown command \"frobnicate\"; use status, sessions, locks, "
                               "waiters or pool"));
  auto [extra_rc, extra] = Lockctl("--server=127.0.0.1:1 pool status stray --pool=p");
  EXPECT_EQ(extra_rc, 2);
  EXPECT_THAT(extra, HasSubstr("unexpected argument \"stray\" after pool status"));
  // A diagnostic is a log line on standard error; standard output (a script's capture) stays
  // empty.
  auto [stdout_rc, stdout_only] = LockctlRaw("--server=127.0.0.1:1 status 2>/dev/null");
  EXPECT_EQ(stdout_rc, 1);
  EXPECT_EQ(stdout_only, "");
  auto [stderr_rc, stderr_only] = LockctlRaw("--server=127.0.0.1:1 status 2>&1 >/dev/null");
  EXPECT_EQ(stderr_rc, 1);
  EXPECT_THAT(stderr_only, HasSubstr(" error lockctl: UNAVAILABLE: cannot connect to lockd"));
}

TEST(LockctlTest, AFrozenLockdMakesLockctlGiveUpNotHang) {
  testing::LockdProcess lockd;
  const std::string server = "--server=" + lockd.tcp_address();
  ASSERT_EQ(Lockctl(server + " status").first, 0);
  // Frozen: the kernel still accepts connections into the backlog, but nothing answers.
  ASSERT_EQ(kill(lockd.pid(), SIGSTOP), 0);
  auto [rc, out] = Lockctl(server + " --timeout=500ms status");
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(out, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_THAT(out, HasSubstr("no answer within the timeout"));
  ASSERT_EQ(kill(lockd.pid(), SIGCONT), 0);
  EXPECT_EQ(Lockctl(server + " status").first, 0);
}

TEST(LockctlTest, BadAddressesAndTimeoutsAreRefused) {
  // A bad address is a usage error (exit 2), not an unreachable lockd (exit 1).
  auto [rc, out] = Lockctl("--server=nocolon status");
  EXPECT_EQ(rc, 2);
  EXPECT_THAT(out, HasSubstr("bad lockd address \"nocolon\""));
  auto [unix_rc, unix_out] = Lockctl("--server=unix:/" + std::string(200, 'x') + " status");
  EXPECT_EQ(unix_rc, 2);
  EXPECT_THAT(unix_out, HasSubstr("must be 1 to 107 bytes"));
  auto [timeout_rc, timeout_out] = Lockctl("--server=127.0.0.1:1 --timeout=0s status");
  EXPECT_EQ(timeout_rc, 2);
  EXPECT_THAT(timeout_out, HasSubstr("--timeout=0 must be positive"));
}

// `lockctl pool run` (issue 35): CMD starts only once the slot's lease is active, its exit
// status is lockctl's, and the exact lease is released after it; a second run for a pool
// without units waits (asking again every 2 s) until the first released; a run that cannot be
// admitted never starts its command.
TEST(LockctlTest, PoolRunStartsTheCommandOnlyUnderAnActiveLeaseAndReleasesIt) {
  testing::LockdProcess lockd(testing::LockdProcess::Options{.unix_socket = true});
  testing::TempDir tmp;
  const std::string server = "--server=unix:" + lockd.unix_path();
  ASSERT_EQ(Lockctl(server + " pool publish --pool=p --generation=1 --budget=1 --profiles=a").first, 0);
  auto [claim_rc, claimed] = Lockctl(server + " pool claim --pool=p --profile=a --generation=1");
  ASSERT_EQ(claim_rc, 0) << claimed;
  const std::string owner = claimed.substr(0, claimed.find('\n'));
  const std::string run = absl::StrCat(server, " pool run --pool=p --profile=a --owner=", owner);
  const std::string status = absl::StrCat(LOCKCTL_BINARY, " ", server, " pool status --pool=p");
  // Inside, the lease is the slot's and active; the command's status comes back.
  auto [rc, out] = Lockctl(absl::StrCat(run, " --slot=s1 -- sh -c '", status,
                                        " > ", tmp.path(), "/inside; exit 7'"));
  EXPECT_EQ(rc, 7) << out;
  std::ifstream inside(tmp.path() + "/inside");
  const std::string seen((std::istreambuf_iterator<char>(inside)), std::istreambuf_iterator<char>());
  EXPECT_THAT(seen, ::testing::HasSubstr("s1")) << seen;
  EXPECT_THAT(seen, ::testing::HasSubstr("active")) << seen;
  auto [after_rc, after] = Lockctl(server + " --json pool status --pool=p");
  EXPECT_THAT(after, ::testing::HasSubstr("\"leases\": []")) << after;

  // One unit: the second run waits for the first's release before it starts.
  const std::string done = tmp.path() + "/first-done";
  std::thread first([&] {
    auto [first_rc, first_out] =
        Lockctl(absl::StrCat(run, " --slot=s2 -- sh -c 'sleep 3; touch ", done, "'"));
    EXPECT_EQ(first_rc, 0) << first_out;
  });
  for (int i = 0; i < 200 && Lockctl(server + " pool status --pool=p").second.find("s2") ==
                                 std::string::npos;
       ++i) {
    usleep(10'000);
  }
  auto [second_rc, second] = Lockctl(absl::StrCat(run, " --slot=s3 -- test -f ", done));
  first.join();
  EXPECT_EQ(second_rc, 0) << "the second command ran before the first released: " << second;
  EXPECT_THAT(second, ::testing::HasSubstr("waiting for units (asking every 2s)")) << second;

  // A draining pool admits nobody: lockctl exits 5 and the command never runs.
  ASSERT_EQ(Lockctl(server + " pool drain --pool=p").first, 0);
  const std::string never = tmp.path() + "/never";
  auto [drained_rc, drained] = Lockctl(absl::StrCat(run, " --slot=s4 -- touch ", never));
  EXPECT_EQ(drained_rc, 5) << drained;
  EXPECT_FALSE(std::ifstream(never).good()) << "the command ran without a lease";
  // Usage: no command, a command for another verb, JSON.
  EXPECT_EQ(Lockctl(run + " --slot=s5").first, 2);
  EXPECT_EQ(Lockctl(server + " pool status --pool=p -- true").first, 2);
  EXPECT_EQ(Lockctl(run + " --slot=s5 --json -- true").first, 2);
}

}  // namespace
}  // namespace fencelock
