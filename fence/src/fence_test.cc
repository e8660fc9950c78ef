#include "fence/fence.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::fence {
namespace {

using ::testing::HasSubstr;

class FenceTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() /
            ("fence-test-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
    fence_ = Open();
  }
  void TearDown() override {
    fence_.reset();
    std::filesystem::remove_all(path_);
  }
  std::unique_ptr<TokenFence> Open() {
    if (!GetParam()) return TokenFence::InMemory();
    auto f = TokenFence::OpenSqlite(path_ + "/fence.db");
    EXPECT_TRUE(f.ok()) << f.status();
    return std::move(*f);
  }
  std::string path_;
  std::unique_ptr<TokenFence> fence_;
};

TEST_P(FenceTest, AdmitsEqualOrHigherAndFencesLower) {
  EXPECT_EQ(*fence_->Highest("payout-1"), 0u);
  EXPECT_TRUE(fence_->Admit("payout-1", 5).ok());
  EXPECT_TRUE(fence_->Admit("payout-1", 5).ok());  // the same holder may repeat
  EXPECT_TRUE(fence_->Admit("payout-1", 9).ok());
  absl::Status stale = fence_->Admit("payout-1", 7);
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale.message(), HasSubstr("token 7"));
  EXPECT_THAT(stale.message(), HasSubstr("highest admitted, 9"));
  EXPECT_EQ(*fence_->Highest("payout-1"), 9u);  // a refused admit changes nothing
  EXPECT_TRUE(fence_->Admit("payout-2", 1).ok());  // keys are independent
}

TEST_P(FenceTest, ConcurrentAdmitsNeverLowerTheHighest) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t token = 1 + t; token <= 200; token += 4) {
        absl::Status s = fence_->Admit("k", token);
        EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kAborted) << s;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*fence_->Highest("k"), 200u);
}

INSTANTIATE_TEST_SUITE_P(Fences, FenceTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Sqlite" : "InMemory"; });

TEST(SqliteFenceTest, AdmittedTokensSurviveReopenAndACrash) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("fence-crash-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string db = dir + "/fence.db";
  {
    auto fence = TokenFence::OpenSqlite(db);
    ASSERT_TRUE(fence.ok());
    ASSERT_TRUE((*fence)->Admit("payout-9", 41).ok());
  }
  // A child admits a higher token and dies without closing anything.
  const pid_t child = fork();
  if (child == 0) {
    auto fence = TokenFence::OpenSqlite(db);
    _exit(fence.ok() && (*fence)->Admit("payout-9", 42).ok() ? 0 : 1);
  }
  int status;
  waitpid(child, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto reopened = TokenFence::OpenSqlite(db);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(*(*reopened)->Highest("payout-9"), 42u);
  EXPECT_EQ((*reopened)->Admit("payout-9", 41).code(), absl::StatusCode::kAborted);
  std::filesystem::remove_all(dir);
}

TEST(SqliteFenceTest, UnopenablePathIsAClearError) {
  auto fence = TokenFence::OpenSqlite("/nonexistent-dir/fence.db");
  EXPECT_EQ(fence.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(fence.status().message(), HasSubstr("/nonexistent-dir/fence.db"));
}

}  // namespace
}  // namespace fencelock::fence
