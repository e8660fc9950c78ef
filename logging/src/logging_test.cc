#include "logging/logging.h"

#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::logging {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

// What `write` sends to standard error while it runs.
template <typename Fn>
std::string CaptureStderr(Fn write) {
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  const int saved = dup(2);
  dup2(fileno(tmp), 2);
  write();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::rewind(tmp);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), tmp)) > 0;) out.append(buf, n);
  std::fclose(tmp);
  return out;
}

TEST(LoggingTest, LinesCarryAUtcTimestampTheLevelAndTheName) {
  Logger log("fencelock-client", Level::kInfo, Streams::kStderr);
  const std::string out = CaptureStderr([&] { log.Warning("heartbeat RTT p99 is high"); });
  EXPECT_TRUE(std::regex_match(
      out, std::regex("\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{6}Z warning "
                      "fencelock-client: heartbeat RTT p99 is high\n")))
      << out;
}

TEST(LoggingTest, LinesBelowTheThresholdAreNotWritten) {
  Logger log("t", Level::kWarning, Streams::kStderr);
  EXPECT_FALSE(log.enabled(Level::kInfo));
  EXPECT_THAT(CaptureStderr([&] { log.Info("quiet"); }), IsEmpty());
  EXPECT_THAT(CaptureStderr([&] { log.Error("loud"); }), HasSubstr(" error t: loud\n"));
  log.set_threshold(Level::kDebug);
  EXPECT_THAT(CaptureStderr([&] { log.Debug("details"); }), HasSubstr(" debug t: details\n"));
}

TEST(LoggingTest, SplitStreamsSendOnlyWarningsAndErrorsToStandardError) {
  Logger log("lockd", Level::kDebug, Streams::kSplit);
  EXPECT_THAT(CaptureStderr([&] { log.Info("to standard output"); }), IsEmpty());
  EXPECT_THAT(CaptureStderr([&] { log.Warning("to standard error"); }),
              HasSubstr(" warning lockd: to standard error\n"));
}

// A program's diagnostics: named by InitProgram, every level on standard error (its standard
// output is the command's result), below the threshold nothing.
TEST(LoggingTest, AProgramsLogIsNamedOnceAndWritesOnlyToStandardError) {
  EXPECT_THAT(CaptureStderr([] { Program().Error("before main named it"); }),
              HasSubstr(" error fencelock: before main named it\n"));
  InitProgram("lockctl", Level::kInfo);
  EXPECT_THAT(CaptureStderr([] { Program().Info("waiting for units"); }),
              HasSubstr(" info lockctl: waiting for units\n"));
  EXPECT_THAT(CaptureStderr([] { Program().Debug("details"); }), IsEmpty());
  InitProgram("payout-worker w1", Level::kWarning);
  EXPECT_THAT(CaptureStderr([] { Program().Info("quiet"); }), IsEmpty());
  EXPECT_THAT(CaptureStderr([] { Program().Warning("loud"); }),
              HasSubstr(" warning payout-worker w1: loud\n"));
}

TEST(LoggingTest, LevelsParseByNameAndAnythingElseIsRefused) {
  for (Level level : {Level::kDebug, Level::kInfo, Level::kWarning, Level::kError}) {
    EXPECT_EQ(*ParseLevel(LevelName(level)), level);
  }
  auto bad = ParseLevel("verbose");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("\"verbose\" is not one of debug, info, warning, error"));
}

}  // namespace
}  // namespace fencelock::logging
