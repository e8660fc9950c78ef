// A child process started with fork/exec: signalled, waited for with a timeout, and never
// outliving its parent (PR_SET_PDEATHSIG). The destructor stops a child still running
// (SIGTERM, then SIGKILL after a grace period) and reaps it, so a runner that returns early or
// is interrupted leaves no process behind.
#ifndef FENCELOCK_PROCESS_PROCESS_H_
#define FENCELOCK_PROCESS_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fencelock::process {

struct SpawnOptions {
  // Where the child's standard output and error go; empty: inherited from the parent.
  // The same path for both is fine (opened once, appended).
  std::string stdout_file;
  std::string stderr_file;
  // Signal the child receives when the parent thread that spawned it dies. Default: SIGKILL.
  int parent_death_signal = 9;
  // "NAME=value" entries added to the parent's environment for the child (replacing a variable
  // of the same name). Default: none.
  std::vector<std::string> environment;
};

class Child {
 public:
  Child() = default;
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();

  // Starts `binary` with `args` (after argv[0]). Errors: kInternal when fork fails. A binary
  // that cannot be executed exits with status 127 and says why on its standard error.
  static absl::StatusOr<Child> Spawn(const std::string& binary,
                                     const std::vector<std::string>& args,
                                     const SpawnOptions& options = {});

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !status_.has_value(); }

  // Sends `signal` to a child still running; a no-op once it has been reaped.
  void Signal(int signal) const;

  // True while the kernel reports the child stopped by a signal (SIGSTOP, sent to it or raised
  // by itself), from /proc/<pid>/stat: a SIGSTOP has taken effect only once this holds. A
  // tracing stop ('t') is not one: LeakSanitizer ptrace-stops every process it checks at exit.
  bool stopped() const;

  // Waits up to `timeout` (infinite by default) for the child to exit and returns its wait
  // status (as waitpid() reports it); std::nullopt if it is still running at the timeout.
  std::optional<int> Wait(absl::Duration timeout = absl::InfiniteDuration());

  // SIGTERM, then SIGKILL if it has not exited within `grace`; returns the wait status.
  int Stop(absl::Duration grace = absl::Seconds(5));

  // Gives up ownership: returns the pid (the caller now signals and reaps it) and leaves this
  // object empty, so its destructor does nothing.
  pid_t Detach() {
    const pid_t pid = pid_;
    pid_ = -1;
    status_.reset();
    return pid;
  }

  // The wait status once reaped.
  std::optional<int> status() const { return status_; }

 private:
  explicit Child(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// Writes `port` to `path` atomically (a temporary file, then rename), so a reader never sees a
// partial number. Empty `path`: nothing to do.
absl::Status WritePortFile(const std::string& path, int port);

// Waits up to `timeout` for `path` to hold a port written by WritePortFile() from `child`.
// Errors name the child's exit when it dies first, and the file on timeout.
absl::StatusOr<int> AwaitPortFile(const std::string& path, Child& child, absl::Duration timeout);

// "exited 0", "exited 3", "killed by SIGKILL": a wait status for messages.
std::string DescribeStatus(int wait_status);

}  // namespace fencelock::process

#endif  // FENCELOCK_PROCESS_PROCESS_H_
