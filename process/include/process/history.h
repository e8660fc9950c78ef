// The event history that every process of a payout run appends to, for the harness's history
// checker (harness/checker.h). One record per line:
//
//   <begin_ns> <end_ns> <process> <event> <key> <token> [detail...]
//
// begin_ns and end_ns are readings of the boot-time clock (CLOCK_BOOTTIME), which every
// process on the machine shares: begin is read before the step is attempted, end after its
// outcome is known, so the step took effect somewhere inside [begin, end]. <key> is the lock
// or resource ("payout/17"), "-" when there is none; <token> is 0 when there is none.
//
// Events (docs/harness.md has the full list): acquire (begin = request sent, end = grant
// received), claimed, marked-submitted, status-asked, step-started, submitted, paid,
// fenced (detail names the fence), abandoned, lost, released; the rail's own "admit" and
// "refuse" records carry its fence's decisions.
#ifndef FENCELOCK_PROCESS_HISTORY_H_
#define FENCELOCK_PROCESS_HISTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fencelock::history {

struct Record {
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  std::string process;
  std::string event;
  std::string key;  // "-" for none
  uint64_t token = 0;
  std::string detail;  // free text, may be empty
};

// Now on the boot-time clock, in nanoseconds.
int64_t NowNanos();

// The record as one line, without the newline. Fields must not contain spaces or newlines
// (the detail may contain spaces).
std::string Format(const Record& record);
// Parses one line; the error names what is wrong with it.
absl::StatusOr<Record> Parse(const std::string& line);
// Every record of a history file; the error names the file and line.
absl::StatusOr<std::vector<Record>> ReadFile(const std::string& path);

// Appends records to a file with one write(2) per record (O_APPEND), so a record is either
// whole in the file or absent, even when the process is killed right after. Thread-safe.
class Writer {
 public:
  // An empty path gives a writer that records nothing.
  static absl::StatusOr<std::unique_ptr<Writer>> Open(const std::string& path,
                                                      std::string process);
  ~Writer();
  // One record of a step that began at `begin_ns` and ended at `end_ns` (0: now).
  void Append(int64_t begin_ns, const std::string& event, const std::string& key,
              uint64_t token, const std::string& detail = "", int64_t end_ns = 0);

 private:
  Writer(int fd, std::string process) : fd_(fd), process_(std::move(process)) {}
  const int fd_;
  const std::string process_;
};

}  // namespace fencelock::history

#endif  // FENCELOCK_PROCESS_HISTORY_H_
