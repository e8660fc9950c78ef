// lockd's addresses, as every part of fencelock writes them: "host:port" (a name, an IPv4
// address, or an IPv6 address in brackets, "[::1]:7420"), "unix:/path", or, for replicas on
// one etcd prefix, a comma-separated list of those. One parser, so that the client, lockctl,
// the benchmark and the tests accept and refuse the same strings with the same messages.
#ifndef FENCELOCK_PROTOCOL_ADDRESS_H_
#define FENCELOCK_PROTOCOL_ADDRESS_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace fencelock::protocol {

struct Address {
  enum class Kind { kTcp, kUnix };
  Kind kind = Kind::kTcp;
  std::string host;  // kTcp: without brackets
  uint16_t port = 0;  // kTcp: 1 to 65535
  std::string path;  // kUnix: 1 to 107 bytes
  std::string text;  // as given

  bool unix_socket() const { return kind == Kind::kUnix; }
};

// kInvalidArgument, naming the address and what is wrong with it, for anything else: an empty
// host or port, a port that is not a decimal number from 1 to 65535, an IPv6 address without
// brackets, a Unix path that is empty or longer than a socket address holds.
absl::StatusOr<Address> ParseAddress(absl::string_view text);

// A comma-separated list of addresses (one is a list of one). Refuses an empty entry and the
// same address twice, besides what ParseAddress refuses.
absl::StatusOr<std::vector<Address>> ParseAddressList(absl::string_view text);

}  // namespace fencelock::protocol

#endif  // FENCELOCK_PROTOCOL_ADDRESS_H_
