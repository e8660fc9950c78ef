// A payout worker that cannot reach lockd when it starts keeps trying for --connect-timeout,
// and pays once lockd answers; one that never reaches it gives up and says why; one that cannot
// pay shows how long the oldest payout has waited on its /metrics. Real lockd, rail and worker
// processes; the fault proxy stands between the worker and lockd.
#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness/fault_proxy.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "metrics/http_get.h"
#include "payout-demo/cluster.h"
#include "process/process.h"

namespace fencelock::payout {
namespace {

using ::fencelock::testing::ReadTextFile;
using ::testing::HasSubstr;
using Dir = harness::FaultProxy::Direction;
using Mode = harness::FaultProxy::Mode;

class WorkerConnectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = Cluster::Start({.dir = tmp_.path(),
                                   .lockd_binary = LOCKD_BINARY,
                                   .rail_binary = RAIL_BINARY,
                                   .worker_binary = WORKER_BINARY});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    ASSERT_TRUE(cluster_->Load(5, 1000).ok());
  }
  std::string Log(const std::string& worker) const {
    return ReadTextFile(cluster_->Path("logs/" + worker + ".log"));
  }

  testing::TempDir tmp_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(WorkerConnectTest, KeepsTryingUntilLockdAnswersThenPays) {
  harness::FaultProxy proxy(cluster_->lockd_port());
  // Every connection the worker makes is cut before lockd sees its Hello.
  proxy.Set(Dir::kToServer, Mode::kDrop);
  std::atomic<bool> cutting{true};
  std::thread cutter([&] {
    while (cutting.load()) {
      proxy.CutAll();
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  auto worker = cluster_->StartWorker("w1", {}, absl::StrCat("127.0.0.1:", proxy.port()));
  ASSERT_TRUE(worker.ok()) << worker.status();
  for (int i = 0; i < 3000 && Log("w1").find("cannot reach lockd yet (attempt 2)") == std::string::npos;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  cutting.store(false);
  cutter.join();
  EXPECT_THAT(Log("w1"), HasSubstr("cannot reach lockd yet (attempt 2)"));
  proxy.Set(Dir::kToServer, Mode::kPass);

  auto status = (*worker)->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << Log("w1");
  EXPECT_EQ(process::DescribeStatus(*status), "exited 0") << Log("w1");
  EXPECT_THAT(Log("w1"), HasSubstr("done: no payout left unpaid"));
  auto r = cluster_->Reconcile();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->paid_once, 5);
  EXPECT_TRUE(r->ok());
}

TEST_F(WorkerConnectTest, GivesUpAfterTheConnectTimeoutAndSaysWhy) {
  // A port nobody listens on: the proxy's, once the proxy is gone.
  int closed_port = 0;
  { closed_port = harness::FaultProxy(cluster_->lockd_port()).port(); }
  auto worker = cluster_->StartWorker("w1", {"--connect-timeout=500ms"},
                                      absl::StrCat("127.0.0.1:", closed_port));
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto status = (*worker)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(process::DescribeStatus(*status), "exited 1");
  EXPECT_THAT(Log("w1"), HasSubstr("cannot reach lockd yet (attempt 1)"));
  EXPECT_THAT(Log("w1"), HasSubstr("attempts, --connect-timeout=500ms)"));
}

// payout_backlog_age_seconds (ADR-006 §6.3: it rises when workers abandon or cannot work) as
// Prometheus would read it: every payout is locked by someone else, so the worker waits and the
// oldest payout's age grows on its /metrics page.
TEST_F(WorkerConnectTest, ServesTheAgeOfTheOldestUnpaidPayout) {
  const absl::Time loaded = absl::Now();  // SetUp loaded the payouts just before
  auto holder = Client::Create({.server = absl::StrCat("127.0.0.1:", cluster_->lockd_port())});
  ASSERT_TRUE(holder.ok()) << holder.status();
  std::vector<LockHandle> held;
  for (int64_t id = 1; id <= 5; ++id) {
    auto lock = (*holder)->acquire(PayoutKey(id), absl::Seconds(10), absl::Seconds(60));
    ASSERT_TRUE(lock.ok()) << lock.status();
    held.push_back(*lock);
  }
  const std::string port_file = cluster_->Path("w1.metrics-port");
  auto worker = cluster_->StartWorker("w1", {"--metrics-port=0", "--metrics-port-file=" + port_file});
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto port = process::AwaitPortFile(port_file, **worker, absl::Seconds(60));
  ASSERT_TRUE(port.ok()) << port.status() << Log("w1");
  absl::StatusOr<double> age;
  for (int i = 0; i < 600; ++i) {
    age = metrics::ScrapeSample("127.0.0.1", *port, "payout_backlog_age_seconds");
    if (age.ok() && *age >= 1.0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(age.ok()) << age.status();
  EXPECT_GE(*age, 1.0);
  EXPECT_LE(*age, absl::ToDoubleSeconds(absl::Now() - loaded) + 1.0);
  auto paid = metrics::ScrapeSample("127.0.0.1", *port, "payouts_paid_total");
  EXPECT_EQ(paid.value_or(-1), 0);

  // Free the payouts: the worker pays them all and exits.
  for (const LockHandle& lock : held) EXPECT_TRUE((*holder)->release(lock).ok());
  auto status = (*worker)->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << Log("w1");
  EXPECT_EQ(process::DescribeStatus(*status), "exited 0") << Log("w1");
}

}  // namespace
}  // namespace fencelock::payout
