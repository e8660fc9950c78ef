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

}  // namespace
}  // namespace fencelock
