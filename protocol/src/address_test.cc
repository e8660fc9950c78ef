#include "protocol/address.h"

#include <gtest/gtest.h>

#include <string>

namespace fencelock::protocol {
namespace {

TEST(AddressTest, TakesHostPortIpv6AndUnix) {
  auto tcp = ParseAddress("lockd.internal:7420");
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_FALSE(tcp->unix_socket());
  EXPECT_EQ(tcp->host, "lockd.internal");
  EXPECT_EQ(tcp->port, 7420);
  auto v6 = ParseAddress("[::1]:65535");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 65535);
  auto unix_socket = ParseAddress("unix:/run/fencelock/lockd.sock");
  ASSERT_TRUE(unix_socket.ok()) << unix_socket.status();
  EXPECT_TRUE(unix_socket->unix_socket());
  EXPECT_EQ(unix_socket->path, "/run/fencelock/lockd.sock");
}

TEST(AddressTest, RefusesWhatIsNotAnAddressSayingWhy) {
  for (const char* bad : {"", "lockd", ":7420", "lockd:", "lockd:0", "lockd:65536", "lockd:74x",
                          "lockd:-1", "::1:7420", "[]:7420", "unix:",
                          "lockd: 7420"}) {
    auto a = ParseAddress(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << bad;
    EXPECT_NE(a.status().message().find(std::string("\"") + bad + "\""), std::string::npos)
        << a.status();
  }
  EXPECT_FALSE(ParseAddress("unix:/" + std::string(200, 'a')).ok());
}

TEST(AddressTest, AListIsCommaSeparatedWithoutEmptiesOrRepeats) {
  auto list = ParseAddressList("a:1,b:2,unix:/c");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[1].host, "b");
  EXPECT_EQ(ParseAddressList("a:1")->size(), 1u);
  EXPECT_FALSE(ParseAddressList("a:1,,b:2").ok());
  EXPECT_FALSE(ParseAddressList("a:1,").ok());
  EXPECT_FALSE(ParseAddressList("a:1,a:1").ok());
  EXPECT_FALSE(ParseAddressList("a:1,b").ok());
}

}  // namespace
}  // namespace fencelock::protocol
