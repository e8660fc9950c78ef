// lockd's permissions file against a real lockd: an identity limited to payout/ cannot take
// admin/x, listing needs its own right, SIGHUP reloads the file without dropping sessions, and
// a file with an error is refused at startup and on reload (the old rules stay in force), and
// checking a token without a session takes the validate right.
// Identities here: uid:0 (the test runs as root) on the Unix socket, anonymous on TCP.
#include <signal.h>
#include <unistd.h>

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

class PermissionsTest : public ::testing::Test {
 protected:
  PermissionsTest() {
    Write("uid:0     acquire payout/\n"
          "anonymous acquire public/\n");
    lockd_ = std::make_unique<LockdProcess>(LockdProcess::Options{
        .unix_socket = true,
        .extra_args = {"--permissions=" + path_},
        .stderr_file = tmp_.path() + "/lockd.err",
        .stdout_file = tmp_.path() + "/lockd.out"});
  }
  void Write(const std::string& text) {
    std::ofstream(path_ + ".tmp") << text;
    std::rename((path_ + ".tmp").c_str(), path_.c_str());
  }
  // Sends SIGHUP and waits until lockd's log shows the reload's outcome `count` times.
  void Reload(const std::string& needle, int count) {
    kill(lockd_->pid(), SIGHUP);
    for (int i = 0; i < 500; ++i) {
      const std::string out = testing::ReadTextFile(tmp_.path() + "/lockd.out");
      size_t seen = 0;
      for (size_t at = out.find(needle); at != std::string::npos; at = out.find(needle, at + 1)) ++seen;
      if (seen >= static_cast<size_t>(count)) return;
      usleep(10'000);
    }
    ADD_FAILURE() << "lockd did not log \"" << needle << "\"";
  }

  testing::TempDir tmp_;
  const std::string path_ = tmp_.path() + "/permissions";
  std::unique_ptr<LockdProcess> lockd_;
};

TEST_F(PermissionsTest, AnIdentityAcquiresOnlyUnderItsPrefixesAndListsOnlyIfAllowed) {
  RawConnection root = RawConnection::Unix(lockd_->unix_path());
  const uint64_t session = root.HelloAndOpenSession(absl::Seconds(60));
  EXPECT_EQ(root.Call(request::Acquire(session, "payout/1")).code(), wire::OK);
  const wire::Response admin = root.Call(request::Acquire(session, "admin/x"));
  EXPECT_EQ(admin.code(), wire::PERMISSION_DENIED);
  EXPECT_THAT(admin.message(), HasSubstr("may not acquire \"admin/x\": uid:0 may acquire locks "
                                         "starting with payout/"));
  RawConnection tcp = RawConnection::Tcp(lockd_->port());
  const uint64_t anonymous = tcp.HelloAndOpenSession(absl::Seconds(60));
  EXPECT_EQ(tcp.Call(request::Acquire(anonymous, "public/a")).code(), wire::OK);
  EXPECT_EQ(tcp.Call(request::Acquire(anonymous, "payout/2")).code(), wire::PERMISSION_DENIED);
  const wire::Response list = root.Call(request::ListLocks(10));
  EXPECT_EQ(list.code(), wire::PERMISSION_DENIED);
  EXPECT_THAT(list.message(), HasSubstr("uid:0 may not list sessions and locks"));
  const wire::StatsReply stats = root.Call(request::GetStats()).stats();
  EXPECT_EQ(stats.permission_denied_total(), 3u);
  EXPECT_EQ(stats.locks_held(), 2u);
  // Issue 59: the newest token (which a stranger could present at a resource that checks
  // tokens alone) is shown only to an identity that may list; the counts stay.
  EXPECT_EQ(stats.last_token(), 0u);
  Write("uid:0     acquire payout/\n"
        "uid:0     list\n"
        "anonymous acquire public/\n");
  Reload("SIGHUP: permissions from " + path_ + ": 3 rules", 1);
  EXPECT_EQ(root.Call(request::GetStats()).stats().last_token(), 2u);
  EXPECT_EQ(tcp.Call(request::GetStats()).stats().last_token(), 0u);
}

TEST_F(PermissionsTest, SighupReloadsKeepingSessionsAndABadFileChangesNothing) {
  RawConnection root = RawConnection::Unix(lockd_->unix_path());
  const uint64_t session = root.HelloAndOpenSession(absl::Seconds(60));
  const uint64_t token = root.Call(request::Acquire(session, "payout/1")).acquire().token();
  ASSERT_GT(token, 0u);

  Write("uid:0 acquire payout/ admin/\nuid:0 list\n");
  Reload("SIGHUP: permissions from " + path_ + ": 2 rules", 1);
  EXPECT_EQ(root.Call(request::Acquire(session, "admin/x")).code(), wire::OK);
  // "list" shows the locks, not whose they are: every holder session and token is 0.
  const wire::ListReply names = root.Call(request::ListLocks(10)).list();
  ASSERT_EQ(names.locks_size(), 2);
  EXPECT_TRUE(names.redacted());
  EXPECT_EQ(names.locks(0).lock(), "admin/x");
  EXPECT_EQ(names.locks(1).token(), 0u);
  EXPECT_EQ(names.locks(1).session_id(), 0u);
  const wire::Request with_sessions = request::ListLocks({.limit = 10, .include_sessions = true});
  EXPECT_EQ(root.Call(with_sessions).code(), wire::PERMISSION_DENIED);

  // "inspect" shows them, and the sessions.
  Write("uid:0 acquire payout/ admin/\nuid:0 inspect\n");
  Reload("SIGHUP: permissions from " + path_ + ": 2 rules", 2);
  const wire::ListReply full = root.Call(with_sessions).list();
  EXPECT_FALSE(full.redacted());
  ASSERT_EQ(full.locks_size(), 2);
  EXPECT_EQ(full.locks(1).token(), token);
  EXPECT_EQ(full.locks(1).session_id(), session);
  EXPECT_EQ(full.sessions_size(), 1);

  // A file with an error: logged with its line, and the rules above stay in force.
  Write("uid:0 acquire payout/\nuid:0 lists\n");
  Reload(path_ + " line 2: unknown right \"lists\" (acquire, list, inspect, validate, operator, manage); the "
                 "permissions in force are unchanged", 1);
  EXPECT_EQ(root.Call(request::ListLocks(10)).code(), wire::OK);
  EXPECT_EQ(root.Call(request::Acquire(session, "admin/y")).code(), wire::OK);
  // The session and its first lock went through both reloads untouched.
  EXPECT_EQ(root.Call(request::Release(session, "payout/1", token)).code(), wire::OK);
}

TEST_F(PermissionsTest, CheckingATokenWithoutASessionTakesTheValidateRight) {
  RawConnection root = RawConnection::Unix(lockd_->unix_path());
  const uint64_t session = root.HelloAndOpenSession(absl::Seconds(60));
  const uint64_t token = root.Call(request::Acquire(session, "payout/1")).acquire().token();
  ASSERT_EQ(root.Call(request::Release(session, "payout/1", token)).code(), wire::OK);
  // A stranger who remembers the old token cannot make lockd count a fenced-out request (an
  // alert) by asking about it: checking tokens is a resource's right.
  RawConnection stranger = RawConnection::Tcp(lockd_->port());
  stranger.Hello();
  const wire::Response refused = stranger.Call(request::Validate("payout/1", token));
  EXPECT_EQ(refused.code(), wire::PERMISSION_DENIED);
  EXPECT_THAT(refused.message(), HasSubstr("anonymous has no validate right"));
  EXPECT_EQ(root.Call(request::GetStats()).stats().fenced_out_total(), 0u);
  // Given the right, the same check is answered, and a stale token is fenced out.
  Write("uid:0 acquire payout/\nanonymous validate\n");
  Reload("SIGHUP: permissions from " + path_ + ": 2 rules", 1);
  EXPECT_EQ(stranger.Call(request::Validate("payout/1", token)).code(), wire::FENCED_OUT);
  EXPECT_EQ(root.Call(request::GetStats()).stats().fenced_out_total(), 1u);
}

TEST(PermissionsStartupTest, AFileWithAnErrorIsRefusedNamingTheLine) {
  testing::TempDir dir;
  ASSERT_EQ(testing::InitDataDir(dir.path() + "/data"), 0);
  std::ofstream(dir.path() + "/permissions") << "# ok\nuid:0 acquire payout/\nroot list\n";
  auto [status, err] = testing::RunLockdToExit(
      {"serve", "--data-dir=" + dir.path() + "/data", "--port=0", "--metrics-port=-1",
       "--permissions=" + dir.path() + "/permissions"});
  EXPECT_NE(status, 0);
  EXPECT_THAT(err, HasSubstr(dir.path() + "/permissions line 3: \"root\" is not an identity"));
  auto [missing, why] = testing::RunLockdToExit(
      {"serve", "--data-dir=" + dir.path() + "/data", "--port=0", "--metrics-port=-1",
       "--permissions=" + dir.path() + "/none"});
  EXPECT_NE(missing, 0);
  EXPECT_THAT(why, HasSubstr("cannot read the permissions file"));
  // A file far larger than any set of rules is refused before it is read.
  {
    std::ofstream huge(dir.path() + "/huge");
    const std::string comment = "#" + std::string(1023, 'x') + "\n";
    for (int i = 0; i < 17 * 1024; ++i) huge << comment;
  }
  auto [big, too_big] = testing::RunLockdToExit(
      {"serve", "--data-dir=" + dir.path() + "/data", "--port=0", "--metrics-port=-1",
       "--permissions=" + dir.path() + "/huge"});
  EXPECT_NE(big, 0);
  EXPECT_THAT(too_big, HasSubstr("bytes; at most 16777216 are read"));
  // A device or a FIFO is not a file of rules (reading /dev/zero would never end).
  auto [device, not_file] = testing::RunLockdToExit(
      {"serve", "--data-dir=" + dir.path() + "/data", "--port=0", "--metrics-port=-1",
       "--permissions=/dev/zero"});
  EXPECT_NE(device, 0);
  EXPECT_THAT(not_file, HasSubstr("/dev/zero is not a regular file"));
}

}  // namespace
}  // namespace fencelock
