#include "clock/clock.h"

#include "gtest/gtest.h"

namespace fencelock {
namespace {

TEST(MonoTimeTest, ArithmeticRoundTrips) {
  MonoTime t = MonoTime::FromNanos(1000);
  EXPECT_EQ((t + absl::Milliseconds(2)).nanos(), 2'001'000);
  EXPECT_EQ((t + absl::Milliseconds(2)) - t, absl::Milliseconds(2));
  EXPECT_EQ((t - absl::Nanoseconds(1000)).nanos(), 0);
  EXPECT_LT(t, t + absl::Nanoseconds(1));
}

TEST(MonoTimeTest, SaturatesInsteadOfWrapping) {
  EXPECT_EQ(MonoTime::Max() + absl::Seconds(1), MonoTime::Max());
  EXPECT_EQ(MonoTime::Min() - absl::Seconds(1), MonoTime::Min());
  EXPECT_EQ(MonoTime::Max() + absl::InfiniteDuration(), MonoTime::Max());
}

TEST(ClockTest, RealClockDoesNotGoBackwards) {
  MonoTime previous = Clock::Real()->Now();
  for (int i = 0; i < 10000; ++i) {
    MonoTime now = Clock::Real()->Now();
    ASSERT_GE(now, previous);
    previous = now;
  }
}

TEST(SimulatedClockTest, MovesOnlyWhenTold) {
  SimulatedClock clock(MonoTime::FromNanos(5));
  EXPECT_EQ(clock.Now().nanos(), 5);
  EXPECT_EQ(clock.Now().nanos(), 5);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(clock.Now().nanos(), 2'000'000'005);
  clock.Set(MonoTime::FromNanos(3'000'000'000));
  EXPECT_EQ(clock.Now().nanos(), 3'000'000'000);
}

TEST(SimulatedClockDeathTest, RefusesToGoBackwards) {
  SimulatedClock clock(MonoTime::FromNanos(100));
  EXPECT_DEATH(clock.Set(MonoTime::FromNanos(99)), "backwards");
  EXPECT_DEATH(clock.Advance(absl::Seconds(-1)), "negative");
}

}  // namespace
}  // namespace fencelock
