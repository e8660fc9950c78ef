// Starts a real `lockd` process for a test on a free loopback port (and optionally a Unix
// socket in a fresh temporary directory), and stops it when the object goes away.
#ifndef FENCELOCK_TESTS_SUPPORT_LOCKD_PROCESS_H_
#define FENCELOCK_TESTS_SUPPORT_LOCKD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

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

class LockdProcess {
 public:
  struct Options {
    bool unix_socket = false;
    std::vector<std::string> extra_args;  // e.g. "--session_ttl=300ms"
  };
  // Starts lockd and waits until it listens; aborts the test binary if it cannot start.
  explicit LockdProcess(Options options);
  LockdProcess() : LockdProcess(Options{}) {}
  ~LockdProcess();  // SIGTERM, then SIGKILL if it does not exit within 5 s

  int port() const { return port_; }
  std::string tcp_address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string unix_address() const { return "unix:" + unix_path_; }
  const std::string& unix_path() const { return unix_path_; }
  pid_t pid() const { return pid_; }

  void Pause();   // SIGSTOP
  void Resume();  // SIGCONT
  // Sends SIGTERM and waits; returns the exit status as waitpid() reported it.
  int Stop();

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string unix_path_;
};

}  // namespace fencelock::testing

#endif  // FENCELOCK_TESTS_SUPPORT_LOCKD_PROCESS_H_
