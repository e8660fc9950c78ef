#include "protocol/version.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fencelock::protocol {

absl::StatusOr<uint32_t> NegotiateVersion(VersionRange client, VersionRange server) {
  const std::string ranges = absl::StrCat("client speaks versions [", client.min, ", ",
                                          client.max, "], server speaks [", server.min, ", ",
                                          server.max, "]");
  if (client.min > client.max) {
    return absl::InvalidArgumentError(absl::StrCat("empty version range: ", ranges));
  }
  const uint32_t low = std::max(client.min, server.min);
  const uint32_t high = std::min(client.max, server.max);
  if (low > high) {
    return absl::FailedPreconditionError(absl::StrCat("no common protocol version: ", ranges));
  }
  return high;
}

}  // namespace fencelock::protocol
