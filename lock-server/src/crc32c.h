// CRC-32C (Castagnoli), the checksum of every record and file lockd writes. Debian's Abseil
// predates absl/crc, so this is a small table-driven implementation.
#ifndef FENCELOCK_LOCK_SERVER_CRC32C_H_
#define FENCELOCK_LOCK_SERVER_CRC32C_H_

#include <cstdint>
#include <string_view>

namespace fencelock::server {

// CRC-32C of `data`, continuing from `crc` (0 to start).
uint32_t Crc32c(std::string_view data, uint32_t crc = 0);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_CRC32C_H_
