#include "protocol/version.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::protocol {
namespace {

using ::testing::HasSubstr;

TEST(NegotiateVersionTest, PicksHighestCommonVersion) {
  EXPECT_EQ(*NegotiateVersion({1, 3}, {2, 5}), 3u);
  EXPECT_EQ(*NegotiateVersion({1, 1}, {1, 1}), 1u);
  EXPECT_EQ(*NegotiateVersion({4, 9}, {1, 4}), 4u);
}

TEST(NegotiateVersionTest, DisjointRangesNameBothRanges) {
  auto v = NegotiateVersion({7, 9}, {1, 2});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(v.status().message(), HasSubstr("client speaks versions [7, 9]"));
  EXPECT_THAT(v.status().message(), HasSubstr("server speaks [1, 2]"));
}

TEST(NegotiateVersionTest, InvertedClientRangeIsInvalid) {
  auto v = NegotiateVersion({3, 2}, {1, 5});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fencelock::protocol
