// The HTTP client against servers that misbehave, and the exposition parser against the pages
// it must read.
#include "metrics/http_get.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "raw_connection.h"

namespace fencelock::metrics {
namespace {

using ::testing::HasSubstr;

// A loopback server that answers one connection with `serve` (given the accepted socket).
class OneShotServer {
 public:
  explicit OneShotServer(std::function<void(int)> serve) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(listener_, 1);
    socklen_t len = sizeof(addr);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, serve = std::move(serve)] {
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      char request[4096];
      [[maybe_unused]] ssize_t n = recv(fd, request, sizeof(request), 0);
      serve(fd);
      close(fd);
    });
  }
  ~OneShotServer() {
    shutdown(listener_, SHUT_RDWR);
    thread_.join();
    close(listener_);
  }
  int port() const { return port_; }

 private:
  int listener_ = -1;
  int port_ = 0;
  std::thread thread_;
};

void Send(int fd, const std::string& text) {
  [[maybe_unused]] ssize_t n = send(fd, text.data(), text.size(), MSG_NOSIGNAL);
}

TEST(HttpGetTest, ReadsStatusAndBodyUpToContentLength) {
  OneShotServer server([](int fd) {
    Send(fd, "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\ncontent-length: 5\r\n\r\n");
    Send(fd, "gone!and more that is not the body");
  });
  auto r = HttpGet("127.0.0.1", server.port(), "/x");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->body, "gone!");
}

TEST(HttpGetTest, ReadsABodyThatEndsWhenTheServerCloses) {
  OneShotServer server([](int fd) { Send(fd, "HTTP/1.0 200 OK\r\n\r\nline 1\nline 2\n"); });
  auto r = HttpGet("127.0.0.1", server.port(), "/metrics");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "line 1\nline 2\n");
}

TEST(HttpGetTest, ABodyCutShortOfItsLengthIsDataLoss) {
  OneShotServer server([](int fd) { Send(fd, "HTTP/1.0 200 OK\r\nContent-Length: 100\r\n\r\nshort"); });
  auto r = HttpGet("127.0.0.1", server.port(), "/metrics");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("after 5 of its 100 bytes"));
}

TEST(HttpGetTest, AReplyThatIsNotHttpIsDataLoss) {
  OneShotServer server([](int fd) { Send(fd, "SSH-2.0-OpenSSH\r\n"); });
  auto r = HttpGet("127.0.0.1", server.port(), "/metrics");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("did not answer HTTP"));
}

TEST(HttpGetTest, AServerThatNeverAnswersTimesOut) {
  OneShotServer server([](int fd) { usleep(600'000); });
  auto r = HttpGet("127.0.0.1", server.port(), "/metrics", absl::Milliseconds(200));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(HttpGetTest, NobodyListeningIsUnavailable) {
  const int port = testing::FreeLoopbackPort();
  auto r = HttpGet("127.0.0.1", port, "/metrics");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("cannot connect to http://127.0.0.1:"));
  EXPECT_EQ(HttpGet("127.0.0.1", 0, "/").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FindSampleTest, FindsASeriesByNameOrByNameAndLabels) {
  const std::string page =
      "# HELP lock_fenced_out_total stale tokens\n"
      "# TYPE lock_fenced_out_total counter\n"
      "lock_fenced_out_total_extra 9\n"
      "lock_fenced_out_total 3\n"
      "payouts_abandoned_total{reason=\"deadline_passed\"} 2\n"
      "payouts_abandoned_total{reason=\"rail_error\"} 5 1700000000000\n"
      "payout_backlog_age_seconds 12.5\n"
      "broken_total abc\n";
  EXPECT_EQ(FindSample(page, "lock_fenced_out_total").value_or(-1), 3);
  EXPECT_EQ(FindSample(page, "payouts_abandoned_total{reason=\"rail_error\"}").value_or(-1), 5);
  EXPECT_EQ(FindSample(page, "payout_backlog_age_seconds").value_or(-1), 12.5);
  EXPECT_EQ(FindSample(page, "payouts_abandoned_total").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindSample(page, "missing_total").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindSample(page, "broken_total").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace fencelock::metrics
