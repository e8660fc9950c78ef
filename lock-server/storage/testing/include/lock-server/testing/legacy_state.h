// State as older lockds wrote it, for tests of the upgrade paths. Never in a production target.
#ifndef FENCELOCK_LOCK_SERVER_TESTING_LEGACY_STATE_H_
#define FENCELOCK_LOCK_SERVER_TESTING_LEGACY_STATE_H_

#include <string>

#include "absl/time/time.h"
#include "lock-server/state_machine.h"

namespace fencelock::server {

// A snapshot after lsn 0 holding one session, `session` with `ttl`, whose secret is stored
// in clear (SnapshotSession.secret, field 3), as lockd wrote snapshots before issue 33: encoded
// by hand as protobuf, since today's encoder writes only digests.
std::string SnapshotWithASecretInClear(SessionId session, absl::Duration ttl,
                                       const std::string& secret);

// The same with, instead of a session, pool `pool` (generation 1, budget 4) whose one profile
// `profile` (cost 1) was claimed at epoch 1 with owner key `key`, stored in clear
// (SnapshotPoolOwner.key, field 3).
std::string SnapshotWithAPoolOwnerKeyInClear(const std::string& pool, const std::string& profile,
                                             const std::string& key);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_TESTING_LEGACY_STATE_H_
