// LocalLockd against the real lockd binary, tried as a careless caller would.
#include "testing/local_lockd.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::testing {
namespace {

using ::testing::HasSubstr;

class LocalLockdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = std::filesystem::temp_directory_path() / "local-lockd-XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

// A port file left by an earlier run in the same directory is not taken for this lockd's port.
TEST_F(LocalLockdTest, AStalePortFileIsNotTakenForTheNewPort) {
  const std::string run = dir_ + "/run";
  std::filesystem::create_directories(run);
  std::ofstream(run + "/port") << "1\n";
  auto lockd = LocalLockd::Start({.binary = LOCKD_BINARY, .dir = run});
  ASSERT_TRUE(lockd.ok()) << lockd.status();
  EXPECT_NE((*lockd)->port(), 1);
  EXPECT_TRUE((*lockd)->child().running());
}

// A second lockd on a state directory one already serves is refused by `lockd init` (the state
// exists), with the command and the log named, and the first keeps serving.
TEST_F(LocalLockdTest, ASecondCopyOnTheSameStateIsAnErrorNotASecondServer) {
  auto first = LocalLockd::Start({.binary = LOCKD_BINARY, .dir = dir_ + "/one"});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = LocalLockd::Start({.binary = LOCKD_BINARY, .dir = dir_ + "/one"});
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr(" init --data-dir=" + dir_ + "/one/state"));
  EXPECT_THAT(second.status().message(), HasSubstr("see " + dir_ + "/one/lockd.log"));
  EXPECT_TRUE((*first)->child().running());
}

TEST_F(LocalLockdTest, AMissingBinaryOrABadFlagIsAnErrorNotAnAbort) {
  auto missing = LocalLockd::Start({.binary = dir_ + "/no-lockd", .dir = dir_ + "/a"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto bad = LocalLockd::Start(
      {.binary = LOCKD_BINARY, .dir = dir_ + "/b", .serve_args = {"--max-ttl=1000h"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("see " + dir_ + "/b/lockd.log"));
}

}  // namespace
}  // namespace fencelock::testing
