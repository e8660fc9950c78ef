#include "logging/logging.h"

#include <cstdio>
#include <mutex>
#include <utility>

#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

#include "absl/strings/str_cat.h"

namespace fencelock::logging {
namespace {

spdlog::level::level_enum ToSpdlog(Level level) {
  switch (level) {
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarning:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
  }
  return spdlog::level::err;
}

// Writes each formatted line to standard output or standard error by its level, and flushes
// it: a log read while the process runs (or after it is killed) has every line written so far.
class StreamSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit StreamSink(Streams streams) : streams_(streams) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    std::FILE* out =
        streams_ == Streams::kStderr || msg.level >= spdlog::level::warn ? stderr : stdout;
    std::fwrite(line.data(), 1, line.size(), out);
    std::fflush(out);
  }
  void flush_() override {
    std::fflush(stdout);
    std::fflush(stderr);
  }

 private:
  const Streams streams_;
};

}  // namespace

const char* LevelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarning:
      return "warning";
    case Level::kError:
      return "error";
  }
  return "error";
}

absl::StatusOr<Level> ParseLevel(std::string_view text) {
  for (Level level : {Level::kDebug, Level::kInfo, Level::kWarning, Level::kError}) {
    if (text == LevelName(level)) return level;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "log level \"", absl::string_view(text.data(), text.size()),
      "\" is not one of debug, info, warning, error"));
}

struct Logger::Impl {
  spdlog::logger logger;
};

Logger::Logger(std::string name, Level threshold, Streams streams)
    : impl_(new Impl{spdlog::logger(std::move(name), std::make_shared<StreamSink>(streams))}) {
  // spdlog's own level names ("warning", "error"), in UTC with microseconds.
  impl_->logger.set_formatter(std::make_unique<spdlog::pattern_formatter>(
      "%Y-%m-%dT%H:%M:%S.%fZ %l %n: %v", spdlog::pattern_time_type::utc));
  impl_->logger.set_level(ToSpdlog(threshold));
  impl_->logger.flush_on(spdlog::level::trace);
}

Logger::~Logger() = default;

void Logger::Log(Level level, std::string_view message) const {
  impl_->logger.log(ToSpdlog(level), spdlog::string_view_t(message.data(), message.size()));
}

bool Logger::enabled(Level level) const { return impl_->logger.should_log(ToSpdlog(level)); }

void Logger::set_threshold(Level threshold) { impl_->logger.set_level(ToSpdlog(threshold)); }

namespace {
Logger& LockdLogger() {
  static Logger* const lockd = new Logger("lockd", Level::kInfo, Streams::kSplit);
  return *lockd;
}

Logger*& ProgramLogger() {
  static Logger* program = new Logger("fencelock", Level::kInfo, Streams::kStderr);
  return program;
}
}  // namespace

const Logger& Lockd() { return LockdLogger(); }
void SetLockdThreshold(Level threshold) { LockdLogger().set_threshold(threshold); }

// Before any other thread starts (logging.h), so nothing is writing through the one replaced.
// The current one is never freed: a thread may still log while the process exits.
void InitProgram(std::string name, Level threshold) {
  Logger* replaced =
      std::exchange(ProgramLogger(), new Logger(std::move(name), threshold, Streams::kStderr));
  delete replaced;
}
const Logger& Program() { return *ProgramLogger(); }

}  // namespace fencelock::logging
