#include "lock-server/storage.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "logging/logging.h"
#include "absl/strings/str_cat.h"
#include "crc32c.h"
#include "storage_internal.h"
#include "fencelock/state.pb.h"

namespace fencelock::server {
namespace {

constexpr char kSegmentMagic[8] = {'F', 'L', 'W', 'A', 'L', 'S', 'E', 'G'};
constexpr char kSequencesMagic[4] = {'F', 'L', 'S', 'Q'};
constexpr char kSnapshotMagic[4] = {'F', 'L', 'S', 'N'};
constexpr char kCommittedMagic[4] = {'F', 'L', 'C', 'M'};
constexpr uint64_t kCommittedBytes = 20;
constexpr char kRecordMagic[4] = {'F', 'L', 'R', '1'};
constexpr uint32_t kFileVersion = 1;
// Snapshots: 2 adds shared holders and lock delays (ADR 0006). A version-1 snapshot reads as
// exclusive holders without delays; a lockd that knows only 1 refuses a 2 by name.
constexpr uint32_t kSnapshotVersion = 2;
constexpr uint64_t kSequencesBytes = 28;
constexpr uint64_t kSnapshotHeaderBytes = 24;

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
uint32_t GetU32(std::string_view s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
uint64_t GetU64(std::string_view s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

std::string Path(const std::string& dir, const std::string& name) { return dir + "/" + name; }

absl::Status Damaged(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}
absl::Status DamagedAt(const std::string& path, uint64_t offset, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": offset ", offset, ": ", what));
}

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

int64_t Nanos(absl::Duration d) { return absl::ToInt64Nanoseconds(d); }

state::LockMode ModeToProto(LockMode mode) {
  return mode == LockMode::kShared ? state::SHARED : state::EXCLUSIVE;
}
absl::StatusOr<LockMode> ModeFromProto(int mode) {
  switch (mode) {
    case state::EXCLUSIVE:
      return LockMode::kExclusive;
    case state::SHARED:
      return LockMode::kShared;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown lock mode ", mode));
  }
}

void ProfileToProto(const PoolProfileSpec& spec, state::PoolProfile* out) {
  out->set_id(spec.id);
  out->set_cost(spec.cost);
  out->set_reserved(spec.reserved);
  out->set_lendable(spec.lendable);
  out->set_borrow(spec.borrow);
}

PoolProfileSpec ProfileFromProto(const state::PoolProfile& p) {
  return PoolProfileSpec{p.id(), p.cost(), p.reserved(), p.lendable(), p.borrow()};
}

state::LogRecord ToProto(uint64_t lsn, const Record& r) {
  state::LogRecord p;
  p.set_lsn(lsn);
  std::visit(
      [&](const auto& rec) {
        using T = std::decay_t<decltype(rec)>;
        if constexpr (std::is_same_v<T, record::SessionOpened>) {
          p.mutable_session_opened()->set_session_id(rec.session);
          p.mutable_session_opened()->set_ttl_ns(Nanos(rec.ttl));
          p.mutable_session_opened()->set_secret_digest(rec.secret_digest);
          p.mutable_session_opened()->set_owner(rec.owner);
        } else if constexpr (std::is_same_v<T, record::SessionEnded>) {
          p.mutable_session_ended()->set_session_id(rec.session);
          p.mutable_session_ended()->set_reason(rec.reason == EndReason::kExpired ? 1 : 0);
        } else if constexpr (std::is_same_v<T, record::LockGranted>) {
          auto* g = p.mutable_lock_granted();
          g->set_lock(rec.lock);
          g->set_session_id(rec.session);
          g->set_token(rec.token);
          g->set_ttl_ns(Nanos(rec.ttl));
          g->set_mode(ModeToProto(rec.mode));
          g->set_lock_delay_ns(Nanos(rec.lock_delay));
        } else if constexpr (std::is_same_v<T, record::LockReleased>) {
          auto* l = p.mutable_lock_released();
          l->set_lock(rec.lock);
          l->set_token(rec.token);
          l->set_reason(static_cast<uint32_t>(rec.reason));
        } else if constexpr (std::is_same_v<T, record::PoolPolicyPublished>) {
          auto* o = p.mutable_pool_policy_published();
          o->set_pool(rec.pool);
          o->set_generation(rec.generation);
          o->set_budget(rec.budget);
          for (const PoolProfileSpec& spec : rec.profiles) ProfileToProto(spec, o->add_profiles());
          o->set_decision(rec.decision);
        } else if constexpr (std::is_same_v<T, record::PoolProfileClaimed>) {
          auto* o = p.mutable_pool_profile_claimed();
          o->set_pool(rec.pool);
          o->set_profile(rec.profile);
          o->set_epoch(rec.epoch);
          o->set_key_digest(rec.key_digest);
          o->set_generation(rec.generation);
          o->set_claimed_by(rec.claimed_by);
        } else if constexpr (std::is_same_v<T, record::PoolPolicyAcked>) {
          auto* o = p.mutable_pool_policy_acked();
          o->set_pool(rec.pool);
          o->set_profile(rec.profile);
          o->set_epoch(rec.epoch);
          o->set_generation(rec.generation);
        } else if constexpr (std::is_same_v<T, record::PoolLeaseGranted>) {
          auto* o = p.mutable_pool_lease_granted();
          o->set_pool(rec.pool);
          o->set_profile(rec.profile);
          o->set_slot(rec.slot);
          o->set_token(rec.token);
          o->set_units(rec.units);
          o->set_epoch(rec.epoch);
          o->set_ttl_ns(Nanos(rec.ttl));
          o->set_decision(rec.decision);
        } else if constexpr (std::is_same_v<T, record::PoolLeaseActivated>) {
          auto* o = p.mutable_pool_lease_activated();
          o->set_pool(rec.pool);
          o->set_profile(rec.profile);
          o->set_slot(rec.slot);
          o->set_token(rec.token);
          o->set_decision(rec.decision);
        } else if constexpr (std::is_same_v<T, record::PoolLeaseReleased>) {
          auto* o = p.mutable_pool_lease_released();
          o->set_pool(rec.pool);
          o->set_profile(rec.profile);
          o->set_slot(rec.slot);
          o->set_token(rec.token);
          o->set_reason(static_cast<uint32_t>(rec.reason));
          o->set_decision(rec.decision);
        } else if constexpr (std::is_same_v<T, record::PoolLeaseRecovered>) {
          auto* o = p.mutable_pool_lease_recovered();
          o->set_pool(rec.pool);
          o->set_profile(rec.profile);
          o->set_slot(rec.slot);
          o->set_token(rec.token);
          o->set_evidence(rec.evidence);
          o->set_decision(rec.decision);
        } else if constexpr (std::is_same_v<T, record::PoolDrainSet>) {
          p.mutable_pool_drain_set()->set_pool(rec.pool);
          p.mutable_pool_drain_set()->set_draining(rec.draining);
        } else if constexpr (std::is_same_v<T, record::PoolDeleted>) {
          p.mutable_pool_deleted()->set_pool(rec.pool);
        } else {
          // Renewals only move expiry times, which a restart resets to a full TTL anyway.
          logging::Lockd().Error("renewal records are not logged");
          std::abort();
        }
      },
      r);
  return p;
}

// A session's record or snapshot entry. One written before secrets were kept as digests holds
// the secret itself: its digest is computed here, and the record says so.
template <typename SessionProto>
record::SessionOpened SessionFromProto(const SessionProto& p) {
  record::SessionOpened r{p.session_id(), absl::Nanoseconds(p.ttl_ns()), p.secret_digest(),
                          p.owner()};
  if (r.secret_digest.empty() && !p.secret().empty()) {
    r.secret_digest = SessionSecretDigest(p.session_id(), p.secret());
    r.read_in_clear = true;
  }
  return r;
}

absl::StatusOr<Record> FromProto(const state::LogRecord& p) {
  switch (p.kind_case()) {
    case state::LogRecord::kSessionOpened:
      return Record(SessionFromProto(p.session_opened()));
    case state::LogRecord::kSessionEnded:
      if (p.session_ended().reason() > 1) return absl::InvalidArgumentError("bad end reason");
      return Record(record::SessionEnded{
          p.session_ended().session_id(),
          p.session_ended().reason() == 1 ? EndReason::kExpired : EndReason::kClosed});
    case state::LogRecord::kLockGranted: {
      const auto& g = p.lock_granted();
      auto mode = ModeFromProto(g.mode());
      if (!mode.ok()) return mode.status();
      return Record(record::LockGranted{g.lock(), g.session_id(), g.token(),
                                        absl::Nanoseconds(g.ttl_ns()), *mode,
                                        absl::Nanoseconds(g.lock_delay_ns())});
    }
    case state::LogRecord::kLockReleased: {
      const auto& l = p.lock_released();
      if (l.reason() > 2) return absl::InvalidArgumentError("bad release reason");
      return Record(
          record::LockReleased{l.lock(), l.token(), static_cast<ReleaseReason>(l.reason())});
    }
    case state::LogRecord::kPoolPolicyPublished: {
      const auto& o = p.pool_policy_published();
      record::PoolPolicyPublished r{o.pool(), o.generation(), o.budget(), {}, o.decision()};
      for (const auto& spec : o.profiles()) r.profiles.push_back(ProfileFromProto(spec));
      return Record(std::move(r));
    }
    case state::LogRecord::kPoolProfileClaimed: {
      const auto& o = p.pool_profile_claimed();
      record::PoolProfileClaimed r{o.pool(), o.profile(), o.epoch(), o.key_digest(),
                                   o.generation(), o.claimed_by()};
      if (r.key_digest.empty() && !o.key().empty()) {  // an older lockd's: the key itself
        r.key_digest = PoolOwnerKeyDigest(o.pool(), o.profile(), o.epoch(), o.key());
        r.read_in_clear = true;
      }
      return Record(std::move(r));
    }
    case state::LogRecord::kPoolPolicyAcked: {
      const auto& o = p.pool_policy_acked();
      return Record(record::PoolPolicyAcked{o.pool(), o.profile(), o.epoch(), o.generation()});
    }
    case state::LogRecord::kPoolLeaseGranted: {
      const auto& o = p.pool_lease_granted();
      return Record(record::PoolLeaseGranted{o.pool(), o.profile(), o.slot(), o.token(),
                                             o.units(), o.epoch(), absl::Nanoseconds(o.ttl_ns()),
                                             o.decision()});
    }
    case state::LogRecord::kPoolLeaseActivated: {
      const auto& o = p.pool_lease_activated();
      return Record(
          record::PoolLeaseActivated{o.pool(), o.profile(), o.slot(), o.token(), o.decision()});
    }
    case state::LogRecord::kPoolLeaseReleased: {
      const auto& o = p.pool_lease_released();
      if (o.reason() > 2) return absl::InvalidArgumentError("bad pool release reason");
      return Record(record::PoolLeaseReleased{o.pool(), o.profile(), o.slot(), o.token(),
                                              static_cast<PoolReleaseReason>(o.reason()),
                                              o.decision()});
    }
    case state::LogRecord::kPoolLeaseRecovered: {
      const auto& o = p.pool_lease_recovered();
      return Record(record::PoolLeaseRecovered{o.pool(), o.profile(), o.slot(), o.token(),
                                               o.evidence(), o.decision()});
    }
    case state::LogRecord::kPoolDrainSet:
      return Record(
          record::PoolDrainSet{p.pool_drain_set().pool(), p.pool_drain_set().draining()});
    case state::LogRecord::kPoolDeleted:
      return Record(record::PoolDeleted{p.pool_deleted().pool()});
    default:
      return absl::InvalidArgumentError("record of an unknown kind");
  }
}

std::string FramePayload(std::string_view payload) {
  std::string len_bytes;
  PutU32(&len_bytes, static_cast<uint32_t>(payload.size()));
  std::string out(kRecordMagic, 4);
  out += len_bytes;
  PutU32(&out, Crc32c(len_bytes));
  PutU32(&out, Crc32c(payload));
  out += payload;
  return out;
}

std::string Frame(const state::LogRecord& p) { return FramePayload(p.SerializeAsString()); }

// A record frame that checks out at `at`: magic, length within bounds, both checksums.
struct FrameView {
  std::string_view payload;
  uint64_t next;
};
std::optional<FrameView> FrameAt(std::string_view data, uint64_t at) {
  if (at + kRecordHeaderBytes > data.size()) return std::nullopt;
  if (std::memcmp(data.data() + at, kRecordMagic, 4) != 0) return std::nullopt;
  const uint32_t len = GetU32(data, at + 4);
  if (Crc32c(data.substr(at + 4, 4)) != GetU32(data, at + 8)) return std::nullopt;
  if (len > data.size() - at - kRecordHeaderBytes) return std::nullopt;
  std::string_view payload = data.substr(at + kRecordHeaderBytes, len);
  if (Crc32c(payload) != GetU32(data, at + 12)) return std::nullopt;
  return FrameView{payload, at + kRecordHeaderBytes + len};
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

// Loads a snapshot file into a fresh state machine.
absl::StatusOr<StateMachine> LoadSnapshot(const std::string& path, std::string_view data,
                                          uint64_t expected_lsn, MonoTime now) {
  if (data.size() < kSnapshotHeaderBytes) {
    return Damaged(path, absl::StrCat("is ", data.size(), " bytes, shorter than its header"));
  }
  if (std::memcmp(data.data(), kSnapshotMagic, 4) != 0) return DamagedAt(path, 0, "bad magic");
  if (GetU32(data, 20) != Crc32c(data.substr(0, 20))) {
    return DamagedAt(path, 0, "header checksum mismatch");
  }
  if (GetU32(data, 4) != kFileVersion && GetU32(data, 4) != kSnapshotVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": unsupported snapshot version ", GetU32(data, 4), " (this lockd reads ",
        kFileVersion, " to ", kSnapshotVersion, ")"));
  }
  const uint64_t len = GetU64(data, 8);
  if (len != data.size() - kSnapshotHeaderBytes) {
    return Damaged(path, absl::StrCat("payload is ", data.size() - kSnapshotHeaderBytes,
                                      " bytes, header says ", len));
  }
  std::string_view payload = data.substr(kSnapshotHeaderBytes);
  if (Crc32c(payload) != GetU32(data, 16)) {
    return DamagedAt(path, kSnapshotHeaderBytes, "payload checksum mismatch");
  }
  state::Snapshot snap;
  if (!snap.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return DamagedAt(path, kSnapshotHeaderBytes, "payload does not decode");
  }
  if (snap.last_lsn() != expected_lsn) {
    return Damaged(path, absl::StrCat("holds lsn ", snap.last_lsn(), " but is named for ",
                                      expected_lsn));
  }
  StateMachine state;
  auto apply = [&](const Record& r) -> absl::Status {
    if (absl::Status s = state.Check(r); !s.ok()) {
      return Damaged(path, absl::StrCat("inconsistent snapshot: ", s.message()));
    }
    state.Apply(r, now);
    return absl::OkStatus();
  };
  for (const auto& s : snap.sessions()) {
    if (absl::Status st = apply(SessionFromProto(s));
        !st.ok()) {
      return st;
    }
  }
  for (const auto& h : snap.holders()) {
    auto mode = ModeFromProto(h.mode());
    if (!mode.ok()) {
      return Damaged(path, absl::StrCat("lock ", h.lock(), ": ", mode.status().message()));
    }
    if (absl::Status st = apply(record::LockGranted{h.lock(), h.session_id(), h.token(),
                                                    absl::Nanoseconds(h.ttl_ns()), *mode,
                                                    absl::Nanoseconds(h.lock_delay_ns())});
        !st.ok()) {
      return st;
    }
  }
  for (const auto& d : snap.delays()) {
    auto lost = ModeFromProto(d.lost());
    absl::Status st = lost.ok() ? state.RestoreDelay(d.lock(), *lost,
                                                     absl::Nanoseconds(d.length_ns()), now)
                                : lost.status();
    if (!st.ok()) return Damaged(path, absl::StrCat("inconsistent snapshot: ", st.message()));
  }
  if (snap.last_token() < state.last_token() || snap.last_session_id() < state.last_session_id()) {
    return Damaged(path, "sequence marks below the ids it contains");
  }
  state.RaiseFloors(snap.last_token(), snap.last_session_id());
  uint64_t keys_in_clear = 0;  // pool owner keys an older lockd wrote in clear
  for (const auto& sp : snap.pools()) {
    PoolState pool;
    pool.generation = sp.generation();
    pool.budget = sp.budget();
    for (const auto& spec : sp.profiles()) pool.profiles.push_back(ProfileFromProto(spec));
    for (const auto& o : sp.owners()) {
      std::string digest = o.key_digest();
      if (digest.empty() && !o.key().empty()) {  // an older lockd's: the key itself
        digest = PoolOwnerKeyDigest(sp.name(), o.profile(), o.epoch(), o.key());
        ++keys_in_clear;
      }
      if (!pool.owners.emplace(o.profile(), PoolOwnerState{o.epoch(), std::move(digest),
                                                           o.acked_generation(), o.claimed_by()})
               .second) {
        return Damaged(path, absl::StrCat("inconsistent snapshot: pool ", sp.name(),
                                          " owner of ", o.profile(), " appears twice"));
      }
    }
    for (const auto& l : sp.leases()) {
      PoolLeaseState lease{.token = l.token(),
                           .units = l.units(),
                           .epoch = l.epoch(),
                           .active = l.active(),
                           .ttl = absl::Nanoseconds(l.ttl_ns()),
                           .expires_at = now,
                           .decision = l.decision()};
      if (!pool.leases.emplace(PoolSlotKey{l.profile(), l.slot()}, lease).second) {
        return Damaged(path, absl::StrCat("inconsistent snapshot: pool ", sp.name(), " slot ",
                                          l.profile(), "/", l.slot(), " appears twice"));
      }
    }
    for (const auto& t : sp.tombstones()) {
      pool.tombstones.push_back(
          PoolTombstone{t.profile(), t.slot(), t.token(), t.units(), t.decision(), t.evidence()});
    }
    pool.decision = sp.decision();
    pool.draining = sp.draining();
    if (absl::Status s = state.RestorePool(sp.name(), std::move(pool), now); !s.ok()) {
      return Damaged(path, absl::StrCat("inconsistent snapshot: ", s.message()));
    }
  }
  state.NoteSecretsReadInClear(keys_in_clear);
  return state;
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
  return Sequences{GetU64(data, 8), GetU64(data, 16)};
}

absl::StatusOr<StateMachine> DecodeSnapshot(const std::string& where, std::string_view data,
                                            uint64_t lsn, MonoTime now) {
  return LoadSnapshot(where, data, lsn, now);
}

absl::Status ReplayRecordFrames(const std::string& where, std::string_view data,
                                uint64_t snapshot_lsn, uint64_t* last_lsn, StateMachine* state,
                                MonoTime now, uint64_t* replayed) {
  uint64_t at = 0;
  while (at < data.size()) {
    const auto frame = FrameAt(data, at);
    if (!frame) return DamagedAt(where, at, "damaged record");
    state::LogRecord p;
    if (!p.ParseFromArray(frame->payload.data(), static_cast<int>(frame->payload.size())) ||
        p.kind_case() == state::LogRecord::kSealed) {
      return DamagedAt(where, at, "record checksum matches but it does not decode");
    }
    if (p.lsn() > snapshot_lsn) {
      if (p.lsn() != *last_lsn + 1) {
        return DamagedAt(where, at, absl::StrCat("record lsn ", p.lsn(), " follows ", *last_lsn));
      }
      auto r = FromProto(p);
      if (!r.ok()) return DamagedAt(where, at, std::string(r.status().message()));
      if (absl::Status s = state->Check(*r); !s.ok()) {
        return DamagedAt(where, at,
                         absl::StrCat("record lsn ", p.lsn(), " does not apply: ", s.message()));
      }
      state->Apply(*r, now);
      *last_lsn = p.lsn();
      ++*replayed;
    }
    at = frame->next;
  }
  return absl::OkStatus();
}

std::string SnapshotName(uint64_t lsn) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "snapshot-%020lu", static_cast<unsigned long>(lsn));
  return buf;
}

