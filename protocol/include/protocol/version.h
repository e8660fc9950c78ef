// Protocol version negotiation.
//
// A client's Hello names the inclusive range of versions it speaks; the server answers with
// the highest version both sides speak, or refuses with a message naming both ranges.
#ifndef FENCELOCK_PROTOCOL_VERSION_H_
#define FENCELOCK_PROTOCOL_VERSION_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace fencelock::protocol {

// The versions this build speaks, as client and as server.
inline constexpr uint32_t kMinProtocolVersion = 1;
inline constexpr uint32_t kMaxProtocolVersion = 6;
// The first version with the admission pools' requests.
inline constexpr uint32_t kPoolProtocolVersion = 2;
// The first version with WithdrawAcquire.
inline constexpr uint32_t kWithdrawProtocolVersion = 3;
// The first version with PoolDelete.
inline constexpr uint32_t kPoolDeleteProtocolVersion = 4;
// The first version with Acquire's mode and lock delay (ADR 0006).
inline constexpr uint32_t kSharedLockProtocolVersion = 5;
// The first version with Renew: a session and all its locks renewed without naming them, and
// several sessions in one request (ADR 0014).
inline constexpr uint32_t kRenewProtocolVersion = 6;

struct VersionRange {
  uint32_t min = kMinProtocolVersion;
  uint32_t max = kMaxProtocolVersion;
};

// Returns the highest version in both ranges. Returns kInvalidArgument for a range whose min
// exceeds its max, kFailedPrecondition when the ranges do not overlap; both messages name the
// client's and the server's ranges.
absl::StatusOr<uint32_t> NegotiateVersion(VersionRange client, VersionRange server);

}  // namespace fencelock::protocol

#endif  // FENCELOCK_PROTOCOL_VERSION_H_
