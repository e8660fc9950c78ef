// Mapping between wire codes and canonical absl::Status codes, shared by server and client so
// that both ends agree on what each code means. Includes the generated protobuf header: use it
// from src/ files only.
#ifndef FENCELOCK_PROTOCOL_CODES_H_
#define FENCELOCK_PROTOCOL_CODES_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "fencelock/wire.pb.h"

namespace fencelock::protocol {

// kAborted -> FENCED_OUT, kNotFound -> SESSION_NOT_FOUND, kDeadlineExceeded -> WAIT_TIMEOUT,
// kInvalidArgument -> INVALID_ARGUMENT, kCancelled -> CANCELLED, kFailedPrecondition ->
// UNSUPPORTED_VERSION, anything else that is not OK -> UNAVAILABLE.
wire::Code CodeFromStatus(const absl::Status& status);

// For the admission pools' replies: kNotFound -> NOT_FOUND, kFailedPrecondition ->
// FAILED_PRECONDITION, the rest as CodeFromStatus.
wire::Code PoolCodeFromStatus(const absl::Status& status);

// The inverse (of both); protocol-level codes (MALFORMED_REQUEST, FRAME_TOO_LARGE, HELLO_REQUIRED) become
// kInvalidArgument or kFailedPrecondition. `message` becomes the status message.
absl::Status StatusFromCode(wire::Code code, absl::string_view message);

}  // namespace fencelock::protocol

#endif  // FENCELOCK_PROTOCOL_CODES_H_
