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

}  // namespace
}  // namespace fencelock
