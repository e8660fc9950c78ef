#include "protocol/address.h"

#include <sys/un.h>

#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fencelock::protocol {
namespace {

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "bad lockd address \"", text, "\": ", why,
      " (expected host:port, [ipv6]:port or unix:/path)"));
}

}  // namespace

absl::StatusOr<Address> ParseAddress(absl::string_view text) {
  Address a;
  a.text = std::string(text);
  if (text.rfind("unix:", 0) == 0) {
    a.kind = Address::Kind::kUnix;
    a.path = std::string(text.substr(5));
    if (a.path.empty() || a.path.size() >= sizeof(sockaddr_un::sun_path)) {
      return Bad(text, absl::StrCat("a Unix socket path must be 1 to ",
                                    sizeof(sockaddr_un::sun_path) - 1, " bytes"));
    }
    return a;
  }
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) return Bad(text, "no port");
  absl::string_view host = text.substr(0, colon);
  const absl::string_view port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return Bad(text, "an IPv6 address goes in brackets, as in [::1]:7420");
  }
  if (host.empty()) return Bad(text, "no host");
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value == 0 ||
      value > 65535) {
    return Bad(text, absl::StrCat("the port \"", port, "\" is not a number from 1 to 65535"));
  }
  a.host = std::string(host);
  a.port = static_cast<uint16_t>(value);
  return a;
}

absl::StatusOr<std::vector<Address>> ParseAddressList(absl::string_view text) {
  std::vector<Address> list;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    if (entry.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad lockd address list \"", text, "\": an empty entry"));
    }
    auto a = ParseAddress(entry);
    if (!a.ok()) return a.status();
    for (const Address& seen : list) {
      if (seen.text == a->text) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad lockd address list \"", text, "\": ", entry, " twice"));
      }
    }
    list.push_back(*std::move(a));
  }
  return list;
}

}  // namespace fencelock::protocol
