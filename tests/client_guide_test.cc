// docs/client.md's examples (lock-client/examples/guide_examples.cc) against a real lockd.
#include "gtest/gtest.h"
#include "guide_examples.h"
#include "lockd_process.h"

namespace fencelock {
namespace {

TEST(ClientGuideTest, TheGuidesExamplesRunAgainstARealLockd) {
  testing::LockdProcess lockd;
  auto client = guide::Connect(lockd.tcp_address());
  ASSERT_NE(client, nullptr);
  auto rail = fence::TokenFence::InMemory();
  EXPECT_TRUE(guide::PayUnderAScopedLock(*client, *rail));
  EXPECT_TRUE(guide::PayUnderAScopedLock(*client, *rail));  // the first scope released it
  EXPECT_TRUE(guide::ReactToLoss(*client));
}

}  // namespace
}  // namespace fencelock
