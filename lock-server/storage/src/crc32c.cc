#include "crc32c.h"

#include <boost/crc.hpp>

namespace fencelock::server {

uint32_t Crc32c(std::string_view data) {
  // Polynomial 0x1EDC6F41, initial value and final XOR all ones, reflected in and out.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

}  // namespace fencelock::server
