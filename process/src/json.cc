#include "process/json.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"

namespace fencelock::process {

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // Printing a message that is already in memory fails only for types JSON cannot express
  // (none in our reports).
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "{}\n";
  if (json.empty() || json.back() != '\n') json.push_back('\n');
  return json;
}

absl::Status FromJson(const std::string& json, google::protobuf::Message* message) {
  auto status = google::protobuf::util::JsonStringToMessage(json, message);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not a ", message->GetTypeName(),
                                                    " in JSON: ", status.message().as_string()));
  }
  return absl::OkStatus();
}

}  // namespace fencelock::process
