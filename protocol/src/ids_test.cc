// FenceToken and SessionId: what they refuse to mix with, at compile time, and what they do.
#include "protocol/ids.h"

#include <sstream>
#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace fencelock {
namespace {

using namespace ::fencelock::id_literals;

// No implicit way in or out, and the two never mix.
static_assert(!std::is_convertible_v<uint64_t, FenceToken>);
static_assert(!std::is_convertible_v<int, SessionId>);
static_assert(!std::is_convertible_v<FenceToken, uint64_t>);
static_assert(!std::is_convertible_v<FenceToken, SessionId>);
static_assert(!std::is_constructible_v<SessionId, FenceToken>);
static_assert(!std::is_assignable_v<FenceToken&, uint64_t>);
template <typename A, typename B>
concept Comparable = requires(A a, B b) { a < b; a == b; };
static_assert(Comparable<FenceToken, FenceToken>);
static_assert(!Comparable<FenceToken, SessionId>);
static_assert(!Comparable<FenceToken, uint64_t>);
template <typename A, typename B>
concept Addable = requires(A a, B b) { a + b; };
static_assert(Addable<FenceToken, uint64_t>);
static_assert(!Addable<FenceToken, FenceToken>);
static_assert(sizeof(FenceToken) == sizeof(uint64_t));
static_assert(std::is_trivially_copyable_v<FenceToken>);

TEST(IdsTest, OrderNextAndDistance) {
  EXPECT_EQ(FenceToken().value(), 0u);
  EXPECT_LT(1_token, 2_token);
  EXPECT_EQ((1_token).Next(), 2_token);
  EXPECT_EQ(5_token + 3, 8_token);
  EXPECT_EQ(FenceToken(~uint64_t{0}).value(), ~uint64_t{0});
}

TEST(IdsTest, PrintsAsItsNumber) {
  EXPECT_EQ(absl::StrCat("token ", 42_token, " session ", 7_session), "token 42 session 7");
  std::ostringstream out;
  out << 18446744073709551615_token;
  EXPECT_EQ(out.str(), "18446744073709551615");
}

TEST(IdsTest, HashesAsAKey) {
  absl::flat_hash_set<SessionId> sessions = {1_session, 2_session, 1_session};
  EXPECT_EQ(sessions.size(), 2u);
  EXPECT_TRUE(sessions.contains(2_session));
}

}  // namespace
}  // namespace fencelock
