// Issue 13, finding 6: every program's --help lists its own flags (absl's default matched none
// of them and printed "No flags matched").
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Help(const std::string& binary) {
  FILE* pipe = popen((binary + " --help 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  pclose(pipe);
  return out;
}

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

}  // namespace
}  // namespace fencelock
