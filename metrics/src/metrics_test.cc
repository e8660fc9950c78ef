#include "metrics/metrics.h"
#include "metrics/exposer.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/http_get.h"

namespace fencelock::metrics {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, SeriesAreCreatedOnceAndExposedInTextFormat) {
  Registry registry;
  Counter& a = registry.GetCounter("lock_fenced_out_total", "stale tokens");
  a.Increment();
  registry.GetCounter("lock_fenced_out_total", "stale tokens").Increment(2);
  EXPECT_EQ(a.value(), 3);
  registry.GetCounter("lock_lease_lost_total", "lost", {{"reason", "fenced_out"}}).Increment();
  registry.GetGauge("lock_margin_revisit", "revisit").Set(1);
  registry.GetHistogram("rtt_seconds", "rtt", {0.001, 0.01}).Observe(0.005);
  const std::string text = registry.TextExposition();
  EXPECT_THAT(text, HasSubstr("lock_fenced_out_total 3"));
  EXPECT_THAT(text, HasSubstr("lock_lease_lost_total{reason=\"fenced_out\"} 1"));
  EXPECT_THAT(text, HasSubstr("lock_margin_revisit 1"));
  EXPECT_THAT(text, HasSubstr("rtt_seconds_bucket{le=\"0.01\"} 1"));
}

TEST(MetricsTest, ExposerServesMetricsOverHttp) {
  auto registry = std::make_shared<Registry>();
  registry->GetCounter("served_total", "x").Increment(7);
  auto exposer = Exposer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  ASSERT_GT((*exposer)->port(), 0);
  auto response = HttpGet("127.0.0.1", (*exposer)->port(), "/metrics");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_THAT(response->body, HasSubstr("served_total 7"));
  EXPECT_EQ(ScrapeSample("127.0.0.1", (*exposer)->port(), "served_total").value_or(-1), 7);
}

TEST(MetricsTest, ExposerReportsABusyPort) {
  auto registry = std::make_shared<Registry>();
  auto first = Exposer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(first.ok());
  auto second = Exposer::Start("127.0.0.1", (*first)->port(), registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

TEST(MetricsTest, ExposerRefusesAnAddressItCannotServe) {
  auto registry = std::make_shared<Registry>();
  for (const char* host : {"not-an-ip", "::1", ""}) {
    auto exposer = Exposer::Start(host, 0, registry);
    EXPECT_EQ(exposer.status().code(), absl::StatusCode::kInvalidArgument) << host;
    EXPECT_THAT(exposer.status().message(), HasSubstr("needs an IPv4 address")) << host;
  }
  EXPECT_EQ(Exposer::Start("127.0.0.1", 70000, registry).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The listener and its threads are gone when the destructor returns: nothing is left running
// for an exiting process to leave behind (ThreadSanitizer reports such a thread as a leak).
TEST(MetricsTest, DestroyingTheExposerClosesItsListenerBeforeReturning) {
  auto registry = std::make_shared<Registry>();
  auto exposer = Exposer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(exposer.ok());
  const int port = (*exposer)->port();
  EXPECT_EQ(HttpGet("127.0.0.1", port, "/metrics").value_or(HttpResponse{}).status, 200);
  exposer->reset();
  EXPECT_EQ(HttpGet("127.0.0.1", port, "/metrics").status().code(), absl::StatusCode::kUnavailable)
      << "port " << port << " still answers";
}

}  // namespace
}  // namespace fencelock::metrics
