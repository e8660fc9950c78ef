// JSON for the runners' reports, through protobuf's JSON support (the project links protobuf
// already): one set of printing options, so every report names fields the same way.
#ifndef FENCELOCK_PROCESS_JSON_H_
#define FENCELOCK_PROCESS_JSON_H_

#include <string>

#include "absl/status/status.h"

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace fencelock::process {

// `message` as indented JSON with the .proto's field names (snake_case) and every field
// present, zeros and empty lists included; ends with a newline.
std::string ToJson(const google::protobuf::Message& message);

// Parses what ToJson wrote (or any JSON for `message`'s type) into `message`. Errors:
// kInvalidArgument naming what protobuf could not parse.
absl::Status FromJson(const std::string& json, google::protobuf::Message* message);

}  // namespace fencelock::process

#endif  // FENCELOCK_PROCESS_JSON_H_
