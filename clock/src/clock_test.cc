#include "clock/clock.h"

#include <string>
#include <vector>

#include "clock/time_source.h"

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

TEST(ManualTimeSourceTest, TimersRunAtTheirTimesInOrder) {
  ManualTimeSource time;
  const MonoTime start = time.Now();
  std::vector<std::string> ran;
  auto a = time.NewTimer();
  auto b = time.NewTimer();
  auto c = time.NewTimer();
  b->ArmAt(start + absl::Seconds(2), [&] { ran.push_back("b@" + std::to_string((time.Now() - start) / absl::Seconds(1))); });
  a->ArmAt(start + absl::Seconds(1), [&] { ran.push_back("a@" + std::to_string((time.Now() - start) / absl::Seconds(1))); });
  c->ArmAt(start + absl::Seconds(3), [&] { ran.push_back("c"); });
  c->Cancel();
  time.Post([&] { ran.push_back("posted"); });
  EXPECT_EQ(time.Advance(absl::Seconds(5)), 3);
  EXPECT_EQ(ran, (std::vector<std::string>{"posted", "a@1", "b@2"}));
  EXPECT_EQ(time.Now(), start + absl::Seconds(5));
  EXPECT_EQ(c->armed_for(), MonoTime::Max());
}

TEST(ManualTimeSourceTest, RearmingReplacesAndDestroyingCancels) {
  ManualTimeSource time;
  int fired = 0;
  auto t = time.NewTimer();
  t->ArmAt(time.Now() + absl::Seconds(1), [&] { fired += 1; });
  t->ArmAt(time.Now() + absl::Seconds(2), [&] { fired += 10; });
  EXPECT_EQ(t->armed_for(), time.Now() + absl::Seconds(2));
  time.Advance(absl::Seconds(3));
  EXPECT_EQ(fired, 10);
  t->ArmAt(time.Now() + absl::Seconds(1), [&] { fired += 100; });
  t.reset();
  time.Advance(absl::Seconds(3));
  EXPECT_EQ(fired, 10);
  EXPECT_EQ(time.NextEventAt(), MonoTime::Max());
}

TEST(ManualTimeSourceTest, FreezeRunsNothingUntilTheOwnerRunsAgain) {
  ManualTimeSource time;
  const MonoTime start = time.Now();
  MonoTime seen;
  auto t = time.NewTimer();
  t->ArmAt(start + absl::Seconds(1), [&] { seen = time.Now(); });
  time.Freeze(absl::Seconds(10));
  EXPECT_EQ(seen, MonoTime());
  time.RunDue();
  EXPECT_EQ(seen, start + absl::Seconds(10));  // late: the thread did not run at 1 s
}

}  // namespace
}  // namespace fencelock
