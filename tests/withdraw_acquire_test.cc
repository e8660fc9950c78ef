// WithdrawAcquire (protocol version 3) against a real lockd over real sockets: a queued Acquire
// is taken out of its lock's queue at its own connection's asking, answered CANCELLED under its
// own request id, and never granted; a stranger naming it changes nothing; a connection that
// negotiated an older version is told so and keeps working.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lockd_process.h"
#include "protocol/session.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

class WithdrawAcquireTest : public ::testing::Test {
 protected:
  wire::StatsReply Stats() {
    RawConnection admin = RawConnection::Tcp(lockd_.port());
    admin.Hello();
    return admin.Call(request::GetStats()).stats();
  }
  // Reads replies until both `a` and `b` have come, in either order.
  static std::pair<wire::Response, wire::Response> ReadBoth(RawConnection& conn, uint64_t a,
                                                           uint64_t b) {
    std::optional<wire::Response> ra, rb;
    while (!ra || !rb) {
      auto r = conn.ReadResponse();
      if (!r) {
        ADD_FAILURE() << "no reply for " << (ra ? b : a);
        return {};
      }
      if (r->request_id() == a) ra = *r;
      if (r->request_id() == b) rb = *r;
    }
    return {*ra, *rb};
  }

  LockdProcess lockd_;
};

TEST_F(WithdrawAcquireTest, AWithdrawnWaiterIsAnsweredCancelledAndNeverGranted) {
  RawConnection holder = RawConnection::Tcp(lockd_.port());
  const uint64_t holder_session = holder.HelloAndOpenSession(absl::Seconds(60));
  const uint64_t token =
      holder.Call(request::Acquire(holder_session, "w")).acquire().token();
  ASSERT_GT(token, 0u);

  RawConnection waiter = RawConnection::Tcp(lockd_.port());
  const uint64_t session = waiter.HelloAndOpenSession(absl::Seconds(60));
  wire::Request acquire = request::Acquire(session, "w", absl::Seconds(60));
  acquire.set_request_id(7);
  ASSERT_TRUE(waiter.SendRequest(acquire));
  EXPECT_FALSE(waiter.ReadResponse(absl::Milliseconds(200)).has_value());  // it queues
  EXPECT_EQ(Stats().waiters(), 1u);

  // A stranger: naming the waiter's session is refused; naming request 7 for a session of its
  // own finds nothing (request ids are each connection's own). The waiter still waits.
  RawConnection stranger = RawConnection::Tcp(lockd_.port());
  const uint64_t stranger_session = stranger.HelloAndOpenSession(absl::Seconds(60));
  wire::Response refused = stranger.Call(request::WithdrawAcquire(session, 7));
  EXPECT_EQ(refused.code(), wire::PERMISSION_DENIED) << refused.message();
  wire::Response none = stranger.Call(request::WithdrawAcquire(stranger_session, 7));
  EXPECT_EQ(none.code(), wire::OK) << none.message();
  EXPECT_FALSE(none.withdraw_acquire().withdrawn());
  EXPECT_EQ(Stats().waiters(), 1u);

  wire::Request withdraw = request::WithdrawAcquire(session, 7);
  withdraw.set_request_id(8);
  ASSERT_TRUE(waiter.SendRequest(withdraw));
  auto [acquired, withdrew] = ReadBoth(waiter, 7, 8);
  EXPECT_EQ(withdrew.code(), wire::OK) << withdrew.message();
  EXPECT_TRUE(withdrew.withdraw_acquire().withdrawn());
  EXPECT_EQ(acquired.code(), wire::CANCELLED);
  EXPECT_THAT(acquired.message(), HasSubstr("withdrawn by its client"));
  EXPECT_EQ(Stats().waiters(), 0u);

  // Once released, the lock goes to nobody: the withdrawn wait is not granted later.
  const uint64_t grants = Stats().grants_total();
  ASSERT_EQ(holder.Call(request::Release(holder_session, "w", token)).code(), wire::OK);
  EXPECT_FALSE(waiter.ReadResponse(absl::Milliseconds(300)).has_value());
  EXPECT_EQ(Stats().grants_total(), grants);
  wire::Response free = stranger.Call(request::Acquire(stranger_session, "w"));
  EXPECT_TRUE(free.acquire().granted());

  // Withdrawing again, or an Acquire that was granted at once, is no error: withdrawn = false.
  wire::Response again = waiter.Call(request::WithdrawAcquire(session, 7));
  EXPECT_EQ(again.code(), wire::OK);
  EXPECT_FALSE(again.withdraw_acquire().withdrawn());
}

