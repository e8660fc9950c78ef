// What storage.cc shares with the test library (lock-server/storage/testing) and nothing else.
#ifndef FENCELOCK_LOCK_SERVER_STORAGE_INTERNAL_H_
#define FENCELOCK_LOCK_SERVER_STORAGE_INTERNAL_H_

#include <cstdint>
#include <string>

#include "lock-server/storage.h"

namespace fencelock::server::internal {

// Recover(), ignoring every record after `stop_after_lsn`; with UINT64_MAX it is Recover().
// Below that, a log that ends before the COMMITTED mark is not refused.
absl::StatusOr<Recovered> RecoverThrough(Env* env, const std::string& dir, MonoTime now,
                                         uint64_t stop_after_lsn);

}  // namespace fencelock::server::internal

#endif  // FENCELOCK_LOCK_SERVER_STORAGE_INTERNAL_H_
