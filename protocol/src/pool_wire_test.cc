#include "protocol/pool_wire.h"

#include <cstdint>

#include "gtest/gtest.h"
#include "protocol/millis.h"

namespace fencelock::protocol {
namespace {

// Every field distinct, so that one written to or read from the wrong wire field shows.
PoolView EveryFieldSet() {
  PoolView v{.pool = "gpu", .generation = 7, .budget = 100, .used_units = 41, .decision = 93,
             .draining = true, .complete = true, .degraded = "commit fault"};
  v.profiles.push_back({.profile = {"train", 8, 16, true, false},
                        .active_units = 24,
                        .provisional_units = 8,
                        .pending_units = 40,
                        .withheld_units = 3,
                        .demand_expires_in = absl::Milliseconds(2500),
                        .owner_epoch = 5,
                        .acked_generation = 6,
                        .compatible = true});
  v.profiles.push_back({.profile = {"infer", 1, 0, false, true}, .active_units = 9});
  v.leases.push_back({"train", "slot-1", 1001, 8, 5, true, absl::ZeroDuration(), 90});
  v.leases.push_back({"train", "slot-2", 1002, 8, 5, false, absl::Milliseconds(1500), 91});
  v.tombstones.push_back({"infer", "slot-9", 999, 1, 80, "pod gone: kubectl shows none"});
  v.tombstones_kept = 12;
  return v;
}

TEST(PoolWireTest, AStatusComesBackFromTheWireFieldForField) {
  const PoolView sent = EveryFieldSet();
  wire::PoolStatusReply reply;
  ToWire(sent, &reply);
  EXPECT_EQ(FromWire(reply), sent);
}

// Unknown demand stays unknown: "no current demand" is not "zero pending units".
TEST(PoolWireTest, AbsentDemandStaysAbsent) {
  PoolView sent{.pool = "p"};
  sent.profiles.push_back({.profile = {"a", 1, 0, false, false}});
  wire::PoolStatusReply reply;
  ToWire(sent, &reply);
  const PoolView got = FromWire(reply);
  ASSERT_EQ(got.profiles.size(), 1u);
  EXPECT_FALSE(got.profiles[0].pending_units.has_value());
  EXPECT_FALSE(got.profiles[0].withheld_units.has_value());
  EXPECT_FALSE(got.profiles[0].demand_expires_in.has_value());
}

TEST(PoolWireTest, AProfileDefinitionComesBackFromTheWire) {
  const PoolProfileDef def{"train", 8, 16, true, true};
  EXPECT_EQ(FromWire(ToWire(def)), def);
}

// What a peer may send at the edges: a negative duration goes as 0, a part of a millisecond as
// a whole one, and a count no deadline could hold comes back capped instead of overflowing.
TEST(PoolWireTest, DurationsAtTheEdges) {
  EXPECT_EQ(ToWireMillis(absl::Milliseconds(-5)), 0u);
  EXPECT_EQ(ToWireMillis(absl::Milliseconds(1500)), 1500u);
  // Issue 59: a part of a millisecond is a whole one, never 0 ("lockd's default" in a TTL).
  EXPECT_EQ(ToWireMillis(absl::Microseconds(500)), 1u);
  EXPECT_EQ(ToWireMillis(absl::Nanoseconds(1)), 1u);
  EXPECT_EQ(ToWireMillis(absl::Microseconds(1500)), 2u);
  EXPECT_EQ(ToWireMillis(absl::ZeroDuration()), 0u);
  EXPECT_EQ(FromWireMillis(1500), absl::Milliseconds(1500));
  const absl::Duration huge = FromWireMillis(UINT64_MAX);
  EXPECT_LT(huge, absl::InfiniteDuration());
  EXPECT_EQ(huge, absl::Milliseconds(INT64_MAX / 1'000'000));
}

}  // namespace
}  // namespace fencelock::protocol
