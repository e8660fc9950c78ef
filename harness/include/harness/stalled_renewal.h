// One lease renewal whose reply a fault proxy holds for a while: the measurement behind the
// harness's stalled-reply scenario and network_fault_test. The client must reach lockd through
// `proxy`, and nothing else may be in flight on that proxy (set the client's heartbeat period
// long so that only this renewal runs).
#ifndef FENCELOCK_HARNESS_STALLED_RENEWAL_H_
#define FENCELOCK_HARNESS_STALLED_RENEWAL_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clock/clock.h"
#include "harness/fault_proxy.h"
#include "lock-client/client.h"

namespace fencelock::harness {

struct StalledRenewal {
  // When the proxy first saw the KeepAlive. The client read t_send before writing it, so
  // t_send is no later than this.
  MonoTime seen_by_proxy;
  MonoTime reply_at;  // when renewNow() returned
  MonoTime deadline;  // the handle's deadline right after
};

// Holds every reply to the client, runs client.renewNow(), releases the held bytes after
// `stall`, and reads the handle's new deadline. Errors: the renewal's own.
absl::StatusOr<StalledRenewal> RenewThroughStall(FaultProxy& proxy, Client& client,
                                                 const LockHandle& lock, absl::Duration stall);

}  // namespace fencelock::harness

#endif  // FENCELOCK_HARNESS_STALLED_RENEWAL_H_
