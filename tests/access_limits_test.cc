// Who may talk to lockd, and how much of it one caller may take: the Unix socket's permissions
// and user-id allowlist, loopback-only TCP by default, and each limit refusing only the caller
// that hit it while everyone else keeps being served.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "clock/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lockd_process.h"
#include "metrics/http_get.h"
#include "protocol/version.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using testing::LockdProcess;
using testing::RawConnection;
using testing::ReadTextFile;
using ::testing::HasSubstr;

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

using testing::request::Acquire;
using testing::request::OpenSession;
using testing::request::Release;
wire::Request Stats() { return testing::request::GetStats(); }

// Says Hello on `c` and returns the reply's code, or -1 if none came back. Unlike
// RawConnection::Hello(), a refusal (and the close after it) is a result, not an abort.
int HelloCode(RawConnection& c) {
  wire::Request hello = testing::request::Hello();
  hello.set_request_id(1);
  c.SendRequest(hello);
  auto reply = c.ReadResponse();
  return reply ? reply->code() : -1;
}

// What a process running as `uid` gets when it says Hello on `path`: the reply's code, -1 if
// the connection gave nothing back, -2 if it could not connect at all.
int HelloAs(uid_t uid, const std::string& path) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgid(kNogroup) != 0 || setuid(uid) != 0) _exit(100);
    RawConnection c = RawConnection::Unix(path);  // aborts (-2) if it cannot connect
    const int code = HelloCode(c);
    _exit(code < 0 ? 101 : code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status)) return -2;
  const int code = WEXITSTATUS(status);
  return code >= 100 ? -1 : code;
}

