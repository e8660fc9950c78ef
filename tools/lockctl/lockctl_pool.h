// lockctl's `pool` commands (lockctl_pool.cc).
#ifndef FENCELOCK_LOCK_SERVER_LOCKCTL_POOL_H_
#define FENCELOCK_LOCK_SERVER_LOCKCTL_POOL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

#include "lock-client/pool_client.h"

namespace fencelock {

// What lockctl prints and exits with for `s`, one code per kind of answer, so that a script
// can tell lockd's refusals from an unreachable lockd: 0 OK, 1 UNAVAILABLE or
// DEADLINE_EXCEEDED (lockd cannot be reached, does not answer in time, or does not serve its
// state), 2 INVALID_ARGUMENT (a bad flag or address, and usage errors), 3 no units now
// (pool acquire), 4 NOT_FOUND, 5 FAILED_PRECONDITION, 6 FENCED_OUT, 7 PERMISSION_DENIED,
// 8 UNSUPPORTED_VERSION, 9 LIMIT_EXCEEDED.
struct LockctlCode {
  const char* name;
  int exit;
};
LockctlCode LockctlCodeOf(const absl::Status& s);

// `s` as a JSON string literal, quotes and escapes included.
std::string JsonString(const std::string& s);

// Runs `lockctl pool <sub>` against the lockd `client_options` names; returns the exit status.
// `command` is what follows `--` (pool run only).
int PoolMain(const std::string& sub, const PoolClientOptions& client_options, bool json,
             const std::vector<std::string>& command = {});

// `lockctl pool run ... -- CMD`: acquires and activates the slot's lease, runs `command`,
// releases the lease; returns CMD's exit status (lockctl_pool_run.cc).
int PoolRun(const PoolClientOptions& client_options, const PoolOwnerId& owner,
            const std::vector<std::string>& command);

}  // namespace fencelock

#endif  // FENCELOCK_LOCK_SERVER_LOCKCTL_POOL_H_
