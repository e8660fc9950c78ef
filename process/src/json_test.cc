// The reports' JSON: values that need escaping come out as valid JSON and read back unchanged
// (the hand-built JSON the runners wrote before did not escape the demo's strings at all).
#include "process/json.h"

#include "fencelock/report.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::process {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kAwkward = "rail \"busy\"\\ok\nline 2\ttab \x01 caf\xc3\xa9";

TEST(JsonTest, StringsThatNeedEscapingAreEscapedAndReadBack) {
  report::DemoReport demo;
  demo.set_payouts(3);
  (*demo.mutable_abandoned())[kAwkward] = 2;
  const std::string json = ToJson(demo);
  EXPECT_THAT(json, HasSubstr(R"(rail \"busy\"\\ok\nline 2\ttab \u0001 caf)"));
  EXPECT_THAT(json, Not(HasSubstr("\n line 2")));  // no raw newline inside a string
  report::DemoReport back;
  ASSERT_TRUE(FromJson(json, &back).ok()) << json;
  EXPECT_EQ(back.abandoned().at(kAwkward), 2);

  report::HarnessReport harness;
  auto* run = harness.add_runs();
  run->set_scenario("uc03");
  run->add_failures(kAwkward);
  auto* figure = run->add_figures();
  figure->set_name("w1 after waking");
  figure->set_value(kAwkward);
  run->mutable_history()->add_violations("payout/1 paid \"twice\"");
  report::HarnessReport harness_back;
  ASSERT_TRUE(FromJson(ToJson(harness), &harness_back).ok());
  EXPECT_EQ(harness_back.runs(0).failures(0), kAwkward);
  EXPECT_EQ(harness_back.runs(0).figures(0).value(), kAwkward);
  EXPECT_EQ(harness_back.runs(0).history().violations(0), "payout/1 paid \"twice\"");
}

TEST(JsonTest, EveryFieldIsPresentWithTheProtoNames) {
  report::DemoReport demo;
  demo.set_ok(true);
  demo.set_paid_once(300);
  const std::string json = ToJson(demo);
  EXPECT_THAT(json, HasSubstr("\"ok\": true"));
  EXPECT_THAT(json, HasSubstr("\"paid_once\": 300"));
  EXPECT_THAT(json, HasSubstr("\"paid_twice\": 0"));  // zeros are written, not left out
  EXPECT_THAT(json, HasSubstr("\"lock_fenced_out_total\": 0"));
  EXPECT_EQ(json.back(), '\n');
}

TEST(JsonTest, WhatIsNotTheReportIsRefusedWithTheReason) {
  report::DemoReport demo;
  absl::Status s = FromJson("{\"paid_once\": \"many\"}", &demo);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not a fencelock.report.DemoReport in JSON"));
  EXPECT_EQ(FromJson("{\"paid_once\": 1", &demo).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fencelock::process
