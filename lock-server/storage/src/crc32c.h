// CRC-32C (Castagnoli), the checksum of every record and file lockd writes. Debian's Abseil
// predates absl/crc; Boost.CRC (Boost is already a dependency) computes it, table-driven, a
// byte at a time. crc32c_test checks it against RFC 3720's published values.
#ifndef FENCELOCK_LOCK_SERVER_CRC32C_H_
#define FENCELOCK_LOCK_SERVER_CRC32C_H_

#include <cstdint>
#include <string_view>

namespace fencelock::server {

// CRC-32C of `data`.
uint32_t Crc32c(std::string_view data);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_CRC32C_H_
