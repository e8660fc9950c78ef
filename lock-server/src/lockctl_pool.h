// lockctl's `pool` commands (lockctl_pool.cc).
#ifndef FENCELOCK_LOCK_SERVER_LOCKCTL_POOL_H_
#define FENCELOCK_LOCK_SERVER_LOCKCTL_POOL_H_

#include <string>

#include "lock-client/pool_client.h"

namespace fencelock {

// `s` as a JSON string literal, quotes and escapes included.
std::string JsonString(const std::string& s);

// Runs `lockctl pool <sub>` against the lockd `client_options` names; returns the exit status.
int PoolMain(const std::string& sub, const PoolClientOptions& client_options, bool json);

}  // namespace fencelock

#endif  // FENCELOCK_LOCK_SERVER_LOCKCTL_POOL_H_
