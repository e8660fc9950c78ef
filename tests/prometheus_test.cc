// A real Prometheus server (Debian package prometheus) scrapes a real lockd and evaluates
// metrics/alerts.yml. A stale-token release makes lock_fenced_out_total 1 in Prometheus's
// query API and the LockFencedOut alert fire.
#include <signal.h>
#include <sys/wait.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "fencelock/wire.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "metrics/http_get.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::RawConnection;

// Polls `path` until the response contains every one of `needles`; returns the last response.
std::string WaitFor(int port, const std::string& path, const std::vector<std::string>& needles) {
  std::string body;
  for (int i = 0; i < 600; ++i) {
    auto response = metrics::HttpGet("127.0.0.1", port, path);
    body = response.ok() ? absl::StrCat(response->status, "\n", response->body) : "";
    bool all = true;
    for (const auto& n : needles) all = all && body.find(n) != std::string::npos;
    if (all) return body;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return body;
}

TEST(PrometheusTest, ScrapedFencedOutCounterReachesOneAndTheAlertFires) {
  testing::LockdProcess lockd;
  ASSERT_GT(lockd.metrics_port(), 0);
  testing::TempDir tmp;
  const int web_port = testing::FreeLoopbackPort();
  {
    std::ofstream config(tmp.path() + "/prometheus.yml");
    config << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
           << "rule_files:\n  - " << ALERTS_YML << "\n"
           << "scrape_configs:\n  - job_name: lockd\n    static_configs:\n"
           << "      - targets: ['127.0.0.1:" << lockd.metrics_port() << "']\n";
  }
  const pid_t prometheus = testing::SpawnProcess(
      PROMETHEUS_BINARY,
      {"--config.file=" + tmp.path() + "/prometheus.yml",
       "--storage.tsdb.path=" + tmp.path() + "/data",
       absl::StrCat("--web.listen-address=127.0.0.1:", web_port)},
      tmp.path() + "/prometheus.log");
  ASSERT_THAT(WaitFor(web_port, "/-/ready", {"200\n"}), ::testing::StartsWith("200\n"));
  // Healthy first: the counter is scraped at zero.
  ASSERT_THAT(WaitFor(web_port, "/api/v1/query?query=lock_fenced_out_total", {"\"0\"]"}),
              HasSubstr("\"0\"]"));

  // A stale token: the old holder's 300 ms lease ends, another client takes the lock, and the
  // old holder's release is fenced out.
  RawConnection old_holder = RawConnection::Tcp(lockd.port());
  const uint64_t session = old_holder.HelloAndOpenSession(absl::Seconds(30));
  const uint64_t stale = old_holder
                             .Call(testing::request::Acquire(session, "payout-7",
                                                             absl::ZeroDuration(),
                                                             absl::Milliseconds(300)))
                             .acquire()
                             .token();
  ClientOptions options;
  options.server = lockd.tcp_address();
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->acquire("payout-7", absl::Seconds(10)).ok());
  ASSERT_EQ(old_holder.Call(testing::request::Release(session, "payout-7", stale)).code(), wire::FENCED_OUT);

  const std::string value =
      WaitFor(web_port, "/api/v1/query?query=lock_fenced_out_total", {"\"1\"]"});
  EXPECT_THAT(value, HasSubstr("\"job\":\"lockd\""));
  EXPECT_THAT(value, HasSubstr("\"1\"]"));
  const std::string alerts =
      WaitFor(web_port, "/api/v1/alerts", {"LockFencedOut", "\"state\":\"firing\""});
  EXPECT_THAT(alerts, HasSubstr("\"alertname\":\"LockFencedOut\""));
  EXPECT_THAT(alerts, HasSubstr("\"state\":\"firing\""));

  kill(prometheus, SIGTERM);
  waitpid(prometheus, nullptr, 0);
}

}  // namespace
}  // namespace fencelock
