// Issue 19: lockd's log lines are timestamped and leveled (spdlog), info on standard output and
// errors on standard error, and --log-level chooses the least level written. A level that is
// not one of the four is refused at start, naming them.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct Outcome {
  int exit_code;
  std::string out, err;
};

class LockdLogTest : public ::testing::Test {
 protected:
  LockdLogTest() {
    char pattern[] = "/tmp/lockd-log-XXXXXX";
    dir_ = mkdtemp(pattern);
  }
  ~LockdLogTest() override { std::filesystem::remove_all(dir_); }

  Outcome Lockd(const std::string& args) {
    const std::string cmd = std::string(LOCKD_BINARY) + " " + args + " >" + dir_ + "/out 2>" +
                            dir_ + "/err";
    const int status = std::system(cmd.c_str());
    return Outcome{WEXITSTATUS(status), Read("out"), Read("err")};
  }
  std::string Read(const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
  }

  std::string dir_;
};

const char kStamp[] = "\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{6}Z ";

TEST_F(LockdLogTest, InfoGoesToStandardOutputTimestampedAndErrorsToStandardError) {
  Outcome init = Lockd("init --data-dir=" + dir_ + "/state");
  EXPECT_EQ(init.exit_code, 0) << init.err;
  EXPECT_TRUE(std::regex_match(init.out, std::regex(std::string(kStamp) +
                                                    "info lockd: initialized state directory " +
                                                    dir_ + "/state\n")))
      << init.out;
  EXPECT_THAT(init.err, IsEmpty());

  Outcome again = Lockd("init --data-dir=" + dir_ + "/state");
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.out, IsEmpty());
  EXPECT_TRUE(std::regex_search(again.err, std::regex(std::string("^") + kStamp +
                                                      "error lockd: init: ")))
      << again.err;
}

TEST_F(LockdLogTest, TheLogLevelFlagChoosesTheLeastLevelWritten) {
  Outcome quiet = Lockd("init --log-level=warning --data-dir=" + dir_ + "/quiet");
  EXPECT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_THAT(quiet.out, IsEmpty());
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/quiet"));

  Outcome bad = Lockd("serve --log-level=verbose --data-dir=" + dir_ + "/quiet");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("error lockd: --log-level: log level \"verbose\" is not one of "
                                 "debug, info, warning, error"));
  EXPECT_THAT(bad.out, IsEmpty());
}

// Issue 33: the line saying that recovery dropped bytes at the end of the log was an info line,
// so --log-level=warning hid it. Whatever recovery drops or ignores is a warning.
TEST_F(LockdLogTest, WhatRecoveryDroppedIsAWarning) {
  ASSERT_EQ(Lockd("init --wal-segment-bytes=65536 --data-dir=" + dir_ + "/torn").exit_code, 0);
  {
    // Bytes that are no record where the first record would go: a torn append.
    std::fstream wal(dir_ + "/torn/wal-00000000000000000001",
                     std::ios::in | std::ios::out | std::ios::binary);
    wal.seekp(32);
    wal << "not a record";
  }
  // Served until it listens, then stopped.
  const std::string serve = std::string(LOCKD_BINARY) +
                            " serve --log-level=warning --port=0 --metrics-port=-1 --data-dir=" +
                            dir_ + "/torn --port-file=" + dir_ + "/port >" + dir_ + "/out 2>" +
                            dir_ + "/err & pid=$!; for i in $(seq 200); do [ -s " + dir_ +
                            "/port ] && break; sleep 0.05; done; kill $pid; wait $pid";
  ASSERT_EQ(std::system(serve.c_str()), 0);
  const Outcome served{0, Read("out"), Read("err")};
  EXPECT_TRUE(std::regex_search(
      served.err, std::regex(std::string(kStamp) + "warning lockd: .*wal-00000000000000000001: "
                             "offset 32: dropped 12 bytes after the last valid record")))
      << served.err;
  EXPECT_THAT(served.out, IsEmpty());
}

}  // namespace
}  // namespace fencelock
