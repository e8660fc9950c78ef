#include "lock-server/permissions.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::server {
namespace {

using ::testing::HasSubstr;

TEST(PermissionsTest, WithoutAFileEverythingButTheOperatorsRightsIsAllowed) {
  Permissions p = Permissions::WithoutFile("uid:1");
  EXPECT_TRUE(p.MayAcquire("", "admin/x"));
  EXPECT_TRUE(p.MayAcquire("uid:1000", "anything"));
  EXPECT_TRUE(p.MayList(""));
  EXPECT_TRUE(p.MayManage("uid:1000", "hosts", "build"));
  // ADR 0004: the operator is the owner of lockd's state, and nobody else.
  EXPECT_TRUE(p.IsOperator("uid:1"));
  EXPECT_FALSE(p.IsOperator("uid:1000"));
  EXPECT_FALSE(p.IsOperator(""));
  EXPECT_FALSE(Permissions().IsOperator("uid:1"));
  EXPECT_FALSE(Permissions().IsOperator(""));
}

TEST(PermissionsTest, RulesAddUpAndAnythingNotGrantedIsRefused) {
  auto p = Permissions::Parse(
      "# payout workers\n"
      "uid:1000  acquire payout/ refunds/   # two prefixes\n"
      "uid:1000  list\n"
      "uid:0     acquire *\n"
      "uid:0     operator\n"
      "anonymous acquire public/\n"
      "*         acquire shared/\n"
      "uid:7     inspect\n"
      "uid:9     validate\n"
      "\n",
      "perm");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rule_count(), 8u);
  EXPECT_TRUE(p->MayValidate("uid:9"));
  EXPECT_FALSE(p->MayValidate("uid:1000"));
  EXPECT_FALSE(p->MayValidate(""));
  EXPECT_TRUE(p->MayInspect("uid:7"));
  EXPECT_FALSE(p->MayList("uid:7"));  // inspect is its own right (lockd lets it list too)
  EXPECT_FALSE(p->MayInspect("uid:1000"));
  EXPECT_TRUE(p->MayAcquire("uid:1000", "payout/7"));
  EXPECT_TRUE(p->MayAcquire("uid:1000", "shared/x"));  // * adds to everyone
  EXPECT_FALSE(p->MayAcquire("uid:1000", "admin/x"));
  EXPECT_FALSE(p->MayAcquire("uid:1000", "payout"));  // a prefix, not a pattern
  EXPECT_TRUE(p->MayList("uid:1000"));
  EXPECT_FALSE(p->IsOperator("uid:1000"));
  EXPECT_TRUE(p->MayAcquire("uid:0", "admin/x"));
  EXPECT_TRUE(p->IsOperator("uid:0"));
  EXPECT_FALSE(p->MayList("uid:0"));
  EXPECT_TRUE(p->MayAcquire("", "public/a"));  // no identity: "anonymous"
  EXPECT_FALSE(p->MayAcquire("", "payout/7"));
  EXPECT_FALSE(p->MayAcquire("uid:2", "payout/7"));
  EXPECT_TRUE(p->MayAcquire("uid:2", "shared/y"));
  EXPECT_EQ(p->DescribeAcquire("uid:1000"),
            "uid:1000 may acquire locks starting with payout/, refunds/, shared/ (perm)");
  EXPECT_THAT(p->DescribeAcquire("uid:3"), HasSubstr("shared/"));
  auto empty = Permissions::Parse("# nobody may do anything\n", "perm");
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->MayAcquire("uid:0", "x"));
  EXPECT_FALSE(empty->MayList("uid:0"));
  EXPECT_EQ(empty->DescribeAcquire("uid:0"),
            "uid:0 may acquire locks starting with nothing (perm)");
}

TEST(PermissionsTest, AnErrorNamesTheLineAndTheReason) {
  const std::pair<const char*, const char*> cases[] = {
      {"uid:1 acquire a/\nuid:1 aquire b/\n", "perm line 2: unknown right \"aquire\""},
      {"uid:1\n", "perm line 1: no right after \"uid:1\""},
      {"alice acquire a/\n", "perm line 1: \"alice\" is not an identity"},
      {"uid:x acquire a/\n", "perm line 1: \"uid:x\" is not an identity"},
      {"\n\nuid:1 acquire\n", "perm line 3: acquire needs at least one lock-name prefix"},
      {"uid:1 list now\n", "perm line 1: list takes no arguments"},
      {"uid:1 acquire a/\xff\n", "perm line 1: only printable ASCII"},
  };
  for (const auto& [text, error] : cases) {
    auto p = Permissions::Parse(text, "perm");
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(), HasSubstr(error)) << text;
  }
  auto long_prefix = Permissions::Parse("uid:1 acquire " + std::string(600, 'a') + "\n", "perm");
  EXPECT_THAT(long_prefix.status().message(), HasSubstr("a prefix of 600 bytes"));
}

}  // namespace
}  // namespace fencelock::server
