#include "crc32c.h"

#include <array>

namespace fencelock::server {
namespace {

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

}  // namespace

uint32_t Crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (unsigned char b : data) crc = kTable[(crc ^ b) & 0xff] ^ (crc >> 8);
  return ~crc;
}

}  // namespace fencelock::server
