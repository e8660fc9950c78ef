// Durations on the wire: whole milliseconds in an unsigned field. Every speaker converts with
// these two, so that lockd, the client and the tools agree on the edges.
#ifndef FENCELOCK_PROTOCOL_MILLIS_H_
#define FENCELOCK_PROTOCOL_MILLIS_H_

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace fencelock::protocol {

// A negative duration goes as 0; an infinite one as the largest count.
inline uint64_t ToWireMillis(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(d)));
}

// Capped where a count of nanoseconds still fits an int64 (about 292 years), so that no
// deadline computed from it overflows, whatever a peer sends.
inline absl::Duration FromWireMillis(uint64_t ms) {
  return absl::Milliseconds(static_cast<int64_t>(std::min<uint64_t>(ms, INT64_MAX / 1'000'000)));
}

}  // namespace fencelock::protocol

#endif  // FENCELOCK_PROTOCOL_MILLIS_H_
