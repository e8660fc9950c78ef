// Shared by the fuzz targets: reading a fuzz input a piece at a time, and a fresh in-memory
// lockd state directory. fuzz_support.cc also defines the one LLVMFuzzerInitialize every
// target gets: it silences protobuf's log, which would report every string field that is not
// UTF-8 (lockd and recovery treat those as malformed input) and only slow the search down.
#ifndef FENCELOCK_FUZZ_FUZZ_SUPPORT_H_
#define FENCELOCK_FUZZ_FUZZ_SUPPORT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "lock-server/testing/test_envs.h"

namespace fencelock::fuzz {

// Takes bytes off the front of a fuzz input; past its end, every read gives zero.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : rest_(reinterpret_cast<const char*>(data), size) {}
  bool empty() const { return rest_.empty(); }
  uint8_t Byte() {
    if (rest_.empty()) return 0;
    const uint8_t b = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return b;
  }
  uint16_t U16() { return static_cast<uint16_t>(Byte() | (Byte() << 8)); }
  std::string_view Bytes(size_t n) {
    n = std::min(n, rest_.size());
    std::string_view out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return out;
  }
  std::string_view Rest() { return Bytes(rest_.size()); }

 private:
  std::string_view rest_;
};

inline constexpr char kStateDir[] = "/state";

// A state directory in `env` as `lockd init` makes it, with `snapshot` as snapshot-0 and
// `records` (record frames) as the contents of the first WAL segment.
void WriteStateDir(server::MemEnv& env, const std::string& snapshot, const std::string& records);

// Recovers the state directory in `env`. An error is fine; a state that breaks its own
// invariants aborts: every holder's session exists and lists the lock, no token is above the
// sequence, and a restart issues tokens above every one restored.
void RecoverAndCheck(server::MemEnv& env);

}  // namespace fencelock::fuzz

#endif  // FENCELOCK_FUZZ_FUZZ_SUPPORT_H_
