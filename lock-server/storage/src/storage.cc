#include "lock-server/storage.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "logging/logging.h"
#include "absl/strings/str_cat.h"
#include "crc32c.h"
#include "storage_format.h"
#include "storage_internal.h"
#include "fencelock/state.pb.h"

namespace fencelock::server {

using namespace format;  // NOLINT: the layout this file is the other half of

namespace {

// Parses "<prefix><20 digits>" into the number.
std::optional<uint64_t> ParseNumbered(const std::string& name, std::string_view prefix) {
  if (name.size() != prefix.size() + 20 || name.compare(0, prefix.size(), prefix) != 0) {
    return std::nullopt;
  }
  uint64_t v = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(name[i] - '0');
    if (v > (UINT64_MAX - digit) / 10) return std::nullopt;  // 20 digits can exceed 64 bits
    v = v * 10 + digit;
  }
  return v;
}

bool AllZero(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == 0; });
}

// Whether damage at `at` in a segment's `data`, which a valid record at `next` follows, has
// the shape a power cut leaves of an append whose sectors reached the disk out of order (a disk
// orders nothing it was not told to sync, and a batch is acknowledged only after its sync): the
// sector where the append began never got its part (zeros from `at` to that sector's end), or
// a whole sector inside it never did. A flipped bit leaves neither: a record begins with its
// magic, and records hold no sector of zeros.
bool AppendReachedTheDiskOutOfOrder(std::string_view data, size_t at, size_t next) {
  constexpr size_t kSector = 512;
  const size_t boundary = (at / kSector + 1) * kSector;
  if (boundary <= next && AllZero(data.substr(at, boundary - at))) return true;
  for (size_t sector = boundary; sector + kSector <= next; sector += kSector) {
    if (AllZero(data.substr(sector, kSector))) return true;
  }
  return false;
}

absl::StatusOr<uint64_t> DecodeCommittedMark(const std::string& path, std::string_view data) {
  if (data.size() != kCommittedBytes) {
    return Damaged(path, absl::StrCat("is ", data.size(), " bytes, expected ", kCommittedBytes));
  }
  if (std::memcmp(data.data(), kCommittedMagic, 4) != 0) return Damaged(path, "bad magic");
  if (GetU32(data, 16) != Crc32c(data.substr(0, 16))) return Damaged(path, "checksum mismatch");
  if (GetU32(data, 4) != kFileVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": unsupported version ", GetU32(data, 4)));
  }
  return GetU64(data, 8);
}

}  // namespace

absl::StatusOr<Sequences> DecodeSequences(const std::string& path, std::string_view data) {
  if (data.size() != kSequencesBytes) {
    return Damaged(path, absl::StrCat("is ", data.size(), " bytes, expected ", kSequencesBytes));
  }
  if (std::memcmp(data.data(), kSequencesMagic, 4) != 0) return Damaged(path, "bad magic");
  if (GetU32(data, 24) != Crc32c(data.substr(0, 24))) return Damaged(path, "checksum mismatch");
  if (GetU32(data, 4) != kFileVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": unsupported version ", GetU32(data, 4)));
  }
  return Sequences{FenceToken(GetU64(data, 8)), SessionId(GetU64(data, 16))};
}

std::string SnapshotName(uint64_t lsn) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "snapshot-%020lu", static_cast<unsigned long>(lsn));
  return buf;
}

bool IsLockdFileName(std::string_view name) {
  if (name.ends_with(".tmp")) name.remove_suffix(4);
  const std::string n(name);
  return n == kFormatFile || n == kSequencesFile || n == kLockFile || n == kCommittedFile ||
         n == kDestroyMarkerFile || ParseNumbered(n, "wal-") || ParseNumbered(n, "snapshot-");
}

std::string SegmentName(uint64_t number) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "wal-%020lu", static_cast<unsigned long>(number));
  return buf;
}

std::string EncodeSequences(const Sequences& s) {
  std::string out(kSequencesMagic, 4);
  PutU32(&out, kFileVersion);
  PutU64(&out, s.token_hwm.value());
  PutU64(&out, s.session_hwm.value());
  PutU32(&out, Crc32c(out));
  return out;
}

