// A child process started with fork/exec: signalled, waited for with a timeout (asleep until it
// exits or the timeout passes, on a pidfd), and never outliving its parent (PR_SET_PDEATHSIG). The destructor stops a child still running
// (SIGTERM, then SIGKILL after a grace period) and reaps it, so a runner that returns early or
// is interrupted leaves no process behind.
#ifndef FENCELOCK_PROCESS_PROCESS_H_
#define FENCELOCK_PROCESS_PROCESS_H_

#include <sys/types.h>
#include <unistd.h>

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
  // What the child reads as its standard input; empty: inherited from the parent.
  std::string stdin_file;
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

  // Starts `binary` with `args` (after argv[0]). Errors name the cause: kNotFound or
  // kPermissionDenied when `binary` cannot be executed, kUnavailable when an output file cannot
  // be opened or fork fails.
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

  // Waits up to `timeout` (infinite by default; measured on the monotonic clock) for the child
  // to exit and returns its wait status (as waitpid() reports it); std::nullopt if it is still
  // running at the timeout. Returns as soon as the child exits.
  std::optional<int> Wait(absl::Duration timeout = absl::InfiniteDuration());

  // SIGTERM, then SIGKILL if it has not exited within `grace`; returns the wait status.
  int Stop(absl::Duration grace = absl::Seconds(5));

  // Gives up ownership: returns the pid (the caller now signals and reaps it) and leaves this
  // object empty, so its destructor does nothing.
  pid_t Detach() {
    const pid_t pid = pid_;
    pid_ = -1;
    if (pidfd_ >= 0) close(pidfd_);
    pidfd_ = -1;
    status_.reset();
    return pid;
  }

  // The wait status once reaped.
  std::optional<int> status() const { return status_; }

 private:
  explicit Child(pid_t pid) : pid_(pid) {}
  // waitpid() for the child, blocking or not; true once it is reaped.
  bool Reap(bool block);
  pid_t pid_ = -1;
  int pidfd_ = -1;  // readable once the child exits; -1 if the kernel gave none
  std::optional<int> status_;
};

// Writes `port` to `path` atomically (a temporary file, then rename), so a reader never sees a
// partial number. Empty `path`: nothing to do.
absl::Status WritePortFile(const std::string& path, int port);

// Waits up to `timeout` for `path` to hold a port written by WritePortFile() from `child`.
// Errors name the child's exit when it dies first, and the file on timeout.
absl::StatusOr<int> AwaitPortFile(const std::string& path, Child& child, absl::Duration timeout);

// A TCP port on 127.0.0.1 that was free a moment ago (bound, then closed), for a process that
// must be told its port before it listens (a standby lockd, an etcd member). It is chosen at
// random below the kernel's ephemeral range (net.ipv4.ip_local_port_range), where no outgoing
// connection takes a local port in the meantime: a port from that range (what binding port 0
// gives) could be taken by any client's connect() before the process binds it. Falls back to
// port 0 only when nothing below the range is free.
absl::StatusOr<int> FreeLoopbackPort();

// Runs `binary` with `args` (after argv[0]) and waits up to `timeout` for it to end: OK when it
// exited 0; otherwise kInternal naming the command, how it ended (or that it was stopped at the
// timeout) and where its output went. For one-shot commands such as `lockd init`.
absl::Status RunToSuccess(const std::string& binary, const std::vector<std::string>& args,
                          const SpawnOptions& options = {},
                          absl::Duration timeout = absl::Minutes(1));

// "exited 0", "exited 3", "killed by SIGKILL": a wait status for messages.
std::string DescribeStatus(int wait_status);

}  // namespace fencelock::process

#endif  // FENCELOCK_PROCESS_PROCESS_H_
