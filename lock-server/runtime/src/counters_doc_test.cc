// Every counter of counters.h's lists is documented in docs/metrics.md under its Prometheus
// name, and no two counters share a name: the lists are the one place a counter is declared.
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "lock-server/server_core.h"

namespace fencelock::server {
namespace {

TEST(CountersDocTest, EveryCounterIsInTheMetricsGuideOnceByName) {
  std::ifstream in(FENCELOCK_METRICS_DOC);
  ASSERT_TRUE(in) << "cannot read " << FENCELOCK_METRICS_DOC;
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::set<std::string> names;
  int counters = 0;
  CoreStats().ForEachCounter([&](const CounterRef& c) {
    ++counters;
    EXPECT_TRUE(names.insert(c.metric).second) << c.metric << " is in the lists twice";
    EXPECT_NE(doc.find(std::string("`") + c.metric + "`"), std::string::npos)
        << c.metric << " (" << c.field << ") is not in docs/metrics.md";
    EXPECT_EQ(std::string(c.metric).substr(std::string(c.metric).size() - 6), "_total")
        << c.metric;
  });
  EXPECT_EQ(counters, 22);  // 9 of the lock rules, 8 of the pools, 5 of the core
}

}  // namespace
}  // namespace fencelock::server
