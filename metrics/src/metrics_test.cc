#include "metrics/metrics.h"
#include "metrics/exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

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

// Issue 33: 3,000 idle connections to /metrics made every scrape time out (civetweb gave each
// a worker thread for up to 30 s). Connections are a bounded budget now, the oldest going
// first, and each has a deadline for its request: a scrape is answered whatever is open.
TEST(MetricsTest, IdleConnectionsNeverStarveAScrape) {
  auto registry = std::make_shared<Registry>();
  registry->GetCounter("served_total", "x").Increment(7);
  auto exposer = Exposer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  const int port = (*exposer)->port();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> idle;
  for (int i = 0; i < 800; ++i) {  // beyond every budget, within this process's descriptors
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    const int r = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ASSERT_TRUE(r == 0 || errno == EINPROGRESS) << i << ": " << strerror(errno);
    idle.push_back(fd);
  }
  for (int scrape = 0; scrape < 3; ++scrape) {
    // Prometheus' own scrape timeout is 10 s; the server this replaced needed 30 s per idle
    // connection it was stuck on.
    auto response = HttpGet("127.0.0.1", port, "/metrics", absl::Seconds(5));
    ASSERT_TRUE(response.ok()) << "scrape " << scrape << ": " << response.status();
    EXPECT_EQ(response->status, 200);
    EXPECT_THAT(response->body, HasSubstr("served_total 7"));
  }
  // An idle connection is closed by the server (budget or request deadline), not kept.
  char byte;
  pollfd first{idle.front(), POLLIN, 0};
  ASSERT_EQ(poll(&first, 1, 10000), 1);
  EXPECT_LE(recv(idle.front(), &byte, 1, 0), 0);
  for (int fd : idle) close(fd);
  EXPECT_EQ(HttpGet("127.0.0.1", port, "/nothing").value_or(HttpResponse{}).status, 404);
}

// A scrape whose response is still being written (a large page, a slow reader) is not the one
// a flood of new connections closes: the budget evicts connections that sent nothing.
TEST(MetricsTest, AFloodNeverCutsOffAScrapeBeingAnswered) {
  auto registry = std::make_shared<Registry>();
  for (int i = 0; i < 250000; ++i) {  // about 7 MB, past what the send buffer holds (4 MB)
    registry->GetCounter("padding_total", "x", {{"n", std::to_string(i)}}).Increment();
  }
  auto exposer = Exposer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*exposer)->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int scrape = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int small = 4096;  // a reader that takes its time: the page cannot fit in the socket
  setsockopt(scrape, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_EQ(connect(scrape, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(scrape, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  absl::SleepFor(absl::Milliseconds(300));  // the server fills the socket and waits on us
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    (void)connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    flood.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(300));
  std::string got;
  char buf[65536];
  for (ssize_t n; (n = recv(scrape, buf, sizeof(buf), 0)) > 0;) got.append(buf, n);
  close(scrape);
  for (int fd : flood) close(fd);
  const size_t body = got.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos);
  const size_t length_at = got.find("Content-Length: ");
  ASSERT_NE(length_at, std::string::npos);
  const size_t length = std::stoul(got.substr(length_at + 16));
  EXPECT_GT(length, size_t{5} << 20) << "the page is too small to fill the socket";
  EXPECT_EQ(got.size() - body - 4, length) << "the scrape was cut off";
}

}  // namespace
}  // namespace fencelock::metrics
