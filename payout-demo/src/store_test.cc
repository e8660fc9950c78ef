// The payout store's transitions and their fence: every transition refused with a stale token,
// SUBMITTED never returned to PENDING, state and fence surviving a reopen.
#include "payout-demo/store.h"

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::payout {
namespace {

using ::testing::HasSubstr;

class PayoutStoreTest : public ::testing::Test {
 protected:
  PayoutStoreTest() {
    dir_ = std::filesystem::temp_directory_path() /
           ("payout-store-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "payouts.db").string();
    Reopen();
  }
  ~PayoutStoreTest() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Reopen() {
    store_.reset();
    auto s = PayoutStore::Open(path_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  PayoutState State(int64_t id) { return store_->Get(id)->state; }

  std::filesystem::path dir_;
  std::string path_;
  std::unique_ptr<PayoutStore> store_;
};

TEST_F(PayoutStoreTest, HappyPathRecordsTokenWorkerAndTransaction) {
  auto first = store_->Load(3, 1250);
  ASSERT_TRUE(first.ok()) << first.status();
  auto before = store_->Claim(*first, 10, "w1");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->state, PayoutState::kPending);
  EXPECT_EQ(before->amount_cents, 1250);
  EXPECT_EQ(State(*first), PayoutState::kClaimed);
  ASSERT_TRUE(store_->MarkSubmitted(*first, 10).ok());
  ASSERT_TRUE(store_->MarkPaid(*first, 10, 77).ok());
  auto paid = store_->Get(*first);
  EXPECT_EQ(paid->state, PayoutState::kPaid);
  EXPECT_EQ(paid->token, 10u);
  EXPECT_EQ(paid->rail_txn, 77);
  EXPECT_EQ(paid->claims, 1);
  EXPECT_TRUE(store_->MarkPaid(*first, 10, 77).ok()) << "the same payment again is idempotent";
  EXPECT_EQ(store_->MarkPaid(*first, 10, 78).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(*store_->Unpaid(10), ::testing::ElementsAre(*first + 1, *first + 2));
}

TEST_F(PayoutStoreTest, EveryTransitionIsRefusedWithAStaleToken) {
  const int64_t id = *store_->Load(1, 100);
  ASSERT_TRUE(store_->Claim(id, 10, "old").ok());
  ASSERT_TRUE(store_->Claim(id, 20, "new").ok());  // the lock moved on: token 20 took over

  auto claim = store_->Claim(id, 10, "old");
  EXPECT_EQ(claim.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(claim.status().message(), HasSubstr("fenced out: token 10"));
  EXPECT_EQ(store_->MarkSubmitted(id, 10).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(store_->MarkSubmitted(id, 20).ok());
  EXPECT_EQ(store_->MarkPaid(id, 10, 5).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store_->Abandon(id, 10, "old", "deadline_passed").code(), absl::StatusCode::kAborted);
  auto p = store_->Get(id);
  EXPECT_EQ(p->state, PayoutState::kSubmitted);
  EXPECT_EQ(p->token, 20u);
  EXPECT_EQ(p->worker, "new");
  ASSERT_TRUE(store_->MarkPaid(id, 20, 5).ok());
  EXPECT_EQ(store_->Abandon(id, 10, "old", "deadline_passed").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(State(id), PayoutState::kPaid);
  // The refused abandon is still recorded, as what the old worker did.
  EXPECT_EQ(store_->Summary()->abandoned["deadline_passed"], 2);
}

TEST_F(PayoutStoreTest, ATokenOfTheSameClaimButNotTheLatestIsRefused) {
  // Fence admits an equal token; the claim check refuses a token that is admitted but is not
  // the claim's own (a worker that never claimed cannot mark someone else's claim).
  const int64_t id = *store_->Load(1, 100);
  ASSERT_TRUE(store_->Claim(id, 20, "w").ok());
  auto s = store_->MarkSubmitted(id, 30);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("claimed under token 20, not 30"));
}

TEST_F(PayoutStoreTest, AbandonReturnsAClaimToPendingButKeepsASubmitSubmitted) {
  const int64_t a = *store_->Load(2, 100);
  const int64_t b = a + 1;
  ASSERT_TRUE(store_->Claim(a, 10, "w").ok());
  ASSERT_TRUE(store_->Abandon(a, 10, "w", "insufficient_lease").ok());
  EXPECT_EQ(State(a), PayoutState::kPending);
  EXPECT_EQ(store_->Get(a)->worker, "");

  ASSERT_TRUE(store_->Claim(b, 11, "w").ok());
  ASSERT_TRUE(store_->MarkSubmitted(b, 11).ok());
  ASSERT_TRUE(store_->Abandon(b, 11, "w", "rail_unavailable").ok());
  EXPECT_EQ(State(b), PayoutState::kSubmitted);
  // The next claim sees SUBMITTED, so it knows to ask the rail before paying.
  auto next = store_->Claim(b, 12, "w2");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->state, PayoutState::kSubmitted);
  EXPECT_EQ(State(b), PayoutState::kSubmitted);
  EXPECT_EQ(store_->Get(b)->claims, 2);
}

TEST_F(PayoutStoreTest, ClaimOfAPaidPayoutChangesNothing) {
  const int64_t id = *store_->Load(1, 100);
  ASSERT_TRUE(store_->Claim(id, 10, "w").ok());
  ASSERT_TRUE(store_->MarkSubmitted(id, 10).ok());
  ASSERT_TRUE(store_->MarkPaid(id, 10, 1).ok());
  auto again = store_->Claim(id, 11, "late");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->state, PayoutState::kPaid);
  EXPECT_EQ(store_->Get(id)->worker, "");
  EXPECT_EQ(store_->MarkSubmitted(id, 11).code(), absl::StatusCode::kAborted)
      << "token 11 never became the claim";
}

TEST_F(PayoutStoreTest, StateAndFenceSurviveReopen) {
  const int64_t id = *store_->Load(1, 100);
  ASSERT_TRUE(store_->Claim(id, 40, "w").ok());
  ASSERT_TRUE(store_->MarkSubmitted(id, 40).ok());
  Reopen();
  EXPECT_EQ(State(id), PayoutState::kSubmitted);
  EXPECT_EQ(store_->Claim(id, 39, "stale").status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(store_->Claim(id, 41, "w2").ok());
}

TEST_F(PayoutStoreTest, BadInputIsAClearErrorAndChangesNothing) {
  EXPECT_EQ(store_->Load(0, 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Load(5, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Claim(999, 1, "w").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Summary()->total, 0);
  const int64_t id = *store_->Load(1, 100);
  EXPECT_EQ(store_->MarkPaid(id, 1, 1).code(), absl::StatusCode::kAborted)
      << "never claimed under token 1";
  ASSERT_TRUE(store_->Claim(id, 5, "w").ok());
  EXPECT_EQ(store_->MarkPaid(id, 5, 1).code(), absl::StatusCode::kFailedPrecondition)
      << "CLAIMED, not SUBMITTED";
  EXPECT_EQ(State(id), PayoutState::kClaimed);
}

TEST_F(PayoutStoreTest, OldestUnpaidAgeAndHeldBy) {
  EXPECT_EQ(*store_->OldestUnpaidAge(), absl::ZeroDuration());
  const int64_t id = *store_->Load(1, 100);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_GE(*store_->OldestUnpaidAge(), absl::Milliseconds(50));  // a lower bound only
  EXPECT_LT(*store_->OldestUnpaidAge(), absl::Hours(1));
  EXPECT_FALSE(store_->HeldBy("w")->has_value());
  ASSERT_TRUE(store_->Claim(id, 5, "w").ok());
  auto held = store_->HeldBy("w");
  ASSERT_TRUE(held->has_value());
  EXPECT_EQ((*held)->id, id);
  ASSERT_TRUE(store_->MarkSubmitted(id, 5).ok());
  ASSERT_TRUE(store_->MarkPaid(id, 5, 9).ok());
  EXPECT_FALSE(store_->HeldBy("w")->has_value());
  EXPECT_EQ(*store_->OldestUnpaidAge(), absl::ZeroDuration()) << "nothing is unpaid";
}

}  // namespace
}  // namespace fencelock::payout
