// A payout worker that cannot reach lockd when it starts keeps trying for --connect-timeout,
// and pays once lockd answers; one that never reaches it gives up and says why. Real lockd,
// rail and worker processes; the fault proxy stands between the worker and lockd.
#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "harness/fault_proxy.h"
#include "lockd_process.h"
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

}  // namespace
}  // namespace fencelock::payout