std::string SegmentName(uint64_t number) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "wal-%020lu", static_cast<unsigned long>(number));
  return buf;
}

std::string EncodeSequences(const Sequences& s) {
  std::string out(kSequencesMagic, 4);
  PutU32(&out, kFileVersion);
  PutU64(&out, s.token_hwm);
  PutU64(&out, s.session_hwm);
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

std::string EncodeRecordFrame(uint64_t lsn, const Record& r) { return Frame(ToProto(lsn, r)); }

std::string EncodeRawRecordFrame(std::string_view payload) { return FramePayload(payload); }

std::string EncodeSealFrame(uint64_t next_segment) {
  state::LogRecord p;
  p.mutable_sealed()->set_next_segment(next_segment);
  return Frame(p);
}

std::string EncodeSegmentHeader(uint64_t number, uint64_t size) {
  std::string out(kSegmentMagic, 8);
  PutU32(&out, kFileVersion);
  PutU64(&out, number);
  PutU64(&out, size);
  PutU32(&out, Crc32c(out));
  return out;
}

std::string EncodeSnapshot(const StateMachine& state, uint64_t last_lsn) {
  state::Snapshot snap;
  snap.set_last_lsn(last_lsn);
  snap.set_last_token(state.last_token());
  snap.set_last_session_id(state.last_session_id());
  for (const auto& [id, session] : state.sessions()) {  // ascending id
    auto* s = snap.add_sessions();
    s->set_session_id(id);
    s->set_ttl_ns(Nanos(session.ttl));
    s->set_secret_digest(session.secret_digest);
    s->set_owner(session.owner);
  }
  std::vector<std::pair<std::string, HolderState>> holders;
  for (const auto& [lock, held] : state.locks()) {  // ascending lock
    for (const HolderState& h : held.holders) holders.emplace_back(lock, h);
    for (const auto& [delay, lost] : {std::pair(&held.delay_all, LockMode::kExclusive),
                                      std::pair(&held.delay_writers, LockMode::kShared)}) {
      if (!delay->has_value()) continue;
      auto* out = snap.add_delays();
      out->set_lock(lock);
      out->set_lost(ModeToProto(lost));
      out->set_length_ns(Nanos((*delay)->length));
    }
  }
  std::sort(holders.begin(), holders.end(),
            [](const auto& a, const auto& b) { return a.second.token < b.second.token; });
  for (const auto& [lock, h] : holders) {
    auto* out = snap.add_holders();
    out->set_lock(lock);
    out->set_session_id(h.session);
    out->set_token(h.token);
    out->set_ttl_ns(Nanos(h.ttl));
    out->set_mode(ModeToProto(h.mode));
    out->set_lock_delay_ns(Nanos(h.lock_delay));
  }
  for (const auto& [name, pool] : state.pools()) {  // ascending name
    auto* out = snap.add_pools();
    out->set_name(name);
    out->set_generation(pool.generation);
    out->set_budget(pool.budget);
    for (const PoolProfileSpec& spec : pool.profiles) ProfileToProto(spec, out->add_profiles());
    for (const auto& [key, lease] : pool.leases) {
      auto* l = out->add_leases();
      l->set_profile(key.first);
      l->set_slot(key.second);
      l->set_token(lease.token);
      l->set_units(lease.units);
      l->set_epoch(lease.epoch);
      l->set_active(lease.active);
      l->set_ttl_ns(Nanos(lease.ttl));
      l->set_decision(lease.decision);
    }
    for (const auto& [profile, owner] : pool.owners) {
      auto* o = out->add_owners();
      o->set_profile(profile);
      o->set_epoch(owner.epoch);
      o->set_key_digest(owner.key);
      o->set_acked_generation(owner.acked_generation);
      o->set_claimed_by(owner.claimed_by);
    }
    for (const PoolTombstone& t : pool.tombstones) {
      auto* o = out->add_tombstones();
      o->set_profile(t.profile);
      o->set_slot(t.slot);
      o->set_token(t.token);
      o->set_units(t.units);
      o->set_decision(t.decision);
      o->set_evidence(t.evidence);
    }
    out->set_decision(pool.decision);
    out->set_draining(pool.draining);
  }
  return EncodeRawSnapshot(snap.SerializeAsString());
}

std::string EncodeRawSnapshot(std::string_view payload) {
  std::string out(kSnapshotMagic, 4);
  PutU32(&out, kSnapshotVersion);
  PutU64(&out, payload.size());
  PutU32(&out, Crc32c(payload));
  PutU32(&out, Crc32c(out));
  out += payload;
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
  // FORMAT
  const std::string format_path = Path(dir, kFormatFile);
  auto format = env->ReadFile(format_path);
  if (!format.ok()) {
    if (absl::IsNotFound(format.status())) {
      return absl::NotFoundError(absl::StrCat(
          format_path, " is missing: ", dir, names->empty() ? " is empty, not" : " is not",
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

  // Directory listing.
  std::vector<uint64_t> snapshots, segments;
  for (const std::string& name : *names) {
    if (auto lsn = ParseNumbered(name, "snapshot-")) {
      snapshots.push_back(*lsn);
    } else if (auto n = ParseNumbered(name, "wal-")) {
      segments.push_back(*n);
    } else if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      report.stale_temp_files.push_back(name);
    } else if (name != kFormatFile && name != kSequencesFile && name != kLockFile &&
               name != kCommittedFile) {
      report.warnings.push_back(absl::StrCat("ignoring unexpected file ", Path(dir, name)));
    }
  }
  std::sort(snapshots.begin(), snapshots.end());
  std::sort(segments.begin(), segments.end());
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
    const uint64_t size = GetU64(data, 20);
    if (size != data.size()) {
      // Segments are preallocated and synced before use: a crash never changes their size.
      return Damaged(path, absl::StrCat("is ", data.size(), " bytes but was allocated ", size,
                                        ": truncated or extended"));
    }
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
        out.state.Apply(*r, now);
        ++report.records_replayed;
        report.last_lsn = p.lsn();
      }
      at = frame->next;
    }
    report.segment_last_lsn[number] = segment_last;
    // `at` is the end of the last good record (or seal). What follows must be unused zeros,
    // except that the final segment may end in a torn append that was never acknowledged.
    std::string_view rest = data.substr(at);
    if (!AllZero(rest)) {
      // Damage followed by a good record is damage in the middle of the log, unless it is the
      // final segment's unacknowledged append whose sectors reached the disk out of order.
      size_t out_of_order = 0;  // the valid record after such an append's hole
      for (size_t p = at + 1; p + kRecordHeaderBytes <= data.size(); ++p) {
        const size_t hit = data.find(std::string_view(kRecordMagic, 4), p);
        if (hit == std::string_view::npos) break;
        if (FrameAt(data, hit)) {
          if (final && !expect_next_segment && AppendReachedTheDiskOutOfOrder(data, at, hit)) {
            out_of_order = hit;
            break;
          }
          return DamagedAt(path, at, absl::StrCat("damaged record; a valid record follows at ",
                                                  "offset ", hit));
        }
        p = hit;
      }
      if (!final || expect_next_segment) {
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
  out.state.RaiseFloors(report.token_floor, report.session_floor);
  return out;
}

}  // namespace fencelock::server