std::string EncodeCommittedMark(uint64_t lsn) {
  std::string out(kCommittedMagic, 4);
  PutU32(&out, kFileVersion);
  PutU64(&out, lsn);
  PutU32(&out, Crc32c(out));
  return out;
}

std::string EncodeSegmentHeader(uint64_t number, uint64_t size) {
  std::string out(kSegmentMagic, 8);
  PutU32(&out, kFileVersion);
  PutU64(&out, number);
  PutU64(&out, size);
  PutU32(&out, Crc32c(out));
  return out;
}

absl::Status CheckSegmentBytes(uint64_t segment_bytes) {
  if (segment_bytes < kMinSegmentBytes || segment_bytes > kMaxSegmentBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a WAL segment of ", segment_bytes, " bytes is outside [", kMinSegmentBytes, ", ",
        kMaxSegmentBytes, "] (--wal-segment-bytes)"));
  }
  return absl::OkStatus();
}

absl::Status InitDataDir(Env* env, const std::string& dir, uint64_t segment_bytes) {
  // Refuse here what serve could not serve.
  if (absl::Status s = CheckSegmentBytes(segment_bytes); !s.ok()) return s;
  auto existing = env->ListDir(dir);
  if (existing.ok()) {
    if (std::find(existing->begin(), existing->end(), kFormatFile) != existing->end()) {
      return absl::AlreadyExistsError(absl::StrCat(dir, " is already a lockd state directory"));
    }
    if (!existing->empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " is not empty; refusing to initialize over its files"));
    }
  } else if (absl::IsNotFound(existing.status())) {
    if (absl::Status s = env->CreateDir(dir); !s.ok()) return s;
  } else {
    return existing.status();
  }
  // FORMAT last: a directory without it is "not initialized", so a crash part-way through
  // init leaves something serve refuses and init can be re-run on after clearing it.
  if (absl::Status s = env->WriteFileAtomically(Path(dir, kSequencesFile),
                                                EncodeSequences(Sequences{}));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = env->WriteFileAtomically(Path(dir, SnapshotName(0)),
                                                EncodeSnapshot(StateMachine(), 0));
      !s.ok()) {
    return s;
  }
  auto segment = env->CreateSegment(Path(dir, SegmentName(1)), EncodeSegmentHeader(1, segment_bytes),
                                    segment_bytes);
  if (!segment.ok()) return segment.status();
  return env->WriteFileAtomically(Path(dir, kFormatFile), kFormatContents);
}

namespace {

// FORMAT: present, and the format this lockd reads. `dir_empty`: the directory holds nothing.
absl::Status CheckFormatFile(Env* env, const std::string& dir, bool dir_empty) {
  const std::string format_path = Path(dir, kFormatFile);
  auto format = env->ReadFile(format_path);
  if (!format.ok()) {
    if (absl::IsNotFound(format.status())) {
      return absl::NotFoundError(absl::StrCat(
          format_path, " is missing: ", dir, dir_empty ? " is empty, not" : " is not",
          " an initialized lockd state directory; run: lockd init --data-dir ", dir));
    }
    return format.status();
  }
  if (*format != kFormatContents) {
    const std::string prefix = "fencelock-lockd-state\nformat ";
    if (format->rfind(prefix, 0) == 0 && format->size() > prefix.size() &&
        format->back() == '\n') {
      return absl::FailedPreconditionError(absl::StrCat(
          format_path, ": unsupported format version \"",
          format->substr(prefix.size(), format->size() - prefix.size() - 1),
          "\" (this lockd reads format 1)"));
    }
    return Damaged(format_path, "not a fencelock format file");
  }
  return absl::OkStatus();
}

// A WAL segment's header: its magic, checksum and version, its number, and its allocated size
// (segments are preallocated and synced before use: a crash never changes their size).
absl::Status CheckSegmentHeader(std::string_view data, const std::string& path, uint64_t number) {
  if (data.size() < kSegmentHeaderBytes) {
    return Damaged(path, absl::StrCat("is ", data.size(), " bytes, shorter than its header"));
  }
  if (std::memcmp(data.data(), kSegmentMagic, 8) != 0) return DamagedAt(path, 0, "bad magic");
  if (GetU32(data, 28) != Crc32c(data.substr(0, 28))) {
    return DamagedAt(path, 0, "header checksum mismatch");
  }
  if (GetU32(data, 8) != kFileVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": unsupported segment version ", GetU32(data, 8)));
  }
  if (GetU64(data, 12) != number) {
    return DamagedAt(path, 12, absl::StrCat("header says segment ", GetU64(data, 12)));
  }
  if (const uint64_t size = GetU64(data, 20); size != data.size()) {
    return Damaged(path, absl::StrCat("is ", data.size(), " bytes but was allocated ", size,
                                      ": truncated or extended"));
  }
  return absl::OkStatus();
}

