// Leveled, timestamped log lines for lockd and the client library, written through spdlog
// (Debian's libspdlog): each line is
//
//   2026-12-01T19:30:00.123456Z info lockd: listening on tcp 127.0.0.1:7420
//
// with the time in UTC from the wall clock (for people reading logs: no decision of the lock
// service reads it), the level, the log's name and the message. Lines below a log's threshold
// are not written. Thread-safe; each line is written whole, and flushed.
//
// spdlog stays out of this header, so that including it costs nothing.
#ifndef FENCELOCK_LOGGING_LOGGING_H_
#define FENCELOCK_LOGGING_LOGGING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fencelock::logging {

enum class Level : uint8_t { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug", "info", "warning", "error".
const char* LevelName(Level level);
// The inverse of LevelName; kInvalidArgument naming the four for anything else.
absl::StatusOr<Level> ParseLevel(std::string_view text);

// Where a log's lines go.
enum class Streams : uint8_t {
  kSplit,   // debug and info to standard output, warnings and errors to standard error (lockd)
  kStderr,  // everything to standard error (a library inside someone else's process)
};

class Logger {
 public:
  // A log named `name` (the word before the message) that writes lines at `threshold` and
  // above.
  Logger(std::string name, Level threshold, Streams streams);
  ~Logger();
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  void Log(Level level, std::string_view message) const;
  void Debug(std::string_view message) const { Log(Level::kDebug, message); }
  void Info(std::string_view message) const { Log(Level::kInfo, message); }
  void Warning(std::string_view message) const { Log(Level::kWarning, message); }
  void Error(std::string_view message) const { Log(Level::kError, message); }

  bool enabled(Level level) const;
  void set_threshold(Level threshold);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// lockd's log ("lockd", kSplit), at kInfo until SetLockdThreshold (lockd --log-level).
const Logger& Lockd();
void SetLockdThreshold(Level threshold);

// The log of every other program of the project (lockctl, the payout demo's processes, the
// harness, the benchmark, the simulator, the power-cut tools): its diagnostics, everything to
// standard error, so that standard output holds only the command's result. InitProgram names
// it (the program's name, the word before each message) once, first thing in main, before any
// other thread starts, and a reference from Program() is not kept across it; until then it is
// "fencelock". Usage text and a benchmark's live progress line are not log lines and stay
// plain.
void InitProgram(std::string name, Level threshold = Level::kInfo);
const Logger& Program();

}  // namespace fencelock::logging

#endif  // FENCELOCK_LOGGING_LOGGING_H_
