// lockd's state directory: its files, their encodings, init and recovery.
//
//   FORMAT                     "fencelock-lockd-state\nformat 1\n"; anything else is refused
//   SEQUENCES                  token and session-id high-water marks reserved ahead of use
//   LOCK                       locked by the server that serves the directory (not state)
//   COMMITTED                  an lsn every record up to which was committed: the log may not
//                              end below it (written about once a second and at a clean stop)
//   snapshot-<20-digit lsn>    the whole state after record <lsn>
//   wal-<20-digit number>      a preallocated, zero-filled log segment of checksummed records
//
// The layout and the rules behind it are in docs/durability.md. Recovery reads and never
// writes: it either returns the last valid state (dropping only a torn tail of the final
// segment) or an error that names the file and the offset or reason.
#ifndef FENCELOCK_LOCK_SERVER_STORAGE_H_
#define FENCELOCK_LOCK_SERVER_STORAGE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "lock-server/env.h"
#include "lock-server/state_machine.h"

namespace fencelock::server {

inline constexpr char kFormatFile[] = "FORMAT";
inline constexpr char kFormatContents[] = "fencelock-lockd-state\nformat 1\n";
inline constexpr char kSequencesFile[] = "SEQUENCES";
// Held (flock) by the one server of a state directory for its whole life; names that server.
inline constexpr char kLockFile[] = "LOCK";
inline constexpr char kCommittedFile[] = "COMMITTED";
// Written by `lockd destroy` before it removes FORMAT: the directory is a state being removed,
// and the next destroy finishes it.
inline constexpr char kDestroyMarkerFile[] = "DESTROYING";
inline constexpr uint64_t kSegmentHeaderBytes = 32;
inline constexpr uint64_t kRecordHeaderBytes = 16;
inline constexpr uint64_t kDefaultSegmentBytes = uint64_t{64} << 20;
// The accepted range of WAL segment sizes: a segment must hold its header and some records,
// and is preallocated with real zeros, so it may not be absurdly large either.
inline constexpr uint64_t kMinSegmentBytes = 4096;
inline constexpr uint64_t kMaxSegmentBytes = uint64_t{16} << 30;
// OK if `segment_bytes` is in [kMinSegmentBytes, kMaxSegmentBytes]; otherwise kInvalidArgument
// naming the flag.
absl::Status CheckSegmentBytes(uint64_t segment_bytes);

std::string SnapshotName(uint64_t lsn);
std::string SegmentName(uint64_t number);
// Whether lockd writes files named `name` in a state directory, exactly: its fixed files, its
// numbered segments and snapshots, and the temporary name of any of them (".tmp": an atomic
// write that a crash interrupted). Anything else, however it is named, is someone else's.
bool IsLockdFileName(std::string_view name);

struct Sequences {
  FenceToken token_hwm;   // no token above this has been handed out
  SessionId session_hwm;  // no session id above this has been handed out
};
std::string EncodeSequences(const Sequences& s);
// The COMMITTED file: every record up to `lsn` was committed (synced) when it was written.
std::string EncodeCommittedMark(uint64_t lsn);

// One WAL record frame: header (magic, length, checksum of the length, checksum of the
// payload) and the serialized LogRecord. `lsn` 0 with `seal_next_segment` set encodes the
// marker that closes a segment.
std::string EncodeRecordFrame(uint64_t lsn, const Record& r);
std::string EncodeSealFrame(uint64_t next_segment);
std::string EncodeSegmentHeader(uint64_t number, uint64_t size);
// The whole state after `last_lsn`, as a snapshot file, encoded at once.
std::string EncodeSnapshot(const StateMachine& state, uint64_t last_lsn);

// The same file, encoded a slice at a time while records go on being applied to `state` in
// between (StateMachine::Freeze): the snapshot is of the state as it was when the encoder was
// made, after record `last_lsn`. `state` must outlive the encoder; destroying an unfinished
// encoder ends its reading. One encoder per state at a time. Not thread-safe: the state's
// thread, except Finish(), which touches only the encoder.
class SnapshotEncoder {
 public:
  // `expected_bytes`: about how large the file will be. Its buffer is reserved at that size at
  // once (address space only, until written), so that the thread encoding it does not copy
  // all it has encoded so far each time the buffer doubles (13 ms at 21 MB, 1,000,000 locks).
  SnapshotEncoder(const StateMachine& state, uint64_t last_lsn, uint64_t expected_bytes = 0);
  SnapshotEncoder(const SnapshotEncoder&) = delete;
  SnapshotEncoder& operator=(const SnapshotEncoder&) = delete;
  ~SnapshotEncoder();

