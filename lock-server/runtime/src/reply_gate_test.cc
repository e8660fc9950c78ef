#include "reply_gate.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace fencelock::server {
namespace {

// What the gate delivered, one entry per delivery: the connection and its frames.
using Delivered = std::vector<std::pair<ConnectionId, std::string>>;

// Held replies of one connection leave with their batch's commit, each release in one
// delivery, the ones still held keeping their order; a committed one leaves at once.
TEST(ReplyGateTest, RepliesLeaveWithTheirBatchAndTheRestKeepTheirOrder) {
  Delivered out;
  ReplyGate gate([&](ConnectionId c, std::string frames) { out.emplace_back(c, std::move(frames)); });
  gate.Submit(7, 3, 0, 1, "a3");
  gate.Submit(7, 1, 0, 2, "b1");
  gate.Submit(7, 2, 0, 3, "c2");
  gate.Submit(7, 3, 0, 4, "d3");
  gate.Submit(7, 2, 0, 5, "e2");
  gate.Submit(9, 2, 0, 6, "f2");
  gate.Submit(7, 1, 1, 7, "g1");  // its batch is committed already: out now
  EXPECT_EQ(out, (Delivered{{7, "g1"}}));
  EXPECT_EQ(gate.held(7), 5u);

  gate.Committed(1);
  EXPECT_EQ(out, (Delivered{{7, "g1"}, {7, "b1"}}));
  EXPECT_EQ(gate.held(7), 4u);

  out.clear();
  gate.Committed(2);  // two of 7's leave in one delivery, in the order they were produced
  EXPECT_EQ(out, (Delivered{{7, "c2e2"}, {9, "f2"}}));
  EXPECT_EQ(gate.held(7), 2u);
  EXPECT_EQ(gate.held(9), 0u);

  // What stays held is still in its order: a3 before d3.
  const auto left = gate.TakeAll();
  EXPECT_EQ(left, (std::vector<std::pair<ConnectionId, uint64_t>>{{7, 1}, {7, 4}}));
  out.clear();
  gate.Committed(3);
  EXPECT_TRUE(out.empty());
}

TEST(ReplyGateTest, ADroppedConnectionGetsNothingMore) {
  Delivered out;
  ReplyGate gate([&](ConnectionId c, std::string frames) { out.emplace_back(c, std::move(frames)); });
  gate.Submit(4, 2, 0, 1, "x");
  gate.Submit(5, 2, 0, 2, "y");
  gate.Drop(4);
  gate.Committed(2);
  EXPECT_EQ(out, (Delivered{{5, "y"}}));
}

}  // namespace
}  // namespace fencelock::server
