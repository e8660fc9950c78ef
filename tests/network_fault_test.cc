// The client's lease on the real boot-time clock, with a userspace proxy misbehaving between
// the client and lockd: a stalled reply does not extend the deadline, and dropped heartbeats
// make checkStillHeld throw before lockd expires the session. The assertions are about order
// and bounds derived from the protocol, not about how fast this machine is.
#include <thread>

#include "harness/fault_proxy.h"
#include "harness/stalled_renewal.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"

namespace fencelock {
namespace {

using Dir = harness::FaultProxy::Direction;
using Mode = harness::FaultProxy::Mode;

TEST(NetworkFaultTest, TwoSecondStalledReplyDoesNotExtendTheDeadline) {
  testing::LockdProcess lockd;
  harness::FaultProxy proxy(lockd.port());
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

  auto stalled = harness::RenewThroughStall(proxy, **client, *lock, absl::Seconds(2));
  ASSERT_TRUE(stalled.ok()) << stalled.status();
  // Measured from the send: at most seen_by_proxy + 21 s. Measured from the reply, it would be
  // at least 2 s later than that.
  EXPECT_LE(stalled->deadline, stalled->seen_by_proxy + usable)
      << "deadline is " << absl::FormatDuration(stalled->deadline - (stalled->seen_by_proxy + usable))
      << " past send + usable lease";
}

TEST(NetworkFaultTest, DroppedHeartbeatsEndTheLockOnTheClientBeforeLockdExpiresTheSession) {
  testing::LockdProcess lockd;
  harness::FaultProxy proxy(lockd.port());
  ClientOptions options;
  options.server = "127.0.0.1:" + std::to_string(proxy.port());
  options.session_ttl = absl::Seconds(1);  // lockd expires the session 1 s after the last renewal
  // Long enough for the durable OpenSession and Acquire on a loaded machine. A dropped
  // heartbeat then waits this long, which does not matter: the client's deadline, not the
  // heartbeat's failure, ends the lock.
  options.request_timeout = absl::Seconds(2);
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
