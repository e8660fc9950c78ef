// The first exchange of every connection to lockd: Hello, and what its answer means. Used by
// the client, BlockingConnection (lockctl, the tests, the harness) and the simulator, so that
// all of them offer the same versions and read a refusal the same way.
#ifndef FENCELOCK_PROTOCOL_SESSION_H_
#define FENCELOCK_PROTOCOL_SESSION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fencelock/wire.pb.h"
#include "protocol/version.h"

namespace fencelock::protocol {

// Hello offering `range` (by default every version this build speaks), naming the client.
wire::Request HelloRequest(absl::string_view client_name, VersionRange range = {});

// The negotiated version from lockd's answer to HelloRequest(..., range). A refusal is the
// code's status (protocol/codes.h) with a message naming `address`: kFailedPrecondition for no
// common version, kUnavailable for a standby (NOT_LEADER), which sets `*leader` to the serving
// replica it names (empty if it does not know). A version outside `range` is
// kFailedPrecondition too.
absl::StatusOr<uint32_t> ReadHelloReply(const wire::Response& reply, absl::string_view address,
                                        std::string* leader = nullptr, VersionRange range = {});

}  // namespace fencelock::protocol

#endif  // FENCELOCK_PROTOCOL_SESSION_H_
