// What client_core.cc, client_core_link.cc and client_core_replies.cc share: ClientCore is one
// class defined in three files (operations and sending; the link and the session; replies and
// time). Only those files include this.
#ifndef FENCELOCK_LOCK_CLIENT_CORE_CLIENT_CORE_INTERNAL_H_
#define FENCELOCK_LOCK_CLIENT_CORE_CLIENT_CORE_INTERNAL_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "lock-client/core/client_core.h"
#include "protocol/requests.h"

namespace fencelock::client_core::internal {

// After a failed exchange or dial round the next try comes sooner than a period, from here
// doubling up to the period: leases are renewed as soon as lockd answers again.
inline constexpr absl::Duration kRetryFirst = absl::Milliseconds(20);

inline std::string LeaseName(const LeaseState& state) {
  return absl::StrCat("lock \"", state.lock(), "\" (token ", state.token(), ")");
}

// The reason a lease was lost, without looking at its deadline; kNone while it is not marked.
inline LossReason MarkedReason(const LeaseState& state) {
  const LossReason r = state.Check(MonoTime::Min());
  return r == LossReason::kDeadlinePassed && state.deadline() != MonoTime::Min()
             ? LossReason::kNone
             : r;
}

}  // namespace fencelock::client_core::internal

#endif  // FENCELOCK_LOCK_CLIENT_CORE_CLIENT_CORE_INTERNAL_H_
