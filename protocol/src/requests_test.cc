// The request builders: what each puts on the wire, and durations that do not fit.
#include "protocol/requests.h"

#include "gtest/gtest.h"

namespace fencelock::protocol::request {
namespace {

TEST(RequestsTest, EachBuilderFillsItsBodyAndNothingElse) {
  const wire::Request a = Acquire(7, "payout/1", absl::Seconds(2), absl::Milliseconds(1500));
  ASSERT_TRUE(a.has_acquire());
  EXPECT_EQ(a.request_id(), 0u);  // set by the sender
  EXPECT_EQ(a.acquire().session_id(), 7u);
  EXPECT_EQ(a.acquire().lock(), "payout/1");
  EXPECT_EQ(a.acquire().wait_timeout_ms(), 2000u);
  EXPECT_EQ(a.acquire().ttl_ms(), 1500u);

  const wire::Request r = Release(7, "payout/1", 42, /*relinquish=*/true);
  EXPECT_EQ(r.release().token(), 42u);
  EXPECT_TRUE(r.release().relinquish());
  EXPECT_FALSE(Release(7, "payout/1", 42).release().relinquish());

  wire::Request ka = KeepAlive(7);
  EXPECT_EQ(ka.keep_alive().locks_size(), 0);
  AddLock(ka, "a", 1);
  AddLock(ka, "b", 2);
  ASSERT_EQ(ka.keep_alive().locks_size(), 2);
  EXPECT_EQ(ka.keep_alive().locks(1).lock(), "b");
  EXPECT_EQ(ka.keep_alive().locks(1).token(), 2u);
  EXPECT_EQ(KeepAlive(7, "a", 1).SerializeAsString(), [] {
    wire::Request one = KeepAlive(7);
    AddLock(one, "a", 1);
    return one.SerializeAsString();
  }());

  EXPECT_EQ(Validate("x", 3).validate().session_id(), 0u);  // a resource's check
  EXPECT_EQ(Validate("x", 3, 9).validate().session_id(), 9u);
  EXPECT_EQ(Resume(7, "s3cret").resume_session().secret(), "s3cret");
  EXPECT_EQ(Close(7).close_session().session_id(), 7u);
  EXPECT_EQ(WithdrawAcquire(7, 55).withdraw_acquire().acquire_request_id(), 55u);
  EXPECT_EQ(OpenSession(absl::Seconds(15)).open_session().ttl_ms(), 15000u);
  EXPECT_TRUE(GetStats().has_get_stats());
  EXPECT_EQ(ListLocks(10).list_locks().limit(), 10u);
}

TEST(RequestsTest, PoolRequestsCarryTheOwnerAndTheLease) {
  const wire::PoolOwnerRef owner = Owner(3, std::string("k\0y", 3));
  const wire::Request a = PoolAcquire("p", "a", "s1", owner, absl::Seconds(4));
  EXPECT_EQ(a.pool_acquire().owner().epoch(), 3u);
  EXPECT_EQ(a.pool_acquire().owner().key(), std::string("k\0y", 3));
  EXPECT_EQ(a.pool_acquire().ttl_ms(), 4000u);
  const wire::Request r = PoolRelease("p", "a", "s1", 9, owner);
  EXPECT_EQ(r.pool_release().slot(), "s1");
  EXPECT_EQ(r.pool_release().token(), 9u);
  EXPECT_EQ(PoolActivate("p", "a", "s1", 9, owner).pool_activate().SerializeAsString(),
            r.pool_release().SerializeAsString());
  wire::PoolProfile b;
  b.set_id("b");
  b.set_cost(2);
  const wire::Request p = PoolPublish("p", 1, 4, {b});
  ASSERT_EQ(p.pool_publish().profiles_size(), 1);
  EXPECT_EQ(p.pool_publish().profiles(0).cost(), 2u);
  EXPECT_TRUE(PoolDrain("p", true).pool_drain().draining());
  EXPECT_TRUE(PoolStop().has_pool_stop());
}

TEST(RequestsTest, ANegativeDurationGoesOutAsZeroNotAsAHugeNumber) {
  EXPECT_EQ(OpenSession(-absl::Seconds(1)).open_session().ttl_ms(), 0u);
  const wire::Request a = Acquire(1, "l", -absl::Milliseconds(5), -absl::InfiniteDuration());
  EXPECT_EQ(a.acquire().wait_timeout_ms(), 0u);
  EXPECT_EQ(a.acquire().ttl_ms(), 0u);
}

}  // namespace
}  // namespace fencelock::protocol::request
