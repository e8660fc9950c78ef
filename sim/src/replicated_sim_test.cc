// The simulator with lockd replicas on the simulated etcd (fencelock-sim --replicas): a fixed
// range of seeds with every fault on (the node faults and etcd's), the same seed giving the same
// trace, for three replicas and for two.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "sim/simulator.h"

namespace fencelock::sim {
namespace {

// Seeds 1 to 2,000 of three replicas (and the first half as many of two); the `stress` run and
// sanitized builds set FENCELOCK_SIM_SEEDS (sim/CMakeLists.txt).
uint64_t SeedCount() {
  const char* env = std::getenv("FENCELOCK_SIM_SEEDS");
  return env != nullptr ? std::stoull(env) : 2000;
}

std::string Failures(const SimResult& r, const SimOptions& options) {
  std::string all = "seed " + std::to_string(r.seed) + " failed:\n";
  for (const auto& f : r.failures) all += "  " + f + "\n";
  return all + "replay: " + ReplayCommand(options);
}

TEST(ReplicatedSimTest, TheSameSeedIsTheSameRun) {
  SimOptions options;
  options.replicas = 3;
  options.seed = 42;
  const SimResult a = Simulate(options);
  const SimResult b = Simulate(options);
  EXPECT_TRUE(a.ok) << Failures(a, options);
  EXPECT_EQ(a.trace_hash, b.trace_hash);
  EXPECT_EQ(a.events, b.events);
  EXPECT_GT(a.grants, 0u);
  EXPECT_GT(a.takeovers, 0u);
  options.seed = 43;
  EXPECT_NE(Simulate(options).trace_hash, a.trace_hash);
}

void RunSeeds(int replicas, uint64_t seeds) {
  SimOptions options;
  options.replicas = replicas;
  uint64_t failed = 0, grants = 0, checks = 0, takeovers = 0, crashes = 0, etcd_faults = 0;
  uint64_t combined = 0xcbf29ce484222325ULL;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    options.seed = seed;
    const SimResult r = Simulate(options);
    if (!r.ok && ++failed <= 5) ADD_FAILURE() << Failures(r, options);
    combined = (combined ^ r.trace_hash) * 0x100000001b3ULL;
    grants += r.grants;
    checks += r.checks_passed;
    takeovers += r.takeovers;
    crashes += r.crashes;
    etcd_faults += r.etcd_faults;
  }
  std::printf("%d replicas, %lu seeds: %lu failed, %lu grants, %lu checks, %lu takeovers, "
              "%lu crashes, %lu etcd faults, combined trace %016lx\n",
              replicas, static_cast<unsigned long>(seeds), static_cast<unsigned long>(failed),
              static_cast<unsigned long>(grants), static_cast<unsigned long>(checks),
              static_cast<unsigned long>(takeovers), static_cast<unsigned long>(crashes),
              static_cast<unsigned long>(etcd_faults), static_cast<unsigned long>(combined));
  EXPECT_EQ(failed, 0u);
  // The runs did what they are for: failovers under faults, with locks held across them.
  EXPECT_GT(grants, 5 * seeds);
  EXPECT_GT(takeovers, 2 * seeds);
  EXPECT_GT(crashes, seeds / 2);
  EXPECT_GT(etcd_faults, 2 * seeds);
}

TEST(ReplicatedSimTest, ThreeReplicasKeepEveryProperty) { RunSeeds(3, SeedCount()); }

TEST(ReplicatedSimTest, TwoReplicasKeepEveryProperty) { RunSeeds(2, SeedCount() / 2); }

}  // namespace
}  // namespace fencelock::sim
