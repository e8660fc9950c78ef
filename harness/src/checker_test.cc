#include "harness/checker.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::harness {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

history::Record R(int64_t begin, int64_t end, std::string process, std::string event,
                  std::string key, uint64_t token, std::string detail = "") {
  return {begin, end, std::move(process), std::move(event), std::move(key), token,
          std::move(detail)};
}

// A clean takeover: w1 holds payout/1 under 5, stops acting, w2 gets 7 and pays.
std::vector<history::Record> CleanTakeover() {
  return {R(10, 20, "w1", "acquire", "payout/1", 5),
          R(21, 30, "w1", "claimed", "payout/1", 5, "was PENDING"),
          R(31, 40, "w1", "marked-submitted", "payout/1", 5),
          R(100, 110, "w2", "acquire", "payout/1", 7),
          R(111, 120, "w2", "claimed", "payout/1", 7, "was SUBMITTED"),
          R(121, 121, "rail", "admit", "payout/1", 7, "STATUS UNPAID"),
          R(121, 130, "w2", "status-asked", "payout/1", 7, "UNPAID"),
          R(131, 132, "w2", "step-started", "payout/1", 7, "rail_submit"),
          R(140, 140, "rail", "admit", "payout/1", 7, "SUBMIT PAID 1"),
          R(133, 150, "w2", "submitted", "payout/1", 7, "txn 1"),
          R(151, 160, "w2", "paid", "payout/1", 7, "txn 1")};
}

TEST(CheckerTest, CleanTakeoverPasses) {
  CheckResult r = Check(CleanTakeover());
  EXPECT_THAT(r.violations, IsEmpty());
  EXPECT_THAT(r.client_overlaps, IsEmpty());
  EXPECT_EQ(r.grants, 2);
  EXPECT_EQ(r.payments, 1);
  EXPECT_EQ(r.fence_decisions, 2 + 2 + 2);  // store: w1 claim and mark, w2 claim and paid; rail two
}

TEST(CheckerTest, StaleSubmitRefusedByTheRailIsAnOverlapNotAViolation) {
  auto h = CleanTakeover();
  // w1 resumes with the client check disabled and submits under 5: the rail refuses it.
  h.push_back(R(200, 201, "w1", "step-started", "payout/1", 5, "rail_submit"));
  h.push_back(R(202, 202, "rail", "refuse", "payout/1", 5, "SUBMIT FENCED 7"));
  h.push_back(R(201, 210, "w1", "fenced", "payout/1", 5, "rail highest 7"));
  CheckResult r = Check(h);
  EXPECT_THAT(r.violations, IsEmpty());
  ASSERT_THAT(r.client_overlaps, SizeIs(1));
  EXPECT_THAT(r.client_overlaps[0], HasSubstr("w1 (token 5)"));
}

TEST(CheckerTest, TokenGrantedTwiceIsAViolation) {
  auto h = CleanTakeover();
  h.push_back(R(300, 310, "w3", "acquire", "payout/2", 7));
  CheckResult r = Check(h);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.violations[0], HasSubstr("token 7 granted twice"));
}

TEST(CheckerTest, LaterGrantWithALowerTokenIsAViolation) {
  auto h = CleanTakeover();
  h.push_back(R(300, 310, "w3", "acquire", "payout/2", 6));  // requested after 7 was received
  CheckResult r = Check(h);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.violations[0], HasSubstr("grant order"));
  // Overlapping in time, the order of tokens is free.
  h.back() = R(105, 310, "w3", "acquire", "payout/2", 6);
  EXPECT_TRUE(Check(h).ok());
}

TEST(CheckerTest, StoreAdmittingALowerTokenAfterAHigherOneIsAViolation) {
  auto h = CleanTakeover();
  h.push_back(R(200, 210, "w1", "paid", "payout/1", 5, "txn 1"));
  CheckResult r = Check(h);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.violations[0], HasSubstr("store fence for payout/1"));
}

TEST(CheckerTest, RailAdmittingALowerTokenOrRefusingTheHighestIsAViolation) {
  auto h = CleanTakeover();
  h.push_back(R(200, 200, "rail", "admit", "payout/1", 5, "STATUS PAID 1"));
  EXPECT_THAT(Check(h).violations, ::testing::Contains(HasSubstr("admitted token 5 after admitting 7")));
  h.back() = R(200, 200, "rail", "refuse", "payout/1", 7, "SUBMIT FENCED 7");
  EXPECT_THAT(Check(h).violations, ::testing::Contains(HasSubstr("refused token 7")));
}

TEST(CheckerTest, StoreRefusalWithoutAHigherAdmitIsAViolation) {
  std::vector<history::Record> h = {R(10, 20, "w1", "acquire", "payout/1", 5),
                                    R(21, 30, "w1", "fenced", "payout/1", 5, "store fenced out")};
  EXPECT_THAT(Check(h).violations, ::testing::Contains(HasSubstr("no higher token admitted")));
}

TEST(CheckerTest, PaidTwiceIsAViolation) {
  auto h = CleanTakeover();
  h.push_back(R(300, 300, "rail", "admit", "payout/1", 9, "SUBMIT PAID 2"));
  CheckResult r = Check(h);
  EXPECT_THAT(r.violations, ::testing::Contains(HasSubstr("payout/1 paid twice")));
  EXPECT_EQ(r.payments, 2);
}

TEST(CheckerTest, ReadsADirectoryAndNamesABadLine) {
  const std::string dir = ::testing::TempDir() + "/checker_test_history";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream w1(dir + "/w1.log");
    std::ofstream rail(dir + "/rail.log");
    for (const auto& r : CleanTakeover()) (r.process == "rail" ? rail : w1) << history::Format(r) << "\n";
  }
  auto r = CheckDirectory(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok());
  EXPECT_EQ(r->records, 11);
  std::ofstream(dir + "/w1.log", std::ios::app) << "12 oops\n";
  auto bad = CheckDirectory(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("w1.log:10"));
  EXPECT_FALSE(CheckDirectory(dir + "/missing").ok());
}

TEST(HistoryTest, FormatParseRoundTripAndBadInput) {
  const auto r = R(1, 2, "w1", "abandoned", "payout/3", 4, "deadline passed");
  auto back = history::Parse(history::Format(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->detail, "deadline passed");
  EXPECT_EQ(back->token, 4u);
  EXPECT_FALSE(history::Parse("1 2 w1 acquire payout/3").ok());
  EXPECT_FALSE(history::Parse("x 2 w1 acquire payout/3 4").ok());
  EXPECT_FALSE(history::Parse("3 2 w1 acquire payout/3 4").ok());  // ends before it begins
  EXPECT_FALSE(history::Writer::Open("", "has space").ok());
}

}  // namespace
}  // namespace fencelock::harness