// Whether `data` from `at` is a seal of segment `number` that reached the disk in part: every
// byte is the seal's or zero, past the seal only zeros, and some byte is not zero.
bool IncompleteSeal(std::string_view data, uint64_t at, uint64_t number) {
  if (at > data.size()) return false;
  const std::string seal = EncodeSealFrame(number + 1);
  const std::string_view tail = data.substr(at);
  if (AllZero(tail)) return false;
  for (size_t i = 0; i < tail.size(); ++i) {
    const char expected = i < seal.size() ? seal[i] : '\0';
    if (tail[i] != expected && tail[i] != '\0') return false;
  }
  return true;
}

// A segment's bytes after its last good record (or seal), from `at`: unused zeros; or, in the
// final segment while it is open (`open_final`: not sealed), an append that never completed,
// none of it acknowledged, which is dropped with a warning in `report`.
absl::Status CheckSegmentTail(std::string_view data, uint64_t at, bool open_final,
                              const std::string& path, RecoveryReport& report) {
  if (AllZero(data.substr(at))) return absl::OkStatus();
  // Damage followed by a good record is damage in the middle of the log, unless it is the
  // final segment's unacknowledged append whose sectors reached the disk out of order.
  size_t out_of_order = 0;  // the valid record after such an append's hole
  for (size_t p = at + 1; p + kRecordHeaderBytes <= data.size(); ++p) {
    const size_t hit = data.find(std::string_view(kRecordMagic, 4), p);
    if (hit == std::string_view::npos) break;
    if (FrameAt(data, hit)) {
      if (open_final && AppendReachedTheDiskOutOfOrder(data, at, hit)) {
        out_of_order = hit;
        break;
      }
      return DamagedAt(path, at, absl::StrCat("damaged record; a valid record follows at ",
                                              "offset ", hit));
    }
    p = hit;
  }
  if (!open_final) {
    return DamagedAt(path, at, "damaged data after the last record of a closed segment");
  }
  const size_t last_nonzero = data.find_last_not_of('\0');
  report.torn_tail_offset = at;
  report.torn_tail_bytes = last_nonzero + 1 - at;
  // What lockd knows: these bytes do not form a valid record, and nothing valid follows,
  // or only after a hole that a power cut leaves. An append a crash interrupted looks like
  // this (none of it was acknowledged: a batch is acknowledged after its sync, which puts
  // every byte before it on the disk); so does damage to records that were committed
  // after the last COMMITTED mark, which no single disk can tell apart. Records the mark
  // covers are never dropped: the check below refuses.
  report.warnings.push_back(absl::StrCat(
      path, ": offset ", at, ": dropped ", report.torn_tail_bytes,
      " bytes after the last valid record (lsn ", report.last_lsn, "): an append that did not ",
      out_of_order == 0 ? std::string("complete")
                        : absl::StrCat("reach the disk in order (a hole, then a valid record "
                                       "at offset ", out_of_order, ")"),
      ", or damage to records newer than the COMMITTED mark (lsn ", report.committed_mark,
      ")"));
  return absl::OkStatus();
}

