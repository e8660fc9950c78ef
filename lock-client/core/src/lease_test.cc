// D1, D3 and D5 on a simulated clock, at the level of the lease arithmetic. The same rules
// through real sockets and a real lockd are in tests/client_lease_test.cc.
#include "lock-client/core/lease.h"

#include "gtest/gtest.h"

namespace fencelock::client_internal {
namespace {

constexpr double kMargin = 0.30;

TEST(UsableDeadlineTest, IsSendPlusTtlTimesOneMinusMargin) {
  const MonoTime t_send = MonoTime::FromNanos(5'000'000'000);
  EXPECT_EQ(UsableDeadline(t_send, absl::Seconds(30), kMargin),
            t_send + absl::Seconds(21));
  EXPECT_EQ(UsableDeadline(t_send, absl::Seconds(15), kMargin),
            t_send + absl::Milliseconds(10500));
}

TEST(LeaseStateTest, HeldStrictlyBeforeDeadline) {
  SimulatedClock clock;
  const MonoTime deadline = clock.Now() + absl::Seconds(21);
  LeaseState lease("x", 7, absl::Seconds(30), deadline);
  EXPECT_EQ(lease.Check(clock.Now()), LossReason::kNone);
  clock.Set(deadline - absl::Nanoseconds(1));
  EXPECT_EQ(lease.Check(clock.Now()), LossReason::kNone);
  clock.Set(deadline);
  EXPECT_EQ(lease.Check(clock.Now()), LossReason::kDeadlinePassed);
}

TEST(LeaseStateTest, StalledReplyDoesNotMoveDeadlineBeyondSendPlusUsable) {
  // A renewal written at t=10 s whose reply arrives at t=12 s: the deadline is measured from 10 s.
  SimulatedClock clock;
  const MonoTime start = clock.Now();
  LeaseState lease("x", 1, absl::Seconds(30), UsableDeadline(start, absl::Seconds(30), kMargin));
  clock.Advance(absl::Seconds(10));
  const MonoTime t_send = clock.Now();
  clock.Advance(absl::Seconds(2));  // the reply is stalled for 2 s
  ASSERT_TRUE(lease.Extend(UsableDeadline(t_send, absl::Seconds(30), kMargin), clock.Now()));
  EXPECT_EQ(lease.deadline(), start + absl::Seconds(10 + 21));
}

TEST(LeaseStateTest, LaterSuccessNeverMovesDeadlineEarlier) {
  SimulatedClock clock;
  const MonoTime t0 = clock.Now();
  LeaseState lease("x", 1, absl::Seconds(30), UsableDeadline(t0, absl::Seconds(30), kMargin));
  // Two renewals in flight: sent at t0+5 and t0+3; the later-sent one is answered first.
  ASSERT_TRUE(lease.Extend(UsableDeadline(t0 + absl::Seconds(5), absl::Seconds(30), kMargin),
                           t0 + absl::Seconds(6)));
  ASSERT_TRUE(lease.Extend(UsableDeadline(t0 + absl::Seconds(3), absl::Seconds(30), kMargin),
                           t0 + absl::Seconds(7)));
  EXPECT_EQ(lease.deadline(), t0 + absl::Seconds(26));
}

TEST(LeaseStateTest, RenewalAnsweredAfterDeadlineDoesNotRevive) {
  SimulatedClock clock;
  const MonoTime t0 = clock.Now();
  LeaseState lease("x", 1, absl::Seconds(1), t0 + absl::Milliseconds(700));
  // Sent at 600 ms, answered at 800 ms: the lease ran out at 700 ms and stays lost.
  EXPECT_FALSE(lease.Extend(t0 + absl::Milliseconds(600 + 700), t0 + absl::Milliseconds(800)));
  EXPECT_EQ(lease.Check(t0 + absl::Milliseconds(801)), LossReason::kDeadlinePassed);
  EXPECT_EQ(lease.Check(t0), LossReason::kDeadlinePassed);  // even if asked "earlier"
}

TEST(LeaseStateTest, LostIsStickyAndFirstReasonWins) {
  SimulatedClock clock;
  LeaseState lease("x", 1, absl::Seconds(30), clock.Now() + absl::Seconds(21));
  lease.MarkLost(LossReason::kFencedOut);
  lease.MarkLost(LossReason::kReleased);
  EXPECT_EQ(lease.Check(clock.Now()), LossReason::kFencedOut);
  EXPECT_FALSE(lease.Extend(clock.Now() + absl::Hours(1), clock.Now()));
  EXPECT_EQ(lease.Check(clock.Now()), LossReason::kFencedOut);
}

}  // namespace
}  // namespace fencelock::client_internal
