// Bad input against a real lockd process: every case gets a clear error and only the
// offending connection is closed, while another client's session keeps working.
#include <memory>

#include "fencelock/wire.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protocol/version.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "protocol/session.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

class ProtocolErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClientOptions options;
    options.server = lockd_.tcp_address();
    auto client = Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    bystander_ = std::move(*client);
    auto lock = bystander_->acquire("bystander", absl::Seconds(5));
    ASSERT_TRUE(lock.ok()) << lock.status();
    held_ = *lock;
  }

  // The other client's session, lock and connection are untouched by the bad connection.
  void ExpectBystanderStillWorks() {
    EXPECT_TRUE(bystander_->renewNow().ok());
    EXPECT_NO_THROW(bystander_->checkStillHeld(held_));
    EXPECT_TRUE(bystander_->release(held_).ok());
    auto again = bystander_->acquire("bystander", absl::Seconds(5));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_GT(again->token(), held_.token());
  }

  uint64_t ProtocolErrors() {
    RawConnection admin = RawConnection::Tcp(lockd_.port());
    admin.Hello();
    const wire::Request stats = testing::request::GetStats();
    return admin.Call(stats).stats().protocol_errors_total();
  }

  LockdProcess lockd_;
  std::unique_ptr<Client> bystander_;
  LockHandle held_;
};

TEST_F(ProtocolErrorTest, MalformedFrameIsAnsweredAndOnlyThatConnectionCloses) {
  RawConnection bad = RawConnection::Tcp(lockd_.port());
  ASSERT_EQ(bad.Hello().code(), wire::OK);
  std::string frame;
  ASSERT_TRUE(protocol::AppendFrame("\xff\xff\xff\xff garbage", &frame).ok());
  ASSERT_TRUE(bad.SendBytes(frame));
  auto reply = bad.ReadResponse();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->code(), wire::MALFORMED_REQUEST);
  EXPECT_THAT(reply->message(), HasSubstr("does not parse"));
  EXPECT_TRUE(bad.ClosedByPeer());
  ExpectBystanderStillWorks();
  EXPECT_EQ(ProtocolErrors(), 1u);
}

TEST_F(ProtocolErrorTest, OversizeFrameIsRefusedWithoutReadingIt) {
  RawConnection bad = RawConnection::Tcp(lockd_.port());
  ASSERT_EQ(bad.Hello().code(), wire::OK);
  // Announces 2 MiB, sends a little of it.
  ASSERT_TRUE(bad.SendBytes(std::string("\x00\x20\x00\x00", 4) + std::string(1000, 'x')));
  auto reply = bad.ReadResponse();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->code(), wire::FRAME_TOO_LARGE);
  EXPECT_THAT(reply->message(), HasSubstr("2097152 bytes; the maximum is 1048576"));
  EXPECT_TRUE(bad.ClosedByPeer());
  ExpectBystanderStillWorks();
}

TEST_F(ProtocolErrorTest, WrongProtocolVersionNamesBothRanges) {
  RawConnection bad = RawConnection::Tcp(lockd_.port());
  wire::Response reply = bad.Call(protocol::HelloRequest("raw-test", {.min = 7, .max = 9}));
  EXPECT_EQ(reply.code(), wire::UNSUPPORTED_VERSION);
  EXPECT_THAT(reply.message(),
              HasSubstr(absl::StrCat("client speaks versions [7, 9], server speaks [1, ",
                                     protocol::kMaxProtocolVersion, "]")));
  EXPECT_TRUE(bad.ClosedByPeer());
  ExpectBystanderStillWorks();
}

TEST_F(ProtocolErrorTest, RequestBeforeHelloIsRefused) {
  RawConnection bad = RawConnection::Tcp(lockd_.port());
  wire::Response reply = bad.Call(testing::request::OpenSession(absl::Seconds(1)));
  EXPECT_EQ(reply.code(), wire::HELLO_REQUIRED);
  EXPECT_THAT(reply.message(), HasSubstr("must be Hello"));
  EXPECT_TRUE(bad.ClosedByPeer());
  ExpectBystanderStillWorks();
}

