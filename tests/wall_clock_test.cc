// Issue 13, finding 2: a client whose wall clock is an hour off (Debian's faketime, with the
// monotonic and boot-time clocks left alone) keeps its lock and heart-beats at its normal rate.
// Before the fix its heartbeat waited until a wall-clock time: an hour ahead it stopped (the
// lock was lost at its deadline), an hour behind it sent thousands of KeepAlives a second.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lockd_process.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;

struct ClientRun {
  int exit_code = -1;
  std::string output;
  double heartbeats = -1;
};

// Runs the client for 6 s with its wall clock shifted by `offset` ("" for none).
ClientRun RunClient(const std::string& server, const std::string& offset) {
  std::string command = std::string(WALL_CLOCK_CLIENT_BINARY) + " --server=" + server +
                        " --hold=6s --ttl=2s 2>&1";
  if (!offset.empty()) {
    // In an AddressSanitizer build libfaketime is preloaded ahead of ASan's runtime, which
    // ASan refuses unless told the order is on purpose.
    command = "FAKETIME_DONT_FAKE_MONOTONIC=1 "
              "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0\" " +
              std::string(FAKETIME_BINARY) + " -f '" + offset + "' " + command;
  }
  ClientRun run;
  FILE* pipe = popen(command.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) run.output.append(buf, n);
  run.exit_code = WEXITSTATUS(pclose(pipe));
  // "held 6s heartbeats N failures M"
  std::vector<std::string> words = absl::StrSplit(run.output, absl::ByAnyChar(" \n"));
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    if (words[i] == "heartbeats") (void)absl::SimpleAtod(words[i + 1], &run.heartbeats);
  }
  return run;
}

TEST(WallClockTest, AClientWithItsWallClockAnHourOffKeepsItsLockAndItsPace) {
  testing::LockdProcess lockd;
  for (const std::string offset : {"", "+1h", "-1h"}) {
    SCOPED_TRACE("wall clock offset '" + offset + "'");
    const ClientRun run = RunClient(lockd.tcp_address(), offset);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("held 6s")) << run.output;
    // A heartbeat every third of the 2 s TTL: about 9 in 6 s. Stopped would be 0; flooding,
    // thousands.
    EXPECT_GE(run.heartbeats, 4) << run.output;
    EXPECT_LE(run.heartbeats, 20) << run.output;
  }
}

}  // namespace
}  // namespace fencelock
