// Starts a real `lockd` process for a test on a free loopback port (and optionally a Unix
// socket in a fresh temporary directory), and stops it when the object goes away.
#ifndef FENCELOCK_TESTS_SUPPORT_LOCKD_PROCESS_H_
#define FENCELOCK_TESTS_SUPPORT_LOCKD_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "process/process.h"

namespace fencelock::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The whole contents of a file; empty if it cannot be read.
std::string ReadTextFile(const std::string& path);

// Starts `binary` with `args` as a child process that is killed if the test process dies;
// its stderr goes to `stderr_file` when one is given. Aborts if it cannot fork.
pid_t SpawnProcess(const std::string& binary, const std::vector<std::string>& args,
                   const std::string& stderr_file = "");

// Runs `lockd init` on `data_dir`; returns lockd's exit status (0 on success).
int InitDataDir(const std::string& data_dir, uint64_t segment_bytes = 1 << 20);

// Runs `lockd serve` with `args` to completion (for commands expected to refuse); returns the
// exit status and everything it wrote to stderr.
std::pair<int, std::string> RunLockdToExit(const std::vector<std::string>& args);

class LockdProcess {
 public:
  struct Options {
    bool unix_socket = false;
    std::vector<std::string> extra_args;  // e.g. "--session-ttl=300ms"
    // State directory; empty: a fresh one in the process's temporary directory, initialized.
    std::string data_dir;
    // WAL segment size for the directory this creates (small keeps tests light).
    uint64_t segment_bytes = 1 << 20;
    // Where lockd's standard error goes; empty: the test's own.
    std::string stderr_file;
    // Where lockd's standard output goes (its startup and SIGHUP lines); empty: the test's own.
    std::string stdout_file;
    // The state in etcd instead of a directory: its endpoints and the prefix; `lockd init
    // --etcd` runs first unless etcd_init is false (the prefix is already initialized).
    std::string etcd;
    std::string etcd_prefix;
    bool etcd_init = true;
    // Flags for both `lockd init` and `lockd serve` on etcd: how to reach it (--etcd-tls-*,
    // --etcd-user and --etcd-password-file).
    std::vector<std::string> etcd_args;
    // The TCP port; 0 picks a free one.
    int port = 0;
    // A program (and its arguments) that execs lockd's command line given after them, in the
    // same process: e.g. tests' no_netlink, which refuses netlink sockets first. Empty: none.
    std::vector<std::string> launcher;
  };
  // Starts lockd and waits until it listens; aborts the test binary if it cannot start.
  explicit LockdProcess(Options options);
  LockdProcess() : LockdProcess(Options{}) {}
  // SIGTERM, then SIGKILL if it does not exit within 5 s; aborts if lockd did not exit cleanly.
  ~LockdProcess();

  // SIGKILL, as a crash would, and reap it.
  void Kill();
  // Starts lockd again on the same state directory and, if it can, the same port.
  void Restart();
  bool running() const { return child_.running(); }
  const std::string& data_dir() const { return data_dir_; }

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::string tcp_address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string unix_address() const { return "unix:" + unix_path_; }
  const std::string& unix_path() const { return unix_path_; }
  pid_t pid() const { return child_.running() ? child_.pid() : -1; }
  // The file lockd writes its TCP port to once it serves (--port-file).
  std::string port_file() const { return dir_.path() + "/port"; }
  process::Child& child() { return child_; }

  // Sends SIGTERM and waits; returns the exit status as waitpid() reported it.
  int Stop();
  // Waits up to `timeout` for lockd to exit by itself; its wait status, or nullopt.
  std::optional<int> WaitForExit(absl::Duration timeout) { return child_.Wait(timeout); }

 private:
  void Start(int port);

  Options options_;
  TempDir dir_;
  std::string data_dir_;
  process::Child child_;
  int port_ = 0;
  int metrics_port_ = 0;
  std::string unix_path_;
};

}  // namespace fencelock::testing

#endif  // FENCELOCK_TESTS_SUPPORT_LOCKD_PROCESS_H_
