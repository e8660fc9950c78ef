// The client's lease on the real boot-time clock, with a userspace proxy misbehaving between
// the client and lockd: a stalled reply does not extend the deadline, and dropped heartbeats
// make checkStillHeld throw before lockd expires the session. The assertions are about order
// and bounds derived from the protocol, not about how fast this machine is.
#include <thread>

#include "fault_proxy.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"

namespace fencelock {
namespace {

using Dir = testing::FaultProxy::Direction;
using Mode = testing::FaultProxy::Mode;

TEST(NetworkFaultTest, TwoSecondStalledReplyDoesNotExtendTheDeadline) {
  testing::LockdProcess lockd;
  testing::FaultProxy proxy(lockd.port());
  ClientOptions options;
  options.server = "127.0.0.1:" + std::to_string(proxy.port());
  options.session_ttl = absl::Seconds(60);
  options.default_lock_ttl = absl::Seconds(30);
  options.heartbeat_interval = absl::Hours(1);  // only the renewal below
  const absl::Duration usable = absl::Seconds(21);
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto lock = (*client)->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok());

  proxy.Set(Dir::kToClient, Mode::kHold);
  const uint64_t upstream = proxy.bytes_read(Dir::kToServer);
  absl::Status renewed;
  std::thread heartbeat([&] { renewed = (*client)->renewNow(); });
  // t_send is read before the bytes reach the proxy, so it is no later than this moment.
  while (proxy.bytes_read(Dir::kToServer) == upstream) absl::SleepFor(absl::Microseconds(200));
  const MonoTime seen_by_proxy = Clock::Real()->Now();
  while (proxy.bytes_held(Dir::kToClient) == 0) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Seconds(2));
  proxy.Release(Dir::kToClient);
  heartbeat.join();
  ASSERT_TRUE(renewed.ok()) << renewed;

  const absl::Duration left = (*client)->remaining(*lock);
  const MonoTime deadline_at_most = Clock::Real()->Now() + left;
  // Measured from the send: at most seen_by_proxy + 21 s. Measured from the reply, it would be
  // at least 2 s later than that.
  EXPECT_LE(deadline_at_most, seen_by_proxy + usable)
      << "deadline is " << absl::FormatDuration(deadline_at_most - (seen_by_proxy + usable))
      << " past send + usable lease";
}

TEST(NetworkFaultTest, DroppedHeartbeatsEndTheLockOnTheClientBeforeLockdExpiresTheSession) {
  testing::LockdProcess lockd;
  testing::FaultProxy proxy(lockd.port());
  ClientOptions options;
  options.server = "127.0.0.1:" + std::to_string(proxy.port());
  options.session_ttl = absl::Seconds(1);  // lockd expires the session 1 s after the last renewal
  options.request_timeout = absl::Milliseconds(200);
  auto client = Client::Create(options);  // heartbeat every 333 ms; usable lease 700 ms
  ASSERT_TRUE(client.ok()) << client.status();
  auto lock = (*client)->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok());

  ClientOptions direct;
  direct.server = lockd.tcp_address();
  auto rival = Client::Create(direct);
  ASSERT_TRUE(rival.ok());

  proxy.Set(Dir::kToServer, Mode::kDrop);  // heartbeats no longer arrive
  const MonoTime dropped = Clock::Real()->Now();
  MonoTime client_gave_up = MonoTime::Max();
  std::thread watch([&] {
    for (;;) {
      try {
        (*client)->checkStillHeld(*lock);
      } catch (const LockLostException& e) {
        EXPECT_EQ(e.reason(), LossReason::kDeadlinePassed);
        client_gave_up = Clock::Real()->Now();
        return;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  });
  auto taken = (*rival)->acquire("x", absl::Seconds(10));  // granted when lockd expires it
  const MonoTime server_expired = Clock::Real()->Now();
  ASSERT_TRUE(taken.ok()) << taken.status();
  // By the time another holder exists, the old holder's check has already thrown.
  EXPECT_THROW((*client)->checkStillHeld(*lock), LockLostException);
  watch.join();
  std::printf("drop -> client gave up: %s; drop -> lockd granted the rival: %s\n",
              absl::FormatDuration(client_gave_up - dropped).c_str(),
              absl::FormatDuration(server_expired - dropped).c_str());
  EXPECT_LT(client_gave_up, server_expired);
}

}  // namespace
}  // namespace fencelock
