// Issue 15: a session is driven only from the connection it is bound to (the one that opened
// it, or the last to resume it with its secret), and only by the identity that opened it.
// Another peer sending the session's exact id and token is refused PERMISSION_DENIED and
// counted, and the session is left exactly as it was. Real lockd, real sockets.
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

using request::Close;
using request::KeepAlive;
using request::Resume;
using request::Validate;

class SessionBindingTest : public ::testing::Test {
 protected:
  SessionBindingTest() : lockd_(LockdProcess::Options{.unix_socket = true}) {}

  // Hello and OpenSession on `conn`; returns the reply's body.
  static wire::OpenSessionReply Open(RawConnection& conn) {
    conn.Hello();
    wire::Response r = conn.Call(request::OpenSession(absl::Seconds(60)));
    EXPECT_EQ(r.code(), wire::OK) << r.message();
    return r.open_session();
  }
  wire::StatsReply Stats() {
    RawConnection admin = RawConnection::Tcp(lockd_.port());
    admin.Hello();
    return admin.Call(request::GetStats()).stats();
  }

  LockdProcess lockd_;
};

TEST_F(SessionBindingTest, AnotherConnectionCannotDriveASessionEvenWithItsExactIdsAndToken) {
  RawConnection owner = RawConnection::Tcp(lockd_.port());
  const wire::OpenSessionReply opened = Open(owner);
  const uint64_t session = opened.session_id();
  const uint64_t token = owner.Call(request::Acquire(session, "payout/1")).acquire().token();
  ASSERT_GT(token, 0u);

  RawConnection stranger = RawConnection::Tcp(lockd_.port());
  stranger.Hello();
  for (const wire::Request& r :
       {KeepAlive(session, "payout/1", token), request::Release(session, "payout/1", token),
        request::Acquire(session, "payout/2"), Validate("payout/1", token, session), Close(session)}) {
    const wire::Response reply = stranger.Call(r);
    EXPECT_EQ(reply.code(), wire::PERMISSION_DENIED) << r.DebugString();
    EXPECT_THAT(reply.message(), HasSubstr("resume it with its secret")) << r.DebugString();
  }
  // Nothing changed: the lock is held under the same token, and the owner still drives it.
  EXPECT_EQ(stranger.Call(Validate("payout/1", token)).code(), wire::OK);  // a resource's check
  const wire::Response renewed = owner.Call(KeepAlive(session, "payout/1", token));
  ASSERT_EQ(renewed.code(), wire::OK) << renewed.message();
  EXPECT_EQ(renewed.keep_alive().lock_codes(0), wire::OK);
  const wire::StatsReply stats = Stats();
  EXPECT_EQ(stats.permission_denied_total(), 5u);
  EXPECT_EQ(stats.fenced_out_total(), 0u);      // the must-be-zero counter is not a stranger's
  EXPECT_EQ(stats.foreign_tokens_total(), 0u);
  EXPECT_EQ(stats.locks_held(), 1u);
  EXPECT_EQ(stats.sessions(), 1u);
}

TEST_F(SessionBindingTest, OnlyTheSessionsOwnSecretResumesItAndTheOldConnectionLosesIt) {
  RawConnection a = RawConnection::Tcp(lockd_.port());
  const wire::OpenSessionReply first = Open(a);
  RawConnection b = RawConnection::Tcp(lockd_.port());
  const wire::OpenSessionReply second = Open(b);
  EXPECT_EQ(first.secret().size(), 16u);
  EXPECT_NE(first.secret(), second.secret());

  RawConnection c = RawConnection::Tcp(lockd_.port());
  c.Hello();
  // Another session's secret, a guess, nothing: refused.
  for (const std::string& wrong : {second.secret(), std::string(16, '\0'), std::string()}) {
    EXPECT_EQ(c.Call(Resume(first.session_id(), wrong)).code(), wire::PERMISSION_DENIED);
  }
  EXPECT_EQ(c.Call(Resume(999, first.secret())).code(), wire::SESSION_NOT_FOUND);
  // Its own: c now drives the session, and a does not.
  const wire::Response resumed = c.Call(Resume(first.session_id(), first.secret()));
  ASSERT_EQ(resumed.code(), wire::OK) << resumed.message();
  EXPECT_EQ(resumed.resume_session().session_ttl_ms(), 60000u);
  EXPECT_EQ(c.Call(request::Acquire(first.session_id(), "x")).code(), wire::OK);
  EXPECT_EQ(a.Call(request::Acquire(first.session_id(), "y")).code(), wire::PERMISSION_DENIED);
  EXPECT_EQ(Stats().permission_denied_total(), 4u);
}

TEST_F(SessionBindingTest, AUnixSocketSessionBelongsToItsUserIdAndIsResumedAcrossARestart) {
  RawConnection unix_conn = RawConnection::Unix(lockd_.unix_path());
  const wire::OpenSessionReply opened = Open(unix_conn);
  const uint64_t token =
      unix_conn.Call(request::Acquire(opened.session_id(), "payout/9")).acquire().token();
  // The secret is not enough over TCP, where the peer has no identity: the session is uid's.
  RawConnection tcp = RawConnection::Tcp(lockd_.port());
  tcp.Hello();
  const wire::Response over_tcp = tcp.Call(Resume(opened.session_id(), opened.secret()));
  EXPECT_EQ(over_tcp.code(), wire::PERMISSION_DENIED);
  EXPECT_THAT(over_tcp.message(), HasSubstr("by this identity"));

  // The owner and its secret survive a restart; every restored session must be resumed.
  lockd_.Restart();
  RawConnection again = RawConnection::Unix(lockd_.unix_path());
  again.Hello();
  EXPECT_EQ(again.Call(KeepAlive(opened.session_id(), "payout/9", token)).code(),
            wire::PERMISSION_DENIED);
  ASSERT_EQ(again.Call(Resume(opened.session_id(), opened.secret())).code(), wire::OK);
  const wire::Response renewed = again.Call(KeepAlive(opened.session_id(), "payout/9", token));
  ASSERT_EQ(renewed.code(), wire::OK) << renewed.message();
  EXPECT_EQ(renewed.keep_alive().lock_codes(0), wire::OK);
}

// The client library resumes its session after a reconnect, so its locks survive a restart of
// lockd; nothing it does is ever refused.
TEST_F(SessionBindingTest, TheClientResumesItsSessionAfterLockdRestarts) {
  ClientOptions options;
  options.server = lockd_.tcp_address();
  options.session_ttl = absl::Seconds(30);
  options.heartbeat_interval = absl::Hours(1);  // the test drives the heartbeats
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto lock = (*client)->acquire("payout/5", absl::Seconds(5), absl::Seconds(30));
  ASSERT_TRUE(lock.ok()) << lock.status();
  const uint64_t session = (*client)->sessionId();
  lockd_.Restart();
  // The first heartbeat meets the closed connection, reconnects, resumes and renews.
  absl::Status renewed = (*client)->renewNow();
  if (!renewed.ok()) renewed = (*client)->renewNow();
  ASSERT_TRUE(renewed.ok()) << renewed;
  EXPECT_EQ((*client)->sessionId(), session);
  EXPECT_NO_THROW((*client)->checkStillHeld(*lock));
  EXPECT_TRUE((*client)->release(*lock).ok());
  EXPECT_EQ(Stats().permission_denied_total(), 0u);
}

}  // namespace
}  // namespace fencelock