TEST_F(ProtocolErrorTest, UnknownMessageTypeIsRefused) {
  RawConnection bad = RawConnection::Tcp(lockd_.port());
  ASSERT_EQ(bad.Hello().code(), wire::OK);
  // request_id = 5 (field 1, varint), then field 99 (length-delimited, empty): a message type
  // this server does not know.
  std::string payload = std::string("\x08\x05", 2) + std::string("\x9a\x06\x00", 3);
  std::string frame;
  ASSERT_TRUE(protocol::AppendFrame(payload, &frame).ok());
  ASSERT_TRUE(bad.SendBytes(frame));
  auto reply = bad.ReadResponse();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->request_id(), 5u);
  EXPECT_EQ(reply->code(), wire::MALFORMED_REQUEST);
  EXPECT_THAT(reply->message(), HasSubstr("unknown message type"));
  EXPECT_TRUE(bad.ClosedByPeer());
  ExpectBystanderStillWorks();
}

TEST_F(ProtocolErrorTest, BadArgumentsAreErrorsThatKeepTheConnection) {
  RawConnection conn = RawConnection::Tcp(lockd_.port());
  const uint64_t session = conn.HelloAndOpenSession(absl::Seconds(10));
  wire::Response reply = conn.Call(testing::request::Acquire(session, ""));
  EXPECT_EQ(reply.code(), wire::INVALID_ARGUMENT);
  EXPECT_THAT(reply.message(), HasSubstr("lock name"));
  EXPECT_EQ(conn.Call(testing::request::KeepAlive(session + 1000)).code(), wire::SESSION_NOT_FOUND);
  // Still usable.
  reply = conn.Call(testing::request::Acquire(session, "fine"));
  EXPECT_EQ(reply.code(), wire::OK);
  EXPECT_TRUE(reply.acquire().granted());
  ExpectBystanderStillWorks();
}

