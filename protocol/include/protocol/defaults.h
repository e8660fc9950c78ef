// The contract's defaults (ADR-006's C5 §5.1), defined once. lockd's TTLs for requests that
// name none, the client's options and the payout worker's flags all start from these;
// tests/defaults_test.cc checks the values against the contract and every user against them.
#ifndef FENCELOCK_PROTOCOL_DEFAULTS_H_
#define FENCELOCK_PROTOCOL_DEFAULTS_H_

#include "absl/time/time.h"

namespace fencelock::defaults {

// lock.session.ttl: how long lockd keeps a session without a keep-alive.
inline constexpr absl::Duration kSessionTtl = absl::Seconds(15);
// lock.default.ttl: the lease of an acquire that names none.
inline constexpr absl::Duration kLockTtl = absl::Seconds(30);
// lock.client.safety-margin: the fraction of every lease the client refuses to use.
inline constexpr double kSafetyMargin = 0.30;

// Admission pools (seed ADR-0006): a manager's positive demand lives this long without a
// refresh. Autoscaled managers refresh it every kPoolDemandRefresh, fixed ones retry their
// pending acquire (which refreshes it too) every kPoolAcquireRetry; lockd refuses a demand TTL
// below kMinPoolDemandTtl, which outlasts both with a beat to spare (issue 35).
inline constexpr absl::Duration kPoolDemandTtl = absl::Seconds(30);
inline constexpr absl::Duration kPoolDemandRefresh = absl::Seconds(1);
inline constexpr absl::Duration kPoolAcquireRetry = absl::Seconds(2);
inline constexpr absl::Duration kMinPoolDemandTtl = absl::Seconds(3);  // retry + refresh

}  // namespace fencelock::defaults

#endif  // FENCELOCK_PROTOCOL_DEFAULTS_H_
