// A lockd process on this host for a benchmark or a tool's run: `lockd init` on a fresh state
// directory (unless the state is in etcd), then `lockd serve` on a port the kernel picks, read
// back from its port file (a stale one from an earlier run in the same directory is removed
// first, so its port is never taken for this lockd's). The process is a process::Child: killed
// if the caller dies, and stopped (SIGTERM, then SIGKILL) when the object goes away.
//
// Errors, never aborts: a missing binary, a failed init or a lockd that does not come up are
// statuses naming the cause and the log to read.
//
// Not thread-safe: one owner.
#ifndef FENCELOCK_TESTING_LOCAL_LOCKD_H_
#define FENCELOCK_TESTING_LOCAL_LOCKD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "process/process.h"

namespace fencelock::testing {

struct LocalLockdOptions {
  std::string binary;  // the lockd binary
  // A directory for lockd's state (<dir>/state), port file and log (<dir>/lockd.log); made if
  // missing.
  std::string dir;
  // More flags for `lockd init` (e.g. --wal-segment-bytes) and for `lockd serve` (TLS, limits).
  std::vector<std::string> init_args;
  std::vector<std::string> serve_args;
  // Serve the state already in <dir>/state (a restart) instead of running `lockd init`.
  bool existing_state = false;
  // The state in etcd instead of <dir>/state: lockd's --etcd endpoints and --etcd-prefix, which
  // must already be initialized (`lockd init --etcd`). Default: empty, a state directory.
  std::string etcd;
  std::string etcd_prefix;
  // How long init, and then serve until its port file appears, may each take.
  absl::Duration start_timeout = absl::Seconds(30);
};

class LocalLockd {
 public:
  static absl::StatusOr<std::unique_ptr<LocalLockd>> Start(LocalLockdOptions options);
  LocalLockd(const LocalLockd&) = delete;
  LocalLockd& operator=(const LocalLockd&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  process::Child& child() { return child_; }

 private:
  LocalLockd() = default;
  process::Child child_;
  int port_ = 0;
};

}  // namespace fencelock::testing

#endif  // FENCELOCK_TESTING_LOCAL_LOCKD_H_
