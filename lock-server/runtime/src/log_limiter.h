// Operator log lines that a peer can cause in bulk (a fenced-out request, a foreign token, a
// refused connection, a failing accept), at most one per kind per interval. The first line of a
// kind goes out at once; the ones that follow within the interval are counted, and when it ends
// one line says how many were left out and repeats the last of them. Nothing is lost from the
// counters: only the log is thinned.
//
// Not thread-safe: the owner's thread (that of its TimeSource).
#ifndef FENCELOCK_LOCK_SERVER_LOG_LIMITER_H_
#define FENCELOCK_LOCK_SERVER_LOG_LIMITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "clock/time_source.h"

namespace fencelock::server {

class LogLimiter {
 public:
  LogLimiter(TimeSource* time, absl::Duration interval, std::function<void(const std::string&)> sink)
      : time_(time), interval_(interval), sink_(std::move(sink)) {}

  // Logs `line` now, or counts it if a line of `kind` went out less than an interval ago.
  void Log(const std::string& kind, const std::string& line);
  // Reports what is still counted, at once (at shutdown).
  void Flush();

 private:
  struct Kind {
    MonoTime window_end = MonoTime::Min();
    uint64_t left_out = 0;
    std::string last;
    std::unique_ptr<Timer> timer;  // armed for window_end while something is left out
  };
  void EndWindow(const std::string& kind);

  TimeSource* const time_;
  const absl::Duration interval_;
  std::function<void(const std::string&)> sink_;
  std::map<std::string, Kind> kinds_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_LOG_LIMITER_H_
