#include "harness/checker.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::harness {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
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

// Long holders (the replicated scenarios): a hold runs from the grant received to the last
// checkStillHeld that passed ("held"); two holds of one lock must not overlap.
TEST(CheckerTest, LongHoldsOfOneLockThatOverlapAreReported) {
  std::vector<history::Record> h = {R(10, 20, "holder-1", "acquire", "hold/0", 5),
                                    R(20, 3000, "holder-1", "held", "hold/0", 5),
                                    R(2400, 2500, "holder-2", "acquire", "hold/0", 9),
                                    R(2500, 6000, "holder-2", "held", "hold/0", 9)};
  CheckResult r = Check(h);
  ASSERT_THAT(r.client_overlaps, SizeIs(1));
  EXPECT_THAT(r.client_overlaps[0], HasSubstr("holder-1 (token 5)"));
  EXPECT_THAT(r.client_overlaps[0], HasSubstr("holder-2 (token 9)"));
  h[1].end_ns = 2450;  // the first hold's last check passed before the second grant arrived
  EXPECT_THAT(Check(h).client_overlaps, IsEmpty());
  // ADR 0006: two shared holds may overlap; a shared one and an exclusive one may not.
  h[1].end_ns = 3000;
  h[0].detail = "shared";
  h[2].detail = "shared";
  EXPECT_THAT(Check(h).client_overlaps, IsEmpty());
  h[2].detail = "";
  ASSERT_THAT(Check(h).client_overlaps, SizeIs(1));
  EXPECT_THAT(Check(h).client_overlaps[0], HasSubstr("holder-1 (token 5, shared)"));
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

// Two lockd replicas: a serves under an ownership until 1000 (renewed to 1500), is gone, and b
// takes over at 2000.
std::vector<history::Record> Failover() {
  return {R(100, 101, "lockd-a", "lockd-grant", "payout/1", 5, "1000"),
          R(600, 601, "lockd-a", "lockd-renew", "-", 0, "1500"),
          R(1400, 1401, "lockd-a", "lockd-validate", "-", 0, "1500"),
          R(2000, 2001, "lockd-b", "lockd-grant", "payout/2", 10006, "3400"),
          R(2100, 2101, "lockd-b", "lockd-renew", "-", 0, "3400")};
}

TEST(CheckerTest, AFailoverBetweenReplicasPasses) {
  CheckResult r = Check(Failover());
  EXPECT_THAT(r.violations, IsEmpty());
  EXPECT_EQ(r.lockd_acts, 5);
}

TEST(CheckerTest, AReplicaActingPastItsDeadlineIsAViolation) {
  auto h = Failover();
  h.push_back(R(1600, 1601, "lockd-a", "lockd-renew", "-", 0, "1500"));
  CheckResult r = Check(h);
  ASSERT_THAT(r.violations, SizeIs(1));
  EXPECT_THAT(r.violations[0], HasSubstr("lockd-a renew - at 1600, at or past its ownership deadline 1500"));
}

TEST(CheckerTest, TwoReplicasActingAtOnceIsAViolation) {
  auto h = Failover();
  // b acts while a's last act still claimed the state until 1500.
  h.push_back(R(1450, 1451, "lockd-b", "lockd-validate", "-", 0, "2800"));
  CheckResult r = Check(h);
  ASSERT_THAT(r.violations, SizeIs(1));
  EXPECT_THAT(r.violations[0],
              HasSubstr("lockd-b validate - at 1450 while lockd-a still claimed the state"));
}

TEST(CheckerTest, AReplicaThatEndedItsServiceClaimsNothingAfterward) {
  auto h = Failover();
  // a gave up at 1450 (a commit fault) although its deadline was 1500; b serves from 1460.
  h.push_back(R(1450, 1450, "lockd-a", "lockd-deposed", "-", 0, "etcd did not answer"));
  h.push_back(R(1460, 1461, "lockd-b", "lockd-renew", "-", 0, "2900"));
  EXPECT_THAT(Check(h).violations, IsEmpty());
  h.push_back(R(1470, 1471, "lockd-a", "lockd-renew", "-", 0, "1500"));
  CheckResult r = Check(h);
  ASSERT_THAT(r.violations, Not(IsEmpty()));
  EXPECT_THAT(r.violations[0], HasSubstr("lockd-a renew - at 1470, after it ended its service at 1450"));
}

// Issue 37: a deposed replica stands by again in the same process, and may serve again once
// it has taken the prefix over (its next lockd-serving); not before.
TEST(CheckerTest, ADeposedReplicaMayActAgainOnlyOnceItServesAgain) {
  auto h = Failover();
  h.push_back(R(1450, 1450, "lockd-a", "lockd-deposed", "-", 0, "etcd did not answer"));
  // b's last claim ends at 3400; a serves again from 3500.
  h.push_back(R(3500, 3500, "lockd-a", "lockd-serving", "-", 0, "etcd prefix /p"));
  h.push_back(R(3600, 3601, "lockd-a", "lockd-grant", "payout/3", 20001, "5000"));
  EXPECT_THAT(Check(h).violations, IsEmpty());
  // An act between the deposition and the next service is still one after its end.
  h.push_back(R(3000, 3001, "lockd-a", "lockd-renew", "-", 0, "1500"));
  CheckResult r = Check(h);
  ASSERT_THAT(r.violations, Not(IsEmpty()));
  EXPECT_THAT(r.violations, ::testing::Contains(HasSubstr(
                                "lockd-a renew - at 3000, after it ended its service at 1450")));
  // Deposed again in its second service: an act after that is one too.
  h.pop_back();
  h.push_back(R(4000, 4000, "lockd-a", "lockd-deposed", "-", 0, "owner deleted"));
  h.push_back(R(4100, 4101, "lockd-a", "lockd-validate", "-", 0, "5000"));
  r = Check(h);
  ASSERT_THAT(r.violations, Not(IsEmpty()));
  EXPECT_THAT(r.violations, ::testing::Contains(HasSubstr(
                                "lockd-a validate - at 4100, after it ended its service at 4000")));
}

TEST(CheckerTest, AnActPastTheDeadlineOfItsRenewalsIsAViolationWhateverItSays) {
  auto h = Failover();
  // a's renewals: sent at 90 and 590, each recorded before the acts that rely on it.
  h.push_back(R(90, 95, "lockd-a", "lockd-owned", "-", 0, "1000"));
  h.push_back(R(590, 595, "lockd-a", "lockd-owned", "-", 0, "1500"));
  h.push_back(R(1990, 1995, "lockd-b", "lockd-owned", "-", 0, "3400"));
  EXPECT_THAT(Check(h).violations, IsEmpty());
  // An act that claims a deadline no renewal gave: a broken check of the deadline.
  h.push_back(R(1800, 1801, "lockd-a", "lockd-renew", "-", 0, "9999"));
  CheckResult r = Check(h);
  ASSERT_THAT(r.violations, Not(IsEmpty()));
  EXPECT_THAT(r.violations[0], HasSubstr("lockd-a renew - at 1800, past the ownership deadline "
                                         "its renewals gave it (1500)"));
}

TEST(CheckerTest, ATokenBelowAnEarlierReplicasIsAViolation) {
  auto h = Failover();
  h.push_back(R(2200, 2201, "lockd-b", "lockd-grant", "payout/3", 4, "3400"));
  CheckResult r = Check(h);
  ASSERT_THAT(r.violations, SizeIs(1));
  EXPECT_THAT(r.violations[0], HasSubstr("token sequence: lockd-b grant payout/3 token 4"));
  h.back().detail = "soon";
  EXPECT_THAT(Check(h).violations, Contains(HasSubstr("without its ownership deadline")));
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