  // Encodes up to `max` more sessions and locks; true once all are encoded.
  bool EncodeSome(size_t max);
  // The file's bytes so far (the payload grows; the header is written by Finish).
  size_t size() const { return file_.size(); }
  // The snapshot file, once EncodeSome() returned true: the header (with the payload's
  // checksum) in front of the payload. The checksum is the costly part, for any thread.
  std::string Finish() &&;

 private:
  const StateMachine* state_;
  std::string file_;
  bool done_ = false;
};
// For fuzzing and tests: `payload` (any bytes, meant as a serialized LogRecord or Snapshot)
// behind a valid record-frame or snapshot header, checksums included, so that what follows
// the checksums is reached.
std::string EncodeRawRecordFrame(std::string_view payload);
std::string EncodeRawSnapshot(std::string_view payload);

// The codecs other backends share (the etcd commit log keeps the same bytes in keys). Errors
// are kDataLoss naming `where` (and the offset), or kFailedPrecondition for an unsupported
// version.
absl::StatusOr<Sequences> DecodeSequences(const std::string& where, std::string_view data);
// The state a snapshot (EncodeSnapshot) holds, restored as of server time `now`; it must be
// the snapshot after record `lsn`.
absl::StatusOr<StateMachine> DecodeSnapshot(const std::string& where, std::string_view data,
                                            uint64_t lsn, MonoTime now);
// Applies the record frames that make up all of `data` (no padding, no torn tail) to `state`:
// records at or below `snapshot_lsn` are skipped, and each later one must follow `*last_lsn`
// without a gap. Advances `*last_lsn` and `*replayed`.
absl::Status ReplayRecordFrames(const std::string& where, std::string_view data,
                                uint64_t snapshot_lsn, uint64_t* last_lsn, StateMachine* state,
                                MonoTime now, uint64_t* replayed);

// Creates `dir` (which must not exist, or be empty) as a fresh state directory: FORMAT,
// SEQUENCES, snapshot-0 and an empty first segment, all durable. kInvalidArgument for a segment
// size outside [kMinSegmentBytes, kMaxSegmentBytes].
absl::Status InitDataDir(Env* env, const std::string& dir,
                         uint64_t segment_bytes = kDefaultSegmentBytes);

struct RecoveryReport {
  uint64_t snapshot_lsn = 0;
  uint64_t last_lsn = 0;           // the newest record restored (or the snapshot's)
  uint64_t records_replayed = 0;   // records applied on top of the snapshot
  uint64_t segments = 0;
  Sequences reserved;              // as read from SEQUENCES
  uint64_t committed_mark = 0;     // as read from COMMITTED (0: none)
  FenceToken logged_token;         // the highest token in the snapshot and replayed records
  FenceToken token_floor;          // restart issues tokens above this
  SessionId session_floor;         // and session ids above this
  // A damaged tail of the final segment that was dropped (never acknowledged).
  uint64_t torn_tail_bytes = 0;
  uint64_t torn_tail_offset = 0;
  // Where appending continues: the final segment, its size, and the end of its last record.
  uint64_t last_segment = 0;
  uint64_t last_segment_size = 0;
  uint64_t append_offset = 0;
  // Highest record lsn in each segment (0 for one without records).
  std::map<uint64_t, uint64_t> segment_last_lsn;
  std::vector<std::string> snapshot_files;  // every snapshot file present, oldest first
  uint64_t snapshot_bytes = 0;               // size of the snapshot restored from
  // Leftovers of writes a crash interrupted ("*.tmp"): never part of the state.
  std::vector<std::string> stale_temp_files;
  std::vector<std::string> warnings;
};

struct Recovered {
  StateMachine state;
  RecoveryReport report;
};

// Restores the state in `dir` as of server time `now`: every restored session and lock gets
// its full TTL from `now`. Errors name the file and the offset or reason: kNotFound (no such
// directory, or not initialized), kFailedPrecondition (unsupported format), kDataLoss (damaged
// or missing state). Tests that need the state at an earlier record use RecoverThrough()
// (lock-server/storage/testing/recovery.h).
absl::StatusOr<Recovered> Recover(Env* env, const std::string& dir, MonoTime now);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_STORAGE_H_
