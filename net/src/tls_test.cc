#include "net/tls.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::net {
namespace {

using ::testing::HasSubstr;

TEST(TlsTest, TheServerNameIsTheHostOfTheAddress) {
  EXPECT_EQ(ServerNameOf("lockd.example:7420"), "lockd.example");
  EXPECT_EQ(ServerNameOf("127.0.0.1:7420"), "127.0.0.1");
  EXPECT_EQ(ServerNameOf("[::1]:7420"), "::1");
  EXPECT_EQ(ServerNameOf("unix:/run/lockd.sock"), "");
}

TEST(TlsTest, AContextNeedsAllThreeFilesAndNamesTheOneThatFails) {
  auto partial = TlsContext::Create({.ca_file = "ca.crt", .cert_file = "w.crt"}, TlsRole::kClient,
                                    "--tls-");
  EXPECT_TRUE(absl::IsInvalidArgument(partial.status()));
  EXPECT_THAT(partial.status().message(), HasSubstr("--tls-key is missing"));
  auto missing = TlsContext::Create(
      {.ca_file = "/nonexistent/ca.crt", .cert_file = "/nonexistent/w.crt", .key_file = "/k"},
      TlsRole::kServer, "--tls-");
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_THAT(missing.status().message(),
              HasSubstr("cannot load the CA certificate /nonexistent/ca.crt (--tls-ca)"));
  auto fifo = TlsContext::Create({.ca_file = "/dev/zero", .cert_file = "c", .key_file = "k"},
                                 TlsRole::kServer, "--tls-");
  EXPECT_THAT(fifo.status().message(),
              HasSubstr("/dev/zero (--tls-ca) is not a regular PEM file"));
  EXPECT_FALSE(TlsFiles{}.enabled());
  EXPECT_TRUE(TlsFiles{.key_file = "k"}.enabled());
}

}  // namespace
}  // namespace fencelock::net
