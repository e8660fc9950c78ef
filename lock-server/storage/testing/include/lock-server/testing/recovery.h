// Recovery for tests that compute the expected state at a point of the log (lockd itself only
// ever recovers all of it, with Recover()).
#ifndef FENCELOCK_LOCK_SERVER_TESTING_RECOVERY_H_
#define FENCELOCK_LOCK_SERVER_TESTING_RECOVERY_H_

#include <cstdint>
#include <string>

#include "lock-server/storage.h"

namespace fencelock::server::testing {

// The state in `dir` as of record `last_lsn` (records after it are read and checked, not
// applied), restored as Recover() does at server time `now`. A log that ends before its
// COMMITTED mark is not refused here as long as it reaches `last_lsn`.
absl::StatusOr<Recovered> RecoverThrough(Env* env, const std::string& dir, MonoTime now,
                                         uint64_t last_lsn);

}  // namespace fencelock::server::testing

#endif  // FENCELOCK_LOCK_SERVER_TESTING_RECOVERY_H_
