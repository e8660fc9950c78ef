// CRC-32C against published check values: the CRC catalogue's check value for "123456789",
// and the four 32-byte vectors of RFC 3720 (iSCSI), appendix B.4.
#include "crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace fencelock::server {
namespace {

TEST(Crc32cTest, MatchesPublishedCheckValues) {
  EXPECT_EQ(Crc32c(""), 0x00000000u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\x00')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, EverySingleBitFlipChangesTheChecksum) {
  std::string record = "lsn 42: acquire payout/7 session 3 token 99 ttl 30000";
  const uint32_t intact = Crc32c(record);
  for (size_t byte = 0; byte < record.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      record[byte] ^= static_cast<char>(1 << bit);
      EXPECT_NE(Crc32c(record), intact) << "byte " << byte << " bit " << bit;
      record[byte] ^= static_cast<char>(1 << bit);
    }
  }
}

}  // namespace
}  // namespace fencelock::server