// The directory's snapshots and WAL segments by number, ascending; its stale temporary files,
// and a warning for anything else it holds, in `report`.
void ListStateFiles(const std::vector<std::string>& names, const std::string& dir,
                    std::vector<uint64_t>* snapshots, std::vector<uint64_t>* segments,
                    RecoveryReport& report) {
  for (const std::string& name : names) {
    if (auto lsn = ParseNumbered(name, "snapshot-")) {
      snapshots->push_back(*lsn);
    } else if (auto n = ParseNumbered(name, "wal-")) {
      segments->push_back(*n);
    } else if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      report.stale_temp_files.push_back(name);
    } else if (!IsLockdFileName(name)) {
      report.warnings.push_back(absl::StrCat("ignoring unexpected file ", Path(dir, name)));
    }
  }
  std::sort(snapshots->begin(), snapshots->end());
  std::sort(segments->begin(), segments->end());
}

}  // namespace

absl::StatusOr<Recovered> Recover(Env* env, const std::string& dir, MonoTime now) {
  return internal::RecoverThrough(env, dir, now, UINT64_MAX);
}

absl::StatusOr<Recovered> internal::RecoverThrough(Env* env, const std::string& dir, MonoTime now,
                                                   uint64_t stop_after_lsn) {
  auto names = env->ListDir(dir);
  if (!names.ok()) {
    if (absl::IsNotFound(names.status())) {
      return absl::NotFoundError(absl::StrCat(
          "state directory ", dir, " does not exist; create it with: lockd init --data-dir ", dir));
    }
    return names.status();
  }
  if (absl::Status s = CheckFormatFile(env, dir, names->empty()); !s.ok()) return s;

  Recovered out;
  RecoveryReport& report = out.report;

  // SEQUENCES
  const std::string seq_path = Path(dir, kSequencesFile);
  auto seq_data = env->ReadFile(seq_path);
  if (!seq_data.ok()) return Damaged(seq_path, std::string(seq_data.status().message()));
  auto sequences = DecodeSequences(seq_path, *seq_data);
  if (!sequences.ok()) return sequences.status();
  report.reserved = *sequences;

  // COMMITTED, when there is one: the log must reach at least its lsn.
  const std::string committed_path = Path(dir, kCommittedFile);
  if (auto mark_data = env->ReadFile(committed_path); mark_data.ok()) {
    auto mark = DecodeCommittedMark(committed_path, *mark_data);
    if (!mark.ok()) return mark.status();
    report.committed_mark = *mark;
  } else if (!absl::IsNotFound(mark_data.status())) {
    return Damaged(committed_path, std::string(mark_data.status().message()));
  }

  std::vector<uint64_t> snapshots, segments;
  ListStateFiles(*names, dir, &snapshots, &segments, report);
  for (uint64_t lsn : snapshots) report.snapshot_files.push_back(SnapshotName(lsn));
  if (snapshots.empty()) return Damaged(dir, "no snapshot file: the state is incomplete");
  if (segments.empty()) return Damaged(dir, "no WAL segment: the state is incomplete");

  // Snapshot: the newest one. Older ones are only deleted after a newer one is durable, so a
  // damaged newest snapshot is damage, not something to fall back from silently.
  report.snapshot_lsn = snapshots.back();
  const std::string snap_path = Path(dir, SnapshotName(report.snapshot_lsn));
  auto snap_data = env->ReadFile(snap_path);
  if (!snap_data.ok()) return Damaged(snap_path, std::string(snap_data.status().message()));
  report.snapshot_bytes = snap_data->size();
  auto state = LoadSnapshot(snap_path, *snap_data, report.snapshot_lsn, now);
  if (!state.ok()) return state.status();
  out.state = std::move(*state);
  report.last_lsn = report.snapshot_lsn;

  // Segments, in order, each contiguous with the previous.
  uint64_t prev_lsn = 0;        // last record lsn seen in the log (0: none yet)
  bool expect_next_segment = false;
  for (size_t i = 0; i < segments.size(); ++i) {
    const uint64_t number = segments[i];
    const bool final = i + 1 == segments.size();
    const std::string path = Path(dir, SegmentName(number));
    if (i > 0 && number != segments[i - 1] + 1) {
      return Damaged(path, absl::StrCat("segment ", segments[i - 1] + 1, " is missing"));
    }
    auto data_or = env->ReadFile(path);
    if (!data_or.ok()) return Damaged(path, std::string(data_or.status().message()));
    std::string_view data = *data_or;
    if (absl::Status s = CheckSegmentHeader(data, path, number); !s.ok()) return s;
    const uint64_t size = GetU64(data, 20);
    expect_next_segment = false;
    uint64_t at = kSegmentHeaderBytes;
    uint64_t segment_last = 0;
    while (auto frame = FrameAt(data, at)) {
      state::LogRecord p;
      if (!p.ParseFromArray(frame->payload.data(), static_cast<int>(frame->payload.size()))) {
        return DamagedAt(path, at, "record checksum matches but it does not decode");
      }
      if (p.kind_case() == state::LogRecord::kSealed) {
        if (p.sealed().next_segment() != number + 1) {
          return DamagedAt(path, at, "seal names the wrong next segment");
        }
        expect_next_segment = true;
        at = frame->next;
        break;  // nothing may follow a seal
      }
      // Records the snapshot already holds only need to increase; every record after it must
      // follow its predecessor (or the snapshot) without a gap.
      if (p.lsn() <= prev_lsn) {
        return DamagedAt(path, at, absl::StrCat("record lsn ", p.lsn(), " follows ", prev_lsn));
      }
      const uint64_t expected = std::max(prev_lsn, report.snapshot_lsn) + 1;
      if (p.lsn() > report.snapshot_lsn && p.lsn() != expected) {
        return DamagedAt(path, at, absl::StrCat("records ", expected, " to ", p.lsn() - 1,
                                                " are missing"));
      }
      prev_lsn = p.lsn();
      segment_last = p.lsn();
      if (p.lsn() > report.snapshot_lsn && p.lsn() <= stop_after_lsn) {
        auto r = FromProto(p);
        if (!r.ok()) return DamagedAt(path, at, std::string(r.status().message()));
        if (absl::Status s = out.state.Check(*r); !s.ok()) {
          return DamagedAt(path, at, absl::StrCat("record lsn ", p.lsn(),
                                                  " does not apply: ", s.message()));
        }
        out.state.ApplyChecked(*r, now);
        ++report.records_replayed;
        report.last_lsn = p.lsn();
      }
      at = frame->next;
    }
    report.segment_last_lsn[number] = segment_last;
    // A segment that is not the last and has no seal: a move to the next one that did not
    // complete (the next is made before this one is sealed). Its seal may have reached the disk
    // in part; nothing was appended after it, for a failure stops the writer.
    if (!final && !expect_next_segment && IncompleteSeal(data, at, number)) {
      report.warnings.push_back(absl::StrCat(
          path, ": offset ", at, ": a seal that did not complete (a move to segment ",
          number + 1, " interrupted); the log goes on in segment ", number + 1));
      continue;
    }
    // `at` is the end of the last good record (or seal). What follows must be unused zeros,
    // except that the final segment may end in a torn append that was never acknowledged.
    if (absl::Status s = CheckSegmentTail(data, at, final && !expect_next_segment, path, report);
        !s.ok()) {
      return s;
    }
    if (final) {
      if (expect_next_segment) {
        return Damaged(path, absl::StrCat("is sealed but segment ", number + 1, " is missing"));
      }
      if (report.last_lsn < report.committed_mark && stop_after_lsn == UINT64_MAX) {
        // Records that were committed, and maybe acknowledged, are gone: serving would hand
        // out locks their holders still believe they hold. Fail closed.
        return Damaged(path, absl::StrCat(
            "the log ends at lsn ", report.last_lsn, " but ", committed_path,
            " says every record up to lsn ", report.committed_mark,
            " was committed: the newest committed records were lost"));
      }
      report.last_segment = number;
      report.last_segment_size = size;
      report.append_offset = at;
    }
  }
  report.segments = segments.size();
  report.logged_token = out.state.last_token();
  report.token_floor = std::max(out.state.last_token(), report.reserved.token_hwm);
  report.session_floor = std::max(out.state.last_session_id(), report.reserved.session_hwm);
  if (absl::Status s = out.state.RaiseFloors(report.token_floor, report.session_floor); !s.ok()) {
    return Damaged(dir, std::string(s.message()));
  }
  return out;
}

}  // namespace fencelock::server
