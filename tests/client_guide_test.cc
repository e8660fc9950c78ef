// docs/client.md's examples (lock-client/examples/guide_examples.cc) against a real lockd.
#include <utility>  // before Asio (Boost 1.74 with GCC 12)

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>

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
  EXPECT_EQ(guide::PayEach(*client, *rail, {"payout-50", "payout-51", "payout-52"}), 3);
  EXPECT_TRUE(client->renewNow().ok());  // carries the last held-back Release
  auto again = client->tryAcquire("payout-52");  // free again
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->has_value());
  EXPECT_TRUE(client->release(**again).ok());
  EXPECT_TRUE(guide::ReactToLoss(*client));
  auto ledger = fence::TokenFence::InMemory();
  EXPECT_TRUE(guide::ReadUnderASharedLock(*client, *ledger));
  EXPECT_TRUE(guide::WriteWithALockDelay(*client, *ledger));
  EXPECT_TRUE(guide::ReadUnderASharedLock(*client, *ledger));  // a newer reader after the write

  boost::asio::io_context io;
  AsyncClient locks(io.get_executor(), *client);
  std::future<bool> paid =
      boost::asio::co_spawn(io, guide::PayFromACoroutine(locks, *rail), boost::asio::use_future);
  io.run();
  EXPECT_TRUE(paid.get());
  // Someone else holds payout-44, so the wait is real until it is given up.
  auto other = guide::Connect(lockd.tcp_address());
  ASSERT_NE(other, nullptr);
  auto held = other->acquire("payout-44", absl::Seconds(5));
  ASSERT_TRUE(held.ok()) << held.status();
  io.restart();
  EXPECT_TRUE(guide::GiveUpWaiting(io, locks));
  EXPECT_TRUE(other->release(*held).ok());
}

}  // namespace
}  // namespace fencelock
