// Issue 59: `lockd destroy --data-dir` removes only what lockd wrote. Run as an operator would,
// with the real binary on real directories: a directory that is not a state directory keeps
// every file, however they are named; a symbolic link is never followed; one of lockd's names
// that is not a regular file stops the destroy before anything goes; a directory that is not
// lockd's keeps it.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lockd_process.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;
using testing::RunLockdToExit;
using testing::TempDir;

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

void Touch(const std::string& path, const std::string& text = "someone's\n") {
  std::ofstream(path) << text;
}

std::pair<int, std::string> Destroy(const std::string& dir) {
  auto [status, err] = RunLockdToExit({"destroy", "--data-dir=" + dir});
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, err};
}

TEST(LockdDestroyTest, ADirectoryWithoutFormatKeepsEveryFileWhateverItsName) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/notes";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::vector<std::string> files = {"a.tmp", "wal-e-notes.txt", "snapshot-of-prod.sql"};
  for (const std::string& f : files) Touch(dir + "/" + f);
  auto [code, err] = Destroy(dir);
  EXPECT_EQ(code, 1) << err;
  EXPECT_THAT(err, HasSubstr("is not a lockd state directory"));
  EXPECT_THAT(err, HasSubstr("nothing removed"));
  EXPECT_THAT(Names(dir), UnorderedElementsAreArray(files));
}

TEST(LockdDestroyTest, ASymbolicLinkIsNeverFollowed) {
  TempDir tmp;
  const std::string state = tmp.path() + "/state";
  ASSERT_EQ(testing::InitDataDir(state), 0);
  const std::vector<std::string> before = Names(state);
  const std::string link = tmp.path() + "/link";
  ASSERT_EQ(symlink(state.c_str(), link.c_str()), 0);
  auto [code, err] = Destroy(link);
  EXPECT_EQ(code, 1) << err;
  EXPECT_THAT(err, HasSubstr(link + " is a symbolic link"));
  EXPECT_THAT(err, HasSubstr("nothing removed"));
  EXPECT_THAT(Names(state), UnorderedElementsAreArray(before));
  // Named by itself, the same state goes.
  auto [done, done_err] = Destroy(state);
  EXPECT_EQ(done, 0) << done_err;
  EXPECT_FALSE(std::filesystem::exists(state));
}

// A directory where lockd writes a file (snapshot-<20 digits>) stops the destroy before FORMAT
// goes; a directory with any other name is someone else's, kept with the state directory.
TEST(LockdDestroyTest, WhatIsNotARegularFileOfLockdsIsNeverRemoved) {
  TempDir tmp;
  const std::string state = tmp.path() + "/state";
  ASSERT_EQ(testing::InitDataDir(state), 0);
  const std::string odd = state + "/snapshot-00000000000000000007";
  ASSERT_EQ(mkdir(odd.c_str(), 0700), 0);
  const std::vector<std::string> before = Names(state);
  auto [code, err] = Destroy(state);
  EXPECT_EQ(code, 1) << err;
  EXPECT_THAT(err, HasSubstr(odd + " is not a regular file"));
  EXPECT_THAT(err, HasSubstr("nothing removed"));
  EXPECT_THAT(Names(state), UnorderedElementsAreArray(before));

  ASSERT_EQ(rmdir(odd.c_str()), 0);
  ASSERT_EQ(mkdir((state + "/snapshot-dir").c_str(), 0700), 0);
  Touch(state + "/wal-e-notes.txt");
  auto [done, done_err] = Destroy(state);
  EXPECT_EQ(done, 0) << done_err;
  EXPECT_THAT(done_err, HasSubstr("it holds files lockd did not write: snapshot-dir, wal-e-notes.txt"));
  EXPECT_THAT(Names(state), UnorderedElementsAreArray({"snapshot-dir", "wal-e-notes.txt"}));
  // Nothing of lockd's is left, so a second destroy has nothing to do and says so.
  auto [again, again_err] = Destroy(state);
  EXPECT_EQ(again, 1) << again_err;
  EXPECT_THAT(again_err, HasSubstr("is not a lockd state directory"));
}

}  // namespace
}  // namespace fencelock
