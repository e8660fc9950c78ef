#include "protocol/codes.h"

namespace fencelock::protocol {

wire::Code CodeFromStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return wire::OK;
    case absl::StatusCode::kAborted:
      return wire::FENCED_OUT;
    case absl::StatusCode::kNotFound:
      return wire::SESSION_NOT_FOUND;
    case absl::StatusCode::kDeadlineExceeded:
      return wire::WAIT_TIMEOUT;
    case absl::StatusCode::kInvalidArgument:
      return wire::INVALID_ARGUMENT;
    case absl::StatusCode::kCancelled:
      return wire::CANCELLED;
    case absl::StatusCode::kFailedPrecondition:
      return wire::UNSUPPORTED_VERSION;
    case absl::StatusCode::kResourceExhausted:
      return wire::LIMIT_EXCEEDED;
    case absl::StatusCode::kPermissionDenied:
      return wire::PERMISSION_DENIED;
    default:
      return wire::UNAVAILABLE;
  }
}

wire::Code PoolCodeFromStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return wire::NOT_FOUND;
    case absl::StatusCode::kFailedPrecondition:
      return wire::FAILED_PRECONDITION;
    default:
      return CodeFromStatus(status);
  }
}

absl::Status StatusFromCode(wire::Code code, absl::string_view message) {
  switch (code) {
    case wire::OK:
      return absl::OkStatus();
    case wire::FENCED_OUT:
      return absl::AbortedError(message);
    case wire::SESSION_NOT_FOUND:
    case wire::NOT_FOUND:
      return absl::NotFoundError(message);
    case wire::WAIT_TIMEOUT:
      return absl::DeadlineExceededError(message);
    case wire::INVALID_ARGUMENT:
    case wire::MALFORMED_REQUEST:
    case wire::FRAME_TOO_LARGE:
      return absl::InvalidArgumentError(message);
    case wire::UNSUPPORTED_VERSION:
    case wire::HELLO_REQUIRED:
    case wire::FAILED_PRECONDITION:
      return absl::FailedPreconditionError(message);
    case wire::CANCELLED:
      return absl::CancelledError(message);
    case wire::UNAVAILABLE:
    case wire::NOT_LEADER:
      return absl::UnavailableError(message);
    case wire::LIMIT_EXCEEDED:
      return absl::ResourceExhaustedError(message);
    case wire::PERMISSION_DENIED:
      return absl::PermissionDeniedError(message);
    default:
      return absl::UnknownError(message);
  }
}

}  // namespace fencelock::protocol
