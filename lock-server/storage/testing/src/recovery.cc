#include "lock-server/testing/recovery.h"

#include "storage_internal.h"

namespace fencelock::server::testing {

absl::StatusOr<Recovered> RecoverThrough(Env* env, const std::string& dir, MonoTime now,
                                         uint64_t last_lsn) {
  return internal::RecoverThrough(env, dir, now, last_lsn);
}

}  // namespace fencelock::server::testing
