// Issue 13, finding 6: every program's --help lists its own flags (absl's default matched none
// of them and printed "No flags matched").
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs `command` in a shell; its exit status and everything it wrote.
std::pair<int, std::string> RunShell(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string Help(const std::string& binary) { return RunShell(binary + " --help").second; }

TEST(HelpTest, EveryProgramListsItsFlags) {
  for (const auto& [binary, flag] : {std::pair{LOCKD_BINARY, "--data_dir"},
                                      std::pair{LOCKCTL_BINARY, "--timeout"},
                                      std::pair{PAYOUT_DEMO_BINARY, "--workers"},
                                      std::pair{PAYOUT_WORKER_BINARY, "--lockd"},
                                      std::pair{PAYOUT_RAIL_BINARY, "--port"},
                                      std::pair{HARNESS_BINARY, "--seed"},
                                      std::pair{SIM_BINARY, "--seeds"}}) {
    SCOPED_TRACE(binary);
    const std::string help = Help(binary);
    EXPECT_THAT(help, HasSubstr(flag));
    EXPECT_THAT(help, Not(HasSubstr("No flags matched")));
    // Issue 59: help is an answer, not an error (it exited 1), and names no file of the
    // checkout the program was built from ("Flags from /home/.../lockd_main.cc:").
    for (const char* asked : {" --help", " -help", " --helpfull"}) {
      auto [status, out] = RunShell(binary + std::string(asked));
      EXPECT_EQ(status, 0) << asked;
      EXPECT_THAT(out, HasSubstr(flag)) << asked;
      EXPECT_THAT(out, Not(HasSubstr("Flags from"))) << asked;
      EXPECT_THAT(out, Not(HasSubstr(".cc"))) << asked;
      // The programs a package installs name nothing of the build (the demo's tools default
      // to their siblings in the build tree, which is what their help should say).
      if (binary == std::string(LOCKD_BINARY) || binary == std::string(LOCKCTL_BINARY)) {
        EXPECT_THAT(out, Not(HasSubstr(SOURCE_DIR))) << asked;
      }
    }
  }
}

// The default --help shows for `flag`: absl prints "--name (help text); default: <value>;",
// wrapping long lines.
std::string FlagDefault(const std::string& help, const std::string& flag) {
  const size_t at = help.find("--" + flag + " (");
  if (at == std::string::npos) return "no --" + flag;
  const size_t value = help.find("default: ", at);
  if (value == std::string::npos) return "no default for --" + flag;
  const size_t end = help.find(';', value);
  return help.substr(value + 9, end - value - 9);
}

// ADR-006 C5 §5.1 (protocol/defaults.h; defaults_test checks the values).
TEST(HelpTest, TheContractDefaultsAreTheFlagsDefaults) {
  const std::string lockd = Help(LOCKD_BINARY);
  EXPECT_EQ(FlagDefault(lockd, "session_ttl"), "15s");
  EXPECT_EQ(FlagDefault(lockd, "lock_ttl"), "30s");
  const std::string worker = Help(PAYOUT_WORKER_BINARY);
  EXPECT_EQ(FlagDefault(worker, "session_ttl"), "15s");
  EXPECT_EQ(FlagDefault(worker, "lock_ttl"), "30s");
  EXPECT_EQ(FlagDefault(worker, "margin"), "0.3");
}

// Issue 41: the packaged units pass lockd its flags in a file (--flagfile), spelled with dashes
// as on the command line.
TEST(FlagfileTest, FlagsComeFromFilesInTheirPlace) {
  char pattern[] = "/tmp/fencelock-flagfile-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const std::string flags = dir + "/lockd.flags";
  std::ofstream(flags) << "# lockd's flags\n\n  --data-dir=" << dir << "/from-file  \n"
                       << "--wal_segment_bytes=65536\n";
  const std::string lockd = LOCKD_BINARY;
  // The file's flags, dashed or not, with comments and blank lines.
  auto [status, out] = RunShell(lockd + " init --flagfile=" + flags);
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/from-file")) << out;
  // A flag after the file overrides it.
  std::tie(status, out) = RunShell(lockd + " init --flagfile=" + flags + " --data-dir=" + dir + "/later");
  EXPECT_EQ(status, 0) << out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/later")) << out;
  // Files that cannot be read, are not files, or hold something else are refused by name.
  std::tie(status, out) = RunShell(lockd + " init --flagfile=" + dir + "/missing");
  EXPECT_EQ(status, 2);
  EXPECT_THAT(out, HasSubstr("--flagfile=" + dir + "/missing: cannot read it"));
  std::tie(status, out) = RunShell(lockd + " init --flagfile=" + dir);
  EXPECT_EQ(status, 2);
  EXPECT_THAT(out, HasSubstr("not a regular file"));
  std::ofstream(dir + "/bad.flags") << "--port=7420\ndata-dir=/var/lib/lockd\n";
  std::tie(status, out) = RunShell(lockd + " init --flagfile=" + dir + "/bad.flags");
  EXPECT_EQ(status, 2);
  EXPECT_THAT(out, HasSubstr("bad.flags:2: \"data-dir=/var/lib/lockd\" is not a flag"));
  std::ofstream(dir + "/self.flags") << "--flagfile=" << dir << "/self.flags\n";
  std::tie(status, out) = RunShell(lockd + " init --flagfile=" + dir + "/self.flags");
  EXPECT_EQ(status, 2);
  EXPECT_THAT(out, HasSubstr("more than 8 deep"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fencelock
