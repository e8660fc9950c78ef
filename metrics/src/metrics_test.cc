#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*exposer)->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
  close(fd);
  EXPECT_THAT(response, HasSubstr("200 OK"));
  EXPECT_THAT(response, HasSubstr("served_total 7"));
}

TEST(MetricsTest, ExposerReportsABusyPort) {
  auto registry = std::make_shared<Registry>();
  auto first = Exposer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(first.ok());
  auto second = Exposer::Start("127.0.0.1", (*first)->port(), registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace fencelock::metrics