TEST_F(ProtocolErrorTest, RenewIsRefusedOnAnOlderConnectionAndBoundedOnANewOne) {
  RawConnection old = RawConnection::Tcp(lockd_.port());
  ASSERT_EQ(old.Call(protocol::HelloRequest("raw-test", {.min = 1, .max = 5})).code(), wire::OK);
  wire::Response opened = old.Call(testing::request::OpenSession(absl::Seconds(10)));
  ASSERT_EQ(opened.code(), wire::OK);
  const uint64_t old_session = opened.open_session().session_id();
  wire::Response reply = old.Call(testing::request::Renew({old_session}));
  EXPECT_EQ(reply.code(), wire::UNSUPPORTED_VERSION);
  EXPECT_THAT(reply.message(), HasSubstr("Renew needs protocol version 6"));
  EXPECT_FALSE(old.ClosedByPeer());

  RawConnection conn = RawConnection::Tcp(lockd_.port());
  const uint64_t session = conn.HelloAndOpenSession(absl::Seconds(10));
  // No session, or another connection's: refused per session, the others renewed.
  reply = conn.Call(testing::request::Renew({session, old_session, session + 1000}));
  ASSERT_EQ(reply.code(), wire::OK);
  ASSERT_EQ(reply.renew().sessions_size(), 3);
  EXPECT_EQ(reply.renew().sessions(0).code(), wire::OK);
  EXPECT_EQ(reply.renew().sessions(0).session_ttl_ms(), 10'000u);
  EXPECT_EQ(reply.renew().sessions(1).code(), wire::PERMISSION_DENIED);
  EXPECT_EQ(reply.renew().sessions(2).code(), wire::SESSION_NOT_FOUND);
  wire::Request empty;
  empty.mutable_renew();
  reply = conn.Call(empty);
  EXPECT_EQ(reply.code(), wire::INVALID_ARGUMENT);
  EXPECT_THAT(reply.message(), HasSubstr("a Renew names 1 to"));
  wire::Request many;
  for (int i = 0; i < 100'000; ++i) many.mutable_renew()->add_sessions()->set_session_id(i + 1);
  reply = conn.Call(many);
  EXPECT_EQ(reply.code(), wire::INVALID_ARGUMENT);
  EXPECT_THAT(reply.message(), HasSubstr("--max-sessions-per-connection"));
  // A grant named in `confirm` is confirmed (lock_service_test: renewed from then on).
  reply = conn.Call(testing::request::Acquire(session, "confirmed"));
  ASSERT_TRUE(reply.acquire().granted());
  wire::Request confirm = testing::request::Renew({session});
  auto* ref = confirm.mutable_renew()->mutable_sessions(0)->add_confirm();
  ref->set_lock("confirmed");
  ref->set_token(reply.acquire().token());
  reply = conn.Call(confirm);
  EXPECT_EQ(reply.renew().sessions(0).code(), wire::OK);
  EXPECT_EQ(reply.renew().sessions(0).held(), 1u);
  // A session named twice would renew its locks twice for one frame: refused.
  reply = conn.Call(testing::request::Renew({session, session}));
  EXPECT_EQ(reply.code(), wire::INVALID_ARGUMENT);
  EXPECT_THAT(reply.message(), HasSubstr("more than once"));
  ExpectBystanderStillWorks();
}

TEST(ClientCreateTest, RefusesBadOptionsAndUnreachableServer) {
  ClientOptions bad_margin;
  bad_margin.safety_margin = 1.0;
  auto c = Client::Create(bad_margin);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("safety-margin"));

  ClientOptions bad_address;
  bad_address.server = "127.0.0.1:notaport";
  EXPECT_EQ(Client::Create(bad_address).status().code(), absl::StatusCode::kInvalidArgument);

  LockdProcess lockd;
  const int port = lockd.port();
  lockd.Stop();
  ClientOptions gone;
  gone.server = "127.0.0.1:" + std::to_string(port);
  EXPECT_EQ(Client::Create(gone).status().code(), absl::StatusCode::kUnavailable);
}

TEST(UnixSocketTest, ClientAndProtocolErrorsOverUnixSocket) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  ClientOptions options;
  options.server = lockd.unix_address();
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto lock = (*client)->acquire("u", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();

  RawConnection bad = RawConnection::Unix(lockd.unix_path());
  EXPECT_EQ(bad.Call(testing::request::OpenSession(absl::ZeroDuration())).code(), wire::HELLO_REQUIRED);
  EXPECT_TRUE(bad.ClosedByPeer());

  EXPECT_TRUE((*client)->renewNow().ok());
  EXPECT_NO_THROW((*client)->checkStillHeld(*lock));
  EXPECT_TRUE((*client)->release(*lock).ok());
}

// lockd reads a plaintext connection once per readiness event (edge-triggered, its own epoll
// set). Requests written at once that fill more than one read, or that lockd stops reading
// while 256 of them wait for the disk, must still all be answered: nothing may wait for an
// event that already came. The client reads nothing until it has sent everything, so the
// replies are kept small (under 1 MB in all): past lockd's 2 MiB of unread replies it would
// rightly stop reading this connection, and the test would deadlock on its own design.
void ExpectAPipelineBeyondOneReadIsAnswered(RawConnection conn) {
  const uint64_t session = conn.HelloAndOpenSession(absl::Seconds(60));
  std::vector<wire::Request> requests;
  constexpr int kAcquires = 600;  // durable: past the 256 replies held for the disk
  for (int i = 0; i < kAcquires; ++i) {
    // Long names make big requests; the grants that answer them are small.
    requests.push_back(request::Acquire(session, "pipe/" + std::string(480, 'x') + std::to_string(i)));
    for (int v = 0; v < 8; ++v) requests.push_back(request::Validate("v", 1));
  }
  size_t bytes = 0;
  for (const wire::Request& r : requests) bytes += r.ByteSizeLong() + 4;
  ASSERT_GT(bytes, size_t{3} * 64 * 1024);  // several of lockd's 64 KiB reads
  const std::vector<wire::Response> replies = conn.Pipeline(requests);
  ASSERT_EQ(replies.size(), requests.size());
  int granted = 0;
  size_t reply_bytes = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    reply_bytes += replies[i].ByteSizeLong() + 4;
    if (requests[i].has_acquire() && replies[i].code() == wire::OK &&
        replies[i].acquire().granted()) {
      ++granted;
    }
  }
  EXPECT_EQ(granted, kAcquires);
  EXPECT_LT(reply_bytes, size_t{1} << 20);
}

TEST(ReadPathTest, APipelineBeyondOneReadIsAnsweredOverTcp) {
  LockdProcess lockd;
  ExpectAPipelineBeyondOneReadIsAnswered(RawConnection::Tcp(lockd.port()));
}

TEST(ReadPathTest, APipelineBeyondOneReadIsAnsweredOverAUnixSocket) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  ExpectAPipelineBeyondOneReadIsAnswered(RawConnection::Unix(lockd.unix_path()));
}

}  // namespace
}  // namespace fencelock
