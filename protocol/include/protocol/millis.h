// Durations on the wire: whole milliseconds in an unsigned field. Every speaker converts with
// these two, so that lockd, the client and the tools agree on the edges.
#ifndef FENCELOCK_PROTOCOL_MILLIS_H_
#define FENCELOCK_PROTOCOL_MILLIS_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace fencelock::protocol {

// A negative duration goes as 0; an infinite one as the largest count. A part of a millisecond
// counts as a whole one: 0 means "lockd's default" in a TTL, so a positive duration, however
// small, must never become it (a 0.5 ms TTL is refused by --min-ttl as 5 ms is, not granted as
// 30 s).
inline uint64_t ToWireMillis(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  return static_cast<uint64_t>(absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1))));
}

// Capped where a count of nanoseconds still fits an int64 (about 292 years), so that no
// deadline computed from it overflows, whatever a peer sends.
inline absl::Duration FromWireMillis(uint64_t ms) {
  return absl::Milliseconds(static_cast<int64_t>(std::min<uint64_t>(ms, INT64_MAX / 1'000'000)));
}

}  // namespace fencelock::protocol

#endif  // FENCELOCK_PROTOCOL_MILLIS_H_
