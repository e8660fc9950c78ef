// ADR-006 C5 §5.1's defaults: lock.session.ttl = 15 s, lock.default.ttl = 30 s,
// lock.client.safety-margin = 0.30. They are defined once (protocol/defaults.h); this checks
// the values against the contract, and that lockd's and the client's option structs take
// theirs from there (help_test checks the programs' flags). Also the seed ADR-0006's demand
// TTL and its managers' cadences.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lock-client/pool_manager.h"
#include "lock-server/lock_service.h"
#include "lock-server/server.h"
#include "protocol/defaults.h"

namespace fencelock {
namespace {

TEST(DefaultsTest, AreTheContractsValues) {
  EXPECT_EQ(defaults::kSessionTtl, absl::Seconds(15));
  EXPECT_EQ(defaults::kLockTtl, absl::Seconds(30));
  EXPECT_EQ(defaults::kSafetyMargin, 0.30);
}

TEST(DefaultsTest, TheClientAndLockdStartFromThem) {
  const ClientOptions client;
  EXPECT_EQ(client.session_ttl, defaults::kSessionTtl);
  EXPECT_EQ(client.default_lock_ttl, defaults::kLockTtl);
  EXPECT_EQ(client.safety_margin, defaults::kSafetyMargin);
  const server::ServiceOptions service;
  EXPECT_EQ(service.default_session_ttl, defaults::kSessionTtl);
  EXPECT_EQ(service.default_lock_ttl, defaults::kLockTtl);
}

// Seed ADR-0006: positive demand lives 30 s without a refresh; managers refresh it every 1 s
// (autoscaled) and retry acquires every 2 s (fixed), well inside that; lockd takes no TTL at
// or below the slower cadence (PoolFlagsTest checks the refusal).
TEST(DefaultsTest, PoolDemandIsTheSeedsAndOutlastsTheManagersCadences) {
  EXPECT_EQ(defaults::kPoolDemandTtl, absl::Seconds(30));
  EXPECT_EQ(defaults::kPoolDemandRefresh, absl::Seconds(1));
  EXPECT_EQ(defaults::kPoolAcquireRetry, absl::Seconds(2));
  EXPECT_EQ(defaults::kMinPoolDemandTtl, defaults::kPoolAcquireRetry + defaults::kPoolDemandRefresh);
  EXPECT_GT(defaults::kMinPoolDemandTtl, defaults::kPoolAcquireRetry);
  EXPECT_GT(defaults::kMinPoolDemandTtl, defaults::kPoolDemandRefresh);
  EXPECT_EQ(server::PoolOptions{}.demand_ttl, defaults::kPoolDemandTtl);
  // The library's manager keeps those cadences.
  EXPECT_EQ(PoolManagerOptions{}.demand_refresh, defaults::kPoolDemandRefresh);
  EXPECT_EQ(PoolManagerOptions{}.acquire_retry, defaults::kPoolAcquireRetry);
}

}  // namespace
}  // namespace fencelock
