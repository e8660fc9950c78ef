#include "protocol/session.h"

#include <gtest/gtest.h>

#include <string>

namespace fencelock::protocol {
namespace {

wire::Response Answer(wire::Code code, uint32_t version = 0, std::string leader = "") {
  wire::Response r;
  r.set_code(code);
  r.set_message("because");
  r.mutable_hello()->set_version(version);
  r.mutable_hello()->set_leader(leader);
  return r;
}

TEST(SessionTest, HelloOffersEveryVersionThisBuildSpeaks) {
  const wire::Request hello = HelloRequest("worker-7");
  EXPECT_EQ(hello.hello().min_version(), kMinProtocolVersion);
  EXPECT_EQ(hello.hello().max_version(), kMaxProtocolVersion);
  EXPECT_EQ(hello.hello().client_name(), "worker-7");
}

TEST(SessionTest, AHelloAnswerGivesTheVersionOrWhyNot) {
  auto v = ReadHelloReply(Answer(wire::OK, kMaxProtocolVersion), "a:1");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, kMaxProtocolVersion);

  std::string leader;
  v = ReadHelloReply(Answer(wire::NOT_LEADER, 0, "b:2"), "a:1", &leader);
  EXPECT_TRUE(absl::IsUnavailable(v.status())) << v.status();
  EXPECT_EQ(leader, "b:2");
  EXPECT_EQ(v.status().message(), "lockd at a:1 refused Hello: because");

  v = ReadHelloReply(Answer(wire::UNSUPPORTED_VERSION), "a:1");
  EXPECT_TRUE(absl::IsFailedPrecondition(v.status())) << v.status();
  v = ReadHelloReply(Answer(wire::LIMIT_EXCEEDED), "a:1");
  EXPECT_TRUE(absl::IsResourceExhausted(v.status())) << v.status();
  // A server that answers a version nobody offered is refused too.
  v = ReadHelloReply(Answer(wire::OK, kMaxProtocolVersion + 1), "a:1");
  EXPECT_TRUE(absl::IsFailedPrecondition(v.status())) << v.status();
  v = ReadHelloReply(Answer(wire::OK, 0), "a:1");
  EXPECT_TRUE(absl::IsFailedPrecondition(v.status())) << v.status();
}

}  // namespace
}  // namespace fencelock::protocol
