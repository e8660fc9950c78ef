// The byte layout that storage.cc (the state directory: its files and their recovery) and
// state_codec.cc (records and snapshots) share. Internal to lock-server/storage/src.
#ifndef FENCELOCK_LOCK_SERVER_STORAGE_FORMAT_H_
#define FENCELOCK_LOCK_SERVER_STORAGE_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "clock/clock.h"
#include "fencelock/state.pb.h"
#include "lock-server/state_machine.h"

namespace fencelock::server::format {

constexpr char kSegmentMagic[8] = {'F', 'L', 'W', 'A', 'L', 'S', 'E', 'G'};
constexpr char kSequencesMagic[4] = {'F', 'L', 'S', 'Q'};
constexpr char kSnapshotMagic[4] = {'F', 'L', 'S', 'N'};
constexpr char kCommittedMagic[4] = {'F', 'L', 'C', 'M'};
constexpr uint64_t kCommittedBytes = 20;
constexpr char kRecordMagic[4] = {'F', 'L', 'R', '1'};
constexpr uint32_t kFileVersion = 1;
// Snapshots: 2 adds shared holders and lock delays (ADR 0006). A version-1 snapshot reads as
// exclusive holders without delays; a lockd that knows only 1 refuses a 2 by name. 3 lists the
// holders by lock name (each lock's in token order) instead of by token, for it is read a slice
// at a time in name order (SnapshotEncoder); a lockd that knows only 2 refuses a 3 by name, and
// this one reads all three.
constexpr uint32_t kSnapshotVersion = 3;
constexpr uint64_t kSequencesBytes = 28;
constexpr uint64_t kSnapshotHeaderBytes = 24;

inline void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
inline void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
inline uint32_t GetU32(std::string_view s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
inline uint64_t GetU64(std::string_view s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

inline std::string Path(const std::string& dir, const std::string& name) { return dir + "/" + name; }

inline absl::Status Damaged(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}
inline absl::Status DamagedAt(const std::string& path, uint64_t offset, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": offset ", offset, ": ", what));
}

// A record frame around `payload`: magic, length, both checksums.
std::string FramePayload(std::string_view payload);
std::string Frame(const state::LogRecord& p);

// A record frame that checks out at `at`: magic, length within bounds, both checksums.
struct FrameView {
  std::string_view payload;
  uint64_t next;
};
std::optional<FrameView> FrameAt(std::string_view data, uint64_t at);

// A record as the log holds it, and back.
state::LogRecord ToProto(uint64_t lsn, const Record& r);
absl::StatusOr<Record> FromProto(const state::LogRecord& p);

// Loads a snapshot file into a fresh state machine, as of server time `now`.
absl::StatusOr<StateMachine> LoadSnapshot(const std::string& path, std::string_view data,
                                          uint64_t expected_lsn, MonoTime now);

}  // namespace fencelock::server::format

#endif  // FENCELOCK_LOCK_SERVER_STORAGE_FORMAT_H_
