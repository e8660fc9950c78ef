#include "log_limiter.h"

#include "absl/strings/str_cat.h"

namespace fencelock::server {

void LogLimiter::Log(const std::string& kind, const std::string& line) {
  Kind& k = kinds_[kind];
  const MonoTime now = time_->Now();
  if (now >= k.window_end) {
    k.window_end = now + interval_;
    sink_(line);
    return;
  }
  ++k.left_out;
  k.last = line;
  if (k.timer == nullptr) k.timer = time_->NewTimer();
  if (k.timer->armed_for() == MonoTime::Max()) {
    k.timer->ArmAt(k.window_end, [this, kind] { EndWindow(kind); });
  }
}

void LogLimiter::EndWindow(const std::string& kind) {
  Kind& k = kinds_[kind];
  if (k.left_out == 0) return;
  sink_(absl::StrCat(k.left_out, " more like this in the last ", absl::FormatDuration(interval_),
                     " (", kind, "), the last: ", k.last));
  k.left_out = 0;
  k.last.clear();
  // The summary counts as the window's line: the next one starts a new window.
  k.window_end = time_->Now() + interval_;
}

void LogLimiter::Flush() {
  for (auto& [kind, k] : kinds_) {
    if (k.timer) k.timer->Cancel();
    EndWindow(kind);
  }
}

}  // namespace fencelock::server
