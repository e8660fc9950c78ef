// The two numbers every part of fencelock passes around, as types of their own: a fencing
// token (strictly increasing across grants, the value a resource's fence compares) and a
// session id. Both are 64-bit on the wire and in the state; here they cannot be mixed up with
// each other or with a count, and nothing converts to or from a plain integer without saying
// so (FenceToken(n), token.value()).
//
// Header-only (the protocol_defaults library). lockd's rules, storage and runtime and the
// simulator use them; a value read from or written to the wire converts where it is read or
// written (dispatch, the state codec). absl::StrCat and StrAppend print one as its number.
#ifndef FENCELOCK_PROTOCOL_IDS_H_
#define FENCELOCK_PROTOCOL_IDS_H_

#include <compare>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fencelock {

template <typename Tag>
class Id {
 public:
  // The largest a state may hold: lockd does not start from a state above it (a damaged or
  // hand-made one; no lockd hands out 2^63 ids). The room above keeps Next() and every
  // reservation (a block of at most 2^40 ahead) from wrapping past zero.
  static constexpr uint64_t kMaxInState = uint64_t{1} << 63;

  constexpr Id() = default;
  constexpr explicit Id(uint64_t value) : value_(value) {}
  constexpr uint64_t value() const { return value_; }
  // The next one in sequence (what a grant or an opened session takes after the last).
  constexpr Id Next() const { return Id(value_ + 1); }
  // `n` further on (a mark reserved ahead of use). Two ids do not add.
  friend constexpr Id operator+(Id id, uint64_t n) { return Id(id.value_ + n); }

  friend constexpr bool operator==(Id, Id) = default;
  friend constexpr std::strong_ordering operator<=>(Id, Id) = default;
  template <typename H>
  friend H AbslHashValue(H h, Id id) {
    return H::combine(std::move(h), id.value_);
  }
  // For absl::StrCat and StrAppend (Abseil 20220623 has no AbslStringify): formatting only.
  operator absl::AlphaNum() const { return absl::AlphaNum(value_); }  // NOLINT
  // For gtest's messages and any std::ostream, without including <ostream> here.
  template <typename Stream>
  friend auto operator<<(Stream& out, Id id) -> decltype(out << uint64_t{}) {
    return out << id.value_;
  }

 private:
  uint64_t value_ = 0;
};

struct FenceTokenTag;
struct SessionIdTag;
using FenceToken = Id<FenceTokenTag>;
using SessionId = Id<SessionIdTag>;

// For tests and fixed examples: 7_token, 2_session. `using namespace fencelock::id_literals;`
namespace id_literals {
constexpr FenceToken operator""_token(unsigned long long n) { return FenceToken(n); }
constexpr SessionId operator""_session(unsigned long long n) { return SessionId(n); }
}  // namespace id_literals

}  // namespace fencelock

#endif  // FENCELOCK_PROTOCOL_IDS_H_
