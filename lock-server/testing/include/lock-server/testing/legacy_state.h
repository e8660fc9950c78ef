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

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_TESTING_LEGACY_STATE_H_
