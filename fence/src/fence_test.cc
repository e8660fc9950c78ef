#include "fence/fence.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include <sqlite3.h>

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

// ADR 0006: readers that hold a shared lock together never fence each other out, in whatever
// order their reads arrive; a writer that lost its lock is refused once a newer reader or
// writer has touched the resource; a reader that lost its lock, once a newer writer has
// written.
TEST_P(FenceTest, ReadersCoexistAndStaleWritersAndReadersAreRefused) {
  // Writer 10 wrote; then its lease ran out and readers 11 and 12 were granted together.
  ASSERT_TRUE(fence_->Admit("ledger", 10).ok());
  EXPECT_TRUE(fence_->AdmitRead("ledger", 12).ok());
  EXPECT_TRUE(fence_->AdmitRead("ledger", 11).ok());  // an older reader, still holding
  EXPECT_TRUE(fence_->AdmitRead("ledger", 12).ok());  // the same reader again
  EXPECT_EQ(*fence_->Highest("ledger"), 12u);
  EXPECT_EQ(*fence_->HighestWrite("ledger"), 10u);
  // The stale writer wakes up and writes: refused, the registers unchanged.
  absl::Status stale_writer = fence_->Admit("ledger", 10);
  EXPECT_EQ(stale_writer.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale_writer.message(), HasSubstr("token 10"));
  EXPECT_THAT(stale_writer.message(), HasSubstr("highest admitted, 12"));
  EXPECT_EQ(*fence_->HighestWrite("ledger"), 10u);
  // Writer 13, granted after the readers let go, writes; reader 12, stale now, is refused,
  // and so is a read under the old writer's token.
  EXPECT_TRUE(fence_->Admit("ledger", 13).ok());
  absl::Status stale_reader = fence_->AdmitRead("ledger", 12);
  EXPECT_EQ(stale_reader.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale_reader.message(), HasSubstr("highest admitted for a write, 13"));
  EXPECT_EQ(fence_->AdmitRead("ledger", 10).code(), absl::StatusCode::kAborted);
  // The writer may read its own writes, and a writer's token read first does not stop it.
  EXPECT_TRUE(fence_->AdmitRead("ledger", 13).ok());
  EXPECT_TRUE(fence_->AdmitRead("other", 20).ok());
  EXPECT_TRUE(fence_->Admit("other", 20).ok());
  EXPECT_EQ(fence_->Admit("other", 19).code(), absl::StatusCode::kAborted);
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

// A fence table written before the write register existed: its tokens were all writes, so a
// stale writer and a stale reader are refused as before, and readers join in.
TEST(SqliteFenceTest, ATableWithoutTheWriteRegisterKeepsItsTokensAsWrites) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("fence-old-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string db = dir + "/fence.db";
  sqlite3* old = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &old), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(old,
                         "CREATE TABLE fence (key TEXT PRIMARY KEY, highest INTEGER NOT NULL);"
                         "INSERT INTO fence VALUES ('payout-1', 7)",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(old);
  auto fence = TokenFence::OpenSqlite(db);
  ASSERT_TRUE(fence.ok()) << fence.status();
  EXPECT_EQ(*(*fence)->HighestWrite("payout-1"), 7u);
  EXPECT_EQ((*fence)->AdmitRead("payout-1", 6).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE((*fence)->AdmitRead("payout-1", 9).ok());
  EXPECT_EQ(*(*fence)->HighestWrite("payout-1"), 7u);
  EXPECT_EQ((*fence)->Admit("payout-1", 8).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE((*fence)->Admit("payout-1", 9).ok());
  fence->reset();
  std::filesystem::remove_all(dir);
}

TEST(SqliteFenceTest, UnopenablePathIsAClearError) {
  auto fence = TokenFence::OpenSqlite("/nonexistent-dir/fence.db");
  EXPECT_EQ(fence.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(fence.status().message(), HasSubstr("/nonexistent-dir/fence.db"));
}

}  // namespace
}  // namespace fencelock::fence
