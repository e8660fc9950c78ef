// Limits of the wire protocol that both sides need to know.
#ifndef FENCELOCK_PROTOCOL_LIMITS_H_
#define FENCELOCK_PROTOCOL_LIMITS_H_

#include <cstdint>

namespace fencelock::protocol {

// ListLocks: entries in a page when the request names no limit, and the most it may name.
inline constexpr uint32_t kDefaultListLimit = 1000;
inline constexpr uint32_t kMaxListLimit = 10000;
// ListLocks: bytes of entries in a page when the request names no budget.
inline constexpr uint32_t kDefaultListBytes = 256 * 1024;
// ListLocks: the holders listed in one lock's entry (the lowest tokens); holder_count has them
// all. A lock held shared by tens of thousands of sessions still lists in one frame.
inline constexpr uint32_t kMaxListedHolders = 1000;

}  // namespace fencelock::protocol

#endif  // FENCELOCK_PROTOCOL_LIMITS_H_