// Issue 33: an Acquire sent with the request id of one still waiting replaced it in lockd's
// index, and a session resumed on another connection left its waiter behind; neither waiter
// could be withdrawn any more. Now the second Acquire is refused, and resuming elsewhere
// cancels the session's waiters, answered on the connection that sent them.
TEST_F(WithdrawAcquireTest, NoWaitingAcquireIsLeftThatCannotBeWithdrawn) {
  RawConnection holder = RawConnection::Tcp(lockd_.port());
  const uint64_t holder_session = holder.HelloAndOpenSession(absl::Seconds(60));
  ASSERT_TRUE(holder.Call(request::Acquire(holder_session, "w")).acquire().granted());

  RawConnection a = RawConnection::Tcp(lockd_.port());
  a.Hello();
  const wire::Response opened = a.Call(request::OpenSession(absl::Seconds(60)));
  ASSERT_EQ(opened.code(), wire::OK);
  const uint64_t session = opened.open_session().session_id();
  wire::Request first = request::Acquire(session, "w", absl::Seconds(60));
  first.set_request_id(7);
  ASSERT_TRUE(a.SendRequest(first));
  EXPECT_FALSE(a.ReadResponse(absl::Milliseconds(200)).has_value());  // it queues
  wire::Request again = request::Acquire(session, "w2", absl::Seconds(60));
  again.set_request_id(7);
  ASSERT_TRUE(a.SendRequest(again));
  std::optional<wire::Response> refused = a.ReadResponse();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), wire::INVALID_ARGUMENT);
  EXPECT_THAT(refused->message(), HasSubstr("request id 7 already names an Acquire that waits"));
  EXPECT_EQ(Stats().waiters(), 1u);

  // The session moves to connection B (its client reconnected; A is still open).
  RawConnection b = RawConnection::Tcp(lockd_.port());
  b.Hello();
  ASSERT_EQ(b.Call(request::Resume(session, opened.open_session().secret())).code(), wire::OK);
  std::optional<wire::Response> cancelled = a.ReadResponse();
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->request_id(), 7u);
  EXPECT_EQ(cancelled->code(), wire::CANCELLED);
  EXPECT_THAT(cancelled->message(), HasSubstr("resumed on another connection"));
  EXPECT_EQ(Stats().waiters(), 0u);
  // Withdrawing it from B finds nothing waiting; the lock, once free, goes to nobody.
  wire::Response none = b.Call(request::WithdrawAcquire(session, 7));
  EXPECT_EQ(none.code(), wire::OK) << none.message();
  EXPECT_FALSE(none.withdraw_acquire().withdrawn());
}

TEST_F(WithdrawAcquireTest, AnOlderVersionIsToldAndKeepsItsConnection) {
  RawConnection old = RawConnection::Tcp(lockd_.port());
  ASSERT_EQ(old.Call(protocol::HelloRequest("raw-test", {.min = 1, .max = 2})).hello().version(),
            2u);
  const uint64_t session = old.Call(request::OpenSession(absl::Seconds(60))).open_session().session_id();
  wire::Response refused = old.Call(request::WithdrawAcquire(session, 1));
  EXPECT_EQ(refused.code(), wire::UNSUPPORTED_VERSION);
  EXPECT_THAT(refused.message(), HasSubstr("needs protocol version 3"));
  EXPECT_TRUE(old.Call(request::Acquire(session, "still-works")).acquire().granted());
}

}  // namespace
}  // namespace fencelock
