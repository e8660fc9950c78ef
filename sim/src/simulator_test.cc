// The simulator in CTest: a fixed range of seeds with every fault on, the same seed giving the
// same trace, and the clock-rate bound broken on purpose.
#include "sim/simulator.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace fencelock::sim {
namespace {

void ExpectOk(const SimResult& r, const SimOptions& options) {
  EXPECT_TRUE(r.ok) << "seed " << r.seed << " failed:\n"
                    << [&] {
                         std::string all;
                         for (const auto& f : r.failures) all += "  " + f + "\n";
                         return all;
                       }()
                    << "replay: " << ReplayCommand(options);
}

TEST(SimulatorTest, TheSameSeedIsTheSameRun) {
  SimOptions options;
  options.seed = 42;
  const SimResult a = Simulate(options);
  const SimResult b = Simulate(options);
  ExpectOk(a, options);
  EXPECT_EQ(a.trace_hash, b.trace_hash);
  EXPECT_EQ(a.events, b.events);
  EXPECT_GT(a.events, 1000u);
  EXPECT_GT(a.grants, 0u);
  options.seed = 43;
  EXPECT_NE(Simulate(options).trace_hash, a.trace_hash);
}

// Seeds 1 to 10,000; sanitized builds, several times slower, run the first
// FENCELOCK_SIM_SEEDS of them (sim/CMakeLists.txt sets it).
uint64_t SeedCount() {
  const char* env = std::getenv("FENCELOCK_SIM_SEEDS");
  return env != nullptr ? std::stoull(env) : 10000;
}

TEST(SimulatorTest, TenThousandSeedsKeepEveryProperty) {
  SimOptions options;
  options.duration = absl::Seconds(10);
  const uint64_t seeds = SeedCount();
  uint64_t failed = 0, grants = 0, checks = 0, crashes = 0, faults = 0, fenced = 0, withdrawals = 0;
  uint64_t shared = 0, delays = 0;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    options.seed = seed;
    const SimResult r = Simulate(options);
    if (!r.ok && ++failed <= 5) ExpectOk(r, options);
    grants += r.grants;
    checks += r.checks_passed;
    crashes += r.crashes;
    faults += r.disk_faults;
    fenced += r.fenced_out;
    withdrawals += r.withdrawals;
    shared += r.shared_grants;
    delays += r.delays_started;
  }
  std::printf("%lu seeds: %lu failed, %lu grants, %lu checks, %lu crashes, %lu disk faults, "
              "%lu fenced out, %lu withdrawals, %lu shared grants, %lu lock delays\n",
              static_cast<unsigned long>(seeds), static_cast<unsigned long>(failed),
              static_cast<unsigned long>(grants),
              static_cast<unsigned long>(checks), static_cast<unsigned long>(crashes),
              static_cast<unsigned long>(faults), static_cast<unsigned long>(fenced),
              static_cast<unsigned long>(withdrawals), static_cast<unsigned long>(shared),
              static_cast<unsigned long>(delays));
  EXPECT_EQ(failed, 0u);
  // The runs did what they are for.
  EXPECT_GT(grants, seeds);
  EXPECT_GT(crashes, seeds / 10);
  EXPECT_GT(faults, seeds / 100);
  EXPECT_GT(withdrawals, seeds / 10);
  EXPECT_GT(shared, seeds);
  EXPECT_GT(delays, seeds / 10);
}

TEST(SimulatorTest, ABrokenClockBoundShowsOverlapsButTheFencesHold) {
  SimOptions options;
  options.lockd_fast_clock = 1.0;  // lockd's clock runs twice as fast: leases end too early
  uint64_t overlaps = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    options.seed = seed;
    const SimResult r = Simulate(options);
    ExpectOk(r, options);  // overlaps are reported, not failures; stale requests stay fenced
    overlaps += r.overlaps;
  }
  EXPECT_GT(overlaps, 0u) << "a clock twice too fast should let a client overlap another";
}

}  // namespace
}  // namespace fencelock::sim
