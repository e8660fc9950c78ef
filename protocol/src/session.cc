#include "protocol/session.h"

#include "absl/strings/str_cat.h"
#include "protocol/codes.h"

namespace fencelock::protocol {

wire::Request HelloRequest(absl::string_view client_name, VersionRange range) {
  wire::Request hello;
  hello.mutable_hello()->set_min_version(range.min);
  hello.mutable_hello()->set_max_version(range.max);
  hello.mutable_hello()->set_client_name(std::string(client_name));
  return hello;
}

absl::StatusOr<uint32_t> ReadHelloReply(const wire::Response& reply, absl::string_view address,
                                        std::string* leader, VersionRange range) {
  if (reply.code() == wire::NOT_LEADER && leader != nullptr) *leader = reply.hello().leader();
  if (reply.code() != wire::OK) {
    return StatusFromCode(reply.code(),
                          absl::StrCat("lockd at ", address, " refused Hello: ", reply.message()));
  }
  const uint32_t version = reply.hello().version();
  if (version < range.min || version > range.max) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lockd at ", address, " answered Hello with protocol version ", version,
        ", outside the offered ", range.min, " to ", range.max));
  }
  return version;
}

}  // namespace fencelock::protocol