TEST(UnixSocketTest, CreatedOwnerOnlyByDefault) {
  LockdProcess lockd({.unix_socket = true});
  struct stat st {};
  ASSERT_EQ(stat(lockd.unix_path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(UnixSocketTest, ModeAndGroupAsConfigured) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another group needs root";
  LockdProcess lockd({.unix_socket = true,
                      .extra_args = {"--unix-socket-mode=0660",
                                     "--unix-socket-group=" + std::to_string(kNogroup)}});
  struct stat st {};
  ASSERT_EQ(stat(lockd.unix_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, kNogroup);
}

TEST(UnixSocketTest, FilePermissionsKeepOtherUsersOut) {
  if (geteuid() != 0) GTEST_SKIP() << "acting as another user needs root";
  LockdProcess lockd({.unix_socket = true});  // 0600, owned by root
  chmod(std::filesystem::path(lockd.unix_path()).parent_path().c_str(), 0755);
  EXPECT_EQ(HelloAs(kNobody, lockd.unix_path()), -2) << "nobody could connect to a 0600 socket";
  EXPECT_EQ(HelloAs(0, lockd.unix_path()), wire::OK);
}

TEST(UnixSocketTest, AllowlistRefusesAnotherUserAndLogsIt) {
  if (geteuid() != 0) GTEST_SKIP() << "acting as another user needs root";
  testing::TempDir logs;
  const std::string log = logs.path() + "/lockd.stderr";
  LockdProcess lockd({.unix_socket = true,
                      .extra_args = {"--unix-socket-mode=0666", "--allowed-uids=0"},
                      .stderr_file = log});
  chmod(std::filesystem::path(lockd.unix_path()).parent_path().c_str(), 0755);
  EXPECT_EQ(HelloAs(kNobody, lockd.unix_path()), wire::PERMISSION_DENIED);
  EXPECT_EQ(HelloAs(0, lockd.unix_path()), wire::OK);
  RawConnection tcp = RawConnection::Tcp(lockd.port());  // lockd keeps serving everyone else
  EXPECT_EQ(tcp.Hello().code(), wire::OK);
  EXPECT_THAT(ReadTextFile(log), HasSubstr("refused connection"));
  EXPECT_THAT(ReadTextFile(log), HasSubstr("user id 65534"));
}

TEST(UnixSocketTest, AllowlistAdmitsTheListedUserOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "acting as another user needs root";
  LockdProcess lockd({.unix_socket = true,
                      .extra_args = {"--unix-socket-mode=0666",
                                     "--allowed-uids=" + std::to_string(kNobody)}});
  chmod(std::filesystem::path(lockd.unix_path()).parent_path().c_str(), 0755);
  EXPECT_EQ(HelloAs(kNobody, lockd.unix_path()), wire::OK);
  EXPECT_EQ(HelloAs(0, lockd.unix_path()), wire::PERMISSION_DENIED);
}

// Plaintext TCP is never served to other machines (issue 15): no flag allows it.
TEST(ListenTest, NonLoopbackPlaintextIsRefused) {
  testing::TempDir dir;
  ASSERT_EQ(testing::InitDataDir(dir.path() + "/data"), 0);
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--listen=0.0.0.0"}, {"--listen=::"}, {"--listen=192.0.2.1"}}) {
    std::vector<std::string> args = {"serve", "--data-dir=" + dir.path() + "/data", "--port=0",
                                     "--metrics-port=-1"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto [status, err] = testing::RunLockdToExit(args);
    EXPECT_NE(status, 0) << extra[0];
    EXPECT_THAT(err, HasSubstr("is not loopback: lockd serves plaintext TCP on loopback"))
        << extra[0];
  }
  auto [status, err] = testing::RunLockdToExit(
      {"serve", "--data-dir=" + dir.path() + "/data", "--listen=0.0.0.0", "--allow-remote",
       "--port=0", "--metrics-port=-1"});
  EXPECT_NE(status, 0);
  EXPECT_THAT(err, HasSubstr("--allow-remote is no longer accepted"));
}

// --tcp=false: the Unix socket serves and nothing answers on TCP, so --allowed-uids cannot be
// bypassed through loopback.
TEST(ListenTest, WithTcpOffOnlyTheUnixSocketAnswers) {
  testing::TempDir dir;
  ASSERT_EQ(testing::InitDataDir(dir.path() + "/data"), 0);
  const int port = testing::FreeLoopbackPort();
  const std::string socket = dir.path() + "/lockd.sock";
  auto lockd = process::Child::Spawn(
      LOCKD_BINARY, {"serve", "--data-dir=" + dir.path() + "/data", "--tcp=false",
                     absl::StrCat("--port=", port), "--unix-socket=" + socket,
                     "--metrics-port=-1", "--port-file=" + dir.path() + "/port"});
  ASSERT_TRUE(lockd.ok()) << lockd.status();
  for (int i = 0; i < 2000 && testing::ReadTextFile(dir.path() + "/port") != "0\n"; ++i) {
    ASSERT_EQ(lockd->Wait(absl::Milliseconds(10)), std::nullopt) << "lockd exited";
  }
  ASSERT_EQ(testing::ReadTextFile(dir.path() + "/port"), "0\n");
  RawConnection over_unix = RawConnection::Unix(socket);
  EXPECT_EQ(over_unix.Hello().code(), wire::OK);
  EXPECT_EQ(testing::ConnectLoopback(port), -1);
  EXPECT_EQ(process::DescribeStatus(lockd->Stop()), "exited 0");

  // Without a Unix socket there is nothing to serve: refused.
  auto [status, err] = testing::RunLockdToExit(
      {"serve", "--data-dir=" + dir.path() + "/data", "--tcp=false", "--metrics-port=-1"});
  EXPECT_NE(status, 0);
  EXPECT_THAT(err, HasSubstr("--tcp=false leaves nothing to listen on"));
}

// The metrics endpoint, wherever it listens, shows no lock names (nor ids or tokens).
TEST(ListenTest, MetricsShowNoLockNames) {
  LockdProcess lockd;
  RawConnection holder = RawConnection::Tcp(lockd.port());
  const uint64_t session = holder.HelloAndOpenSession(absl::Seconds(30));
  ASSERT_EQ(holder.Call(testing::request::Acquire(session, "payout/customer-4711")).code(), wire::OK);
  std::string page;
  for (int i = 0; i < 100; ++i) {  // lockd exports its figures every 250 ms
    auto got = metrics::HttpGet("127.0.0.1", lockd.metrics_port(), "/metrics");
    ASSERT_TRUE(got.ok()) << got.status();
    page = got->body;
    if (metrics::FindSample(page, "lockd_locks_held").value_or(0) == 1) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(metrics::FindSample(page, "lockd_locks_held").value_or(0), 1);
  EXPECT_THAT(page, ::testing::Not(HasSubstr("customer-4711")));
  EXPECT_THAT(page, ::testing::Not(HasSubstr("payout/")));
}

TEST(ListenTest, BadAccessFlagsAreRefusedWithTheirName) {
  testing::TempDir dir;
  ASSERT_EQ(testing::InitDataDir(dir.path() + "/data"), 0);
  const std::string data = "--data-dir=" + dir.path() + "/data";
  for (const auto& [flag, named] :
       {std::pair{"--unix-socket-mode=0999", "--unix-socket-mode"},
        std::pair{"--allowed-uids=no-such-user-here", "--allowed-uids"},
        std::pair{"--unix-socket-group=no-such-group-here", "--unix-socket-group"},
        std::pair{"--max-connections=0", "--max-connections"},
        std::pair{"--max-requests-in-flight=0", "--max-requests-in-flight"}}) {
    auto [status, err] = testing::RunLockdToExit(
        {"serve", data, "--port=0", "--metrics-port=-1", "--unix-socket=" + dir.path() + "/s", flag});
    EXPECT_NE(status, 0) << flag;
    EXPECT_THAT(err, HasSubstr(named)) << flag;
  }
}

// Each flag bound to an option reaches its field: lockd given a value out of the field's range
// refuses to start naming that flag (a flag bound to the wrong field, or to none, would start
// or name another).
TEST(ListenTest, EachBoundFlagOutOfRangeIsRefusedNamingIt) {
  testing::TempDir dir;
  ASSERT_EQ(testing::InitDataDir(dir.path() + "/data"), 0);
  const std::string data = "--data-dir=" + dir.path() + "/data";
  for (const std::string flag :
       {"--etcd-owner-ttl=1s", "--etcd-request-timeout=8s", "--wal-segment-bytes=1",
        "--tcp=false", "--max-connections=0", "--max-connections-per-peer=0",
        "--max-sessions-per-connection=0", "--max-requests-in-flight=0", "--max-frame-bytes=63",
        "--hello-timeout=0s", "--idle-timeout=0s", "--slow-reader-timeout=25h",
        "--session-ttl=2h", "--lock-ttl=1ms", "--min-ttl=0s", "--max-ttl=inf", "--max-wait=inf",
        "--max-locks-per-session=0", "--max-waiters-per-lock=0", "--lock-delay=2m",
        "--max-lock-delay=2h", "--pool-demand-ttl=2s", "--pool-provisional-ttl=1ms",
        "--stall-threshold=-1s", "--admission-lock=relative.lock", "--metrics-port=70000"}) {
    auto [status, err] = testing::RunLockdToExit({"serve", data, "--port=0", flag});
    EXPECT_NE(status, 0) << flag;
    EXPECT_THAT(err, HasSubstr(flag.substr(0, flag.find('=')))) << flag << ": " << err;
  }
}

TEST(LimitsTest, ConnectionLimitRefusesOnlyTheExtraConnection) {
  LockdProcess lockd({.extra_args = {"--max-connections=2"}});
  RawConnection a = RawConnection::Tcp(lockd.port());
  RawConnection b = RawConnection::Tcp(lockd.port());
  ASSERT_EQ(a.Hello().code(), wire::OK);
  ASSERT_EQ(b.Hello().code(), wire::OK);
  {
    RawConnection extra = RawConnection::Tcp(lockd.port());
    auto refused = extra.ReadResponse();
    ASSERT_TRUE(refused.has_value());
    EXPECT_EQ(refused->code(), wire::LIMIT_EXCEEDED);
    EXPECT_THAT(refused->message(), HasSubstr("--max-connections=2"));
    EXPECT_TRUE(extra.ClosedByPeer());
  }
  EXPECT_EQ(a.Call(Stats()).code(), wire::OK);  // the others are still served
  EXPECT_EQ(b.Call(Stats()).code(), wire::OK);
  { RawConnection gone = std::move(a); }  // one closes: room for a new one, once lockd sees it
  int code = wire::LIMIT_EXCEEDED;
  for (int tries = 0; tries < 500 && code == wire::LIMIT_EXCEEDED; ++tries) {
    RawConnection c = RawConnection::Tcp(lockd.port());
    code = HelloCode(c);
    if (code == wire::LIMIT_EXCEEDED) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(code, wire::OK);
}

// Issue 33: one user filled its share of connections and kept connecting. Each refused
// connection was held up to a second outside every limit, lockd ran out of descriptors, its
// next COMMITTED write failed, and it refused every acquire until restarted. Refusals now hold
// at most their own share of descriptors: a flood never reaches lockd's storage, and admitted
// clients are served throughout.
TEST(LimitsTest, AFloodOfConnectsNeverEndsServiceToAdmittedClients) {
  std::unique_ptr<LockdProcess> lockd;
  {
    testing::FewerOpenFiles limit(256);  // lockd's limit: a burst of 500 would pass it
    lockd = std::make_unique<LockdProcess>(
        LockdProcess::Options{.extra_args = {"--max-connections=8"}});
  }
  RawConnection worker = RawConnection::Tcp(lockd->port());
  const uint64_t session = worker.HelloAndOpenSession(absl::Seconds(60));
  const testing::FloodOutcome flood =
      testing::CyclesDuringAFlood(worker, session, "flooded", lockd->port());
  std::printf("%d acquire + release cycles during a flood of %lu connects\n", flood.cycles,
              static_cast<unsigned long>(flood.connects));
  EXPECT_GT(flood.connects, 1000u) << "the flood was too small to show anything";
  EXPECT_EQ(worker.Call(Stats()).stats().disk_fault(), "");
}

TEST(LimitsTest, SessionsPerConnectionLimitRefusesOnlyThatConnection) {
  LockdProcess lockd({.extra_args = {"--max-sessions-per-connection=2"}});
  RawConnection a = RawConnection::Tcp(lockd.port());
  ASSERT_EQ(a.Hello().code(), wire::OK);
  const uint64_t s1 = a.Call(OpenSession(absl::Seconds(30))).open_session().session_id();
  ASSERT_EQ(a.Call(OpenSession(absl::Seconds(30))).code(), wire::OK);
  wire::Response third = a.Call(OpenSession(absl::Seconds(30)));
  EXPECT_EQ(third.code(), wire::LIMIT_EXCEEDED);
  EXPECT_THAT(third.message(), HasSubstr("--max-sessions-per-connection=2"));
  RawConnection b = RawConnection::Tcp(lockd.port());
  EXPECT_NE(b.HelloAndOpenSession(absl::Seconds(30)), 0u);
  EXPECT_EQ(a.Call(Acquire(s1, "x", absl::ZeroDuration())).code(), wire::OK);  // a still works
  ASSERT_EQ(a.Call(testing::request::Close(s1)).code(), wire::OK);
  EXPECT_EQ(a.Call(OpenSession(absl::Seconds(30))).code(), wire::OK);  // a closed one frees room
}

TEST(LimitsTest, LocksPerSessionLimitRefusesOnlyThatSession) {
  LockdProcess lockd({.extra_args = {"--max-locks-per-session=2"}});
  RawConnection a = RawConnection::Tcp(lockd.port());
  const uint64_t s = a.HelloAndOpenSession(absl::Seconds(30));
  const uint64_t t1 = a.Call(Acquire(s, "l1", absl::ZeroDuration())).acquire().token();
  ASSERT_TRUE(a.Call(Acquire(s, "l2", absl::ZeroDuration())).acquire().granted());
  wire::Response third = a.Call(Acquire(s, "l3", absl::ZeroDuration()));
  EXPECT_EQ(third.code(), wire::LIMIT_EXCEEDED);
  EXPECT_THAT(third.message(), HasSubstr("--max-locks-per-session=2"));
  RawConnection b = RawConnection::Tcp(lockd.port());
  const uint64_t other = b.HelloAndOpenSession(absl::Seconds(30));
  EXPECT_TRUE(b.Call(Acquire(other, "l3", absl::ZeroDuration())).acquire().granted());
  ASSERT_EQ(a.Call(Release(s, "l1", t1)).code(), wire::OK);
  EXPECT_TRUE(a.Call(Acquire(s, "l4", absl::ZeroDuration())).acquire().granted());
}

TEST(LimitsTest, WaitersPerLockLimitRefusesOnlyTheExtraWaiter) {
  LockdProcess lockd({.extra_args = {"--max-waiters-per-lock=1"}});
  RawConnection holder = RawConnection::Tcp(lockd.port());
  const uint64_t h = holder.HelloAndOpenSession(absl::Seconds(30));
  const uint64_t token = holder.Call(Acquire(h, "q", absl::ZeroDuration())).acquire().token();
  RawConnection w1 = RawConnection::Tcp(lockd.port());
  const uint64_t s1 = w1.HelloAndOpenSession(absl::Seconds(30));
  wire::Request queued = Acquire(s1, "q", absl::Seconds(20));
  queued.set_request_id(7);
  ASSERT_TRUE(w1.SendRequest(queued));
  for (int tries = 0; tries < 500 && holder.Call(Stats()).stats().waiters() != 1; ++tries) {
    absl::SleepFor(absl::Milliseconds(10));  // until lockd has queued it
  }
  ASSERT_EQ(holder.Call(Stats()).stats().waiters(), 1u);
  RawConnection w2 = RawConnection::Tcp(lockd.port());
  const uint64_t s2 = w2.HelloAndOpenSession(absl::Seconds(30));
  wire::Response refused = w2.Call(Acquire(s2, "q", absl::Seconds(20)));
  EXPECT_EQ(refused.code(), wire::LIMIT_EXCEEDED);
  EXPECT_THAT(refused.message(), HasSubstr("--max-waiters-per-lock=1"));
  ASSERT_EQ(holder.Call(Release(h, "q", token)).code(), wire::OK);
  auto granted = w1.ReadResponse();  // the queued waiter is still served
  ASSERT_TRUE(granted.has_value());
  EXPECT_EQ(granted->request_id(), 7u);
  EXPECT_TRUE(granted->acquire().granted());
}

TEST(LimitsTest, FrameSizeLimitClosesOnlyThatConnection) {
  LockdProcess lockd({.extra_args = {"--max-frame-bytes=1024"}});
  RawConnection ok = RawConnection::Tcp(lockd.port());
  ASSERT_EQ(ok.Hello().code(), wire::OK);
  RawConnection big = RawConnection::Tcp(lockd.port());
  ASSERT_EQ(big.Hello().code(), wire::OK);
  const uint64_t s = big.Call(OpenSession(absl::Seconds(30))).open_session().session_id();
  wire::Request oversize = Acquire(s, std::string(2000, 'x'), absl::ZeroDuration());
  oversize.set_request_id(9);
  big.SendRequest(oversize);
  auto refused = big.ReadResponse();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), wire::FRAME_TOO_LARGE);
  EXPECT_THAT(refused->message(), HasSubstr("1024"));
  EXPECT_TRUE(big.ClosedByPeer());
  EXPECT_EQ(ok.Call(Stats()).code(), wire::OK);
}

TEST(LimitsTest, ConnectionWithoutHelloIsClosedAfterTheTimeout) {
  LockdProcess lockd({.extra_args = {"--hello-timeout=300ms"}});
  RawConnection talker = RawConnection::Tcp(lockd.port());
  ASSERT_EQ(talker.Hello().code(), wire::OK);
  RawConnection silent = RawConnection::Tcp(lockd.port());
  auto told = silent.ReadResponse(absl::Seconds(10));
  ASSERT_TRUE(told.has_value());
  EXPECT_EQ(told->code(), wire::HELLO_REQUIRED);
  EXPECT_THAT(told->message(), HasSubstr("--hello-timeout"));
  EXPECT_TRUE(silent.ClosedByPeer());
  absl::SleepFor(absl::Milliseconds(400));  // past the timeout: the one that said Hello stays
  EXPECT_EQ(talker.Call(Stats()).code(), wire::OK);
}

}  // namespace
}  // namespace fencelock
