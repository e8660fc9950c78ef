// lockd's records and snapshots as bytes: the record codec (state.proto), record frames, and
// the snapshot format (versions 1 and 2). storage.cc keeps the state directory's files and
// recovery.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "google/protobuf/arena.h"
#include "absl/strings/str_cat.h"
#include "crc32c.h"
#include "logging/logging.h"
#include "lock-server/storage.h"
#include "storage_format.h"

namespace fencelock::server {
namespace format {
namespace {

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

void ProfileToProto(const PoolProfileDef& spec, state::PoolProfile* out) {
  out->set_id(spec.id);
  out->set_cost(spec.cost);
  out->set_reserved(spec.reserved);
  out->set_lendable(spec.lendable);
  out->set_borrow(spec.borrow);
}

PoolProfileDef ProfileFromProto(const state::PoolProfile& p) {
  return PoolProfileDef{p.id(), p.cost(), p.reserved(), p.lendable(), p.borrow()};
}

}  // namespace

state::LogRecord ToProto(uint64_t lsn, const Record& r) {
  state::LogRecord p;
  p.set_lsn(lsn);
  std::visit(
      [&](const auto& rec) {
        using T = std::decay_t<decltype(rec)>;
        if constexpr (std::is_same_v<T, record::SessionOpened>) {
          p.mutable_session_opened()->set_session_id(rec.session.value());
          p.mutable_session_opened()->set_ttl_ns(Nanos(rec.ttl));
          p.mutable_session_opened()->set_secret_digest(rec.secret_digest);
          p.mutable_session_opened()->set_owner(rec.owner);
        } else if constexpr (std::is_same_v<T, record::SessionEnded>) {
          p.mutable_session_ended()->set_session_id(rec.session.value());
          p.mutable_session_ended()->set_reason(rec.reason == EndReason::kExpired ? 1 : 0);
        } else if constexpr (std::is_same_v<T, record::LockGranted>) {
          auto* g = p.mutable_lock_granted();
          g->set_lock(rec.lock);
          g->set_session_id(rec.session.value());
          g->set_token(rec.token.value());
          g->set_ttl_ns(Nanos(rec.ttl));
          g->set_mode(ModeToProto(rec.mode));
          g->set_lock_delay_ns(Nanos(rec.lock_delay));
        } else if constexpr (std::is_same_v<T, record::LockReleased>) {
          auto* l = p.mutable_lock_released();
          l->set_lock(rec.lock);
          l->set_token(rec.token.value());
          l->set_reason(static_cast<uint32_t>(rec.reason));
        } else if constexpr (std::is_same_v<T, record::PoolPolicyPublished>) {
          auto* o = p.mutable_pool_policy_published();
          o->set_pool(rec.pool);
          o->set_generation(rec.generation);
          o->set_budget(rec.budget);
          for (const PoolProfileDef& spec : rec.profiles) ProfileToProto(spec, o->add_profiles());
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
          o->set_token(rec.token.value());
          o->set_units(rec.units);
          o->set_epoch(rec.epoch);
          o->set_ttl_ns(Nanos(rec.ttl));
          o->set_decision(rec.decision);
        } else if constexpr (std::is_same_v<T, record::PoolLeaseActivated>) {
          auto* o = p.mutable_pool_lease_activated();
          o->set_pool(rec.pool);
          o->set_profile(rec.profile);
          o->set_slot(rec.slot);
          o->set_token(rec.token.value());
          o->set_decision(rec.decision);
        } else if constexpr (std::is_same_v<T, record::PoolLeaseReleased>) {
          auto* o = p.mutable_pool_lease_released();
          o->set_pool(rec.pool);
          o->set_profile(rec.profile);
          o->set_slot(rec.slot);
          o->set_token(rec.token.value());
          o->set_reason(static_cast<uint32_t>(rec.reason));
          o->set_decision(rec.decision);
        } else if constexpr (std::is_same_v<T, record::PoolLeaseRecovered>) {
          auto* o = p.mutable_pool_lease_recovered();
          o->set_pool(rec.pool);
          o->set_profile(rec.profile);
          o->set_slot(rec.slot);
          o->set_token(rec.token.value());
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
  record::SessionOpened r{SessionId(p.session_id()), absl::Nanoseconds(p.ttl_ns()),
                          p.secret_digest(), p.owner()};
  if (r.secret_digest.empty() && !p.secret().empty()) {
    r.secret_digest = SessionSecretDigest(SessionId(p.session_id()), p.secret());
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
          SessionId(p.session_ended().session_id()),
          p.session_ended().reason() == 1 ? EndReason::kExpired : EndReason::kClosed});
    case state::LogRecord::kLockGranted: {
      const auto& g = p.lock_granted();
      auto mode = ModeFromProto(g.mode());
      if (!mode.ok()) return mode.status();
      return Record(record::LockGranted{g.lock(), SessionId(g.session_id()), FenceToken(g.token()),
                                        absl::Nanoseconds(g.ttl_ns()), *mode,
                                        absl::Nanoseconds(g.lock_delay_ns())});
    }
    case state::LogRecord::kLockReleased: {
      const auto& l = p.lock_released();
      if (l.reason() > 2) return absl::InvalidArgumentError("bad release reason");
      return Record(record::LockReleased{l.lock(), FenceToken(l.token()),
                                         static_cast<ReleaseReason>(l.reason())});
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
      return Record(record::PoolLeaseGranted{o.pool(), o.profile(), o.slot(), FenceToken(o.token()),
                                             o.units(), o.epoch(), absl::Nanoseconds(o.ttl_ns()),
                                             o.decision()});
    }
    case state::LogRecord::kPoolLeaseActivated: {
      const auto& o = p.pool_lease_activated();
      return Record(record::PoolLeaseActivated{o.pool(), o.profile(), o.slot(),
                                               FenceToken(o.token()), o.decision()});
    }
    case state::LogRecord::kPoolLeaseReleased: {
      const auto& o = p.pool_lease_released();
      if (o.reason() > 2) return absl::InvalidArgumentError("bad pool release reason");
      return Record(
          record::PoolLeaseReleased{o.pool(), o.profile(), o.slot(), FenceToken(o.token()),
                                    static_cast<PoolReleaseReason>(o.reason()), o.decision()});
    }
    case state::LogRecord::kPoolLeaseRecovered: {
      const auto& o = p.pool_lease_recovered();
      return Record(record::PoolLeaseRecovered{o.pool(), o.profile(), o.slot(),
                                               FenceToken(o.token()), o.evidence(), o.decision()});
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

absl::StatusOr<StateMachine> LoadSnapshot(const std::string& path, std::string_view data,
                                          uint64_t expected_lsn, MonoTime now) {
  if (data.size() < kSnapshotHeaderBytes) {
    return Damaged(path, absl::StrCat("is ", data.size(), " bytes, shorter than its header"));
  }
  if (std::memcmp(data.data(), kSnapshotMagic, 4) != 0) return DamagedAt(path, 0, "bad magic");
  if (GetU32(data, 20) != Crc32c(data.substr(0, 20))) {
    return DamagedAt(path, 0, "header checksum mismatch");
  }
  if (GetU32(data, 4) < kFileVersion || GetU32(data, 4) > kSnapshotVersion) {
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
  // On an arena: a snapshot of millions of holders is as many small messages and strings,
  // allocated one by one and freed at once.
  google::protobuf::Arena arena;
  state::Snapshot& snap = *google::protobuf::Arena::CreateMessage<state::Snapshot>(&arena);
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
    state.ApplyChecked(r, now);
    return absl::OkStatus();
  };
  for (const auto& s : snap.sessions()) {
    if (absl::Status st = apply(SessionFromProto(s));
        !st.ok()) {
      return st;
    }
  }
  // The sequences before the holders: a holder's token must be within them, in whatever
  // order the holders come (by token up to version 2, by lock name from 3).
  if (SessionId(snap.last_session_id()) < state.last_session_id()) {
    return Damaged(path, "sequence marks below the ids it contains");
  }
  if (absl::Status s =
          state.RaiseFloors(FenceToken(snap.last_token()), SessionId(snap.last_session_id()));
      !s.ok()) {
    return Damaged(path, std::string(s.message()));
  }
  absl::flat_hash_set<uint64_t> tokens;
  tokens.reserve(snap.holders_size());
  for (const auto& h : snap.holders()) {
    auto mode = ModeFromProto(h.mode());
    if (!mode.ok()) {
      return Damaged(path, absl::StrCat("lock ", h.lock(), ": ", mode.status().message()));
    }
    if (!tokens.insert(h.token()).second) {
      return Damaged(path, absl::StrCat("inconsistent snapshot: token ", h.token(),
                                        " is held twice (again by ", h.lock(), ")"));
    }
    if (absl::Status st = state.RestoreHolder(
            record::LockGranted{h.lock(), SessionId(h.session_id()), FenceToken(h.token()),
                                absl::Nanoseconds(h.ttl_ns()), *mode,
                                absl::Nanoseconds(h.lock_delay_ns())},
            now);
        !st.ok()) {
      return Damaged(path, absl::StrCat("inconsistent snapshot: ", st.message()));
    }
  }
  for (const auto& d : snap.delays()) {
    auto lost = ModeFromProto(d.lost());
    absl::Status st = lost.ok() ? state.RestoreDelay(d.lock(), *lost,
                                                     absl::Nanoseconds(d.length_ns()), now)
                                : lost.status();
    if (!st.ok()) return Damaged(path, absl::StrCat("inconsistent snapshot: ", st.message()));
  }
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
      PoolLeaseState lease{.token = FenceToken(l.token()),
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

}  // namespace format

using namespace format;  // NOLINT: the layout this file is the other half of

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
      state->ApplyChecked(*r, now);
      *last_lsn = p.lsn();
      ++*replayed;
    }
    at = frame->next;
  }
  return absl::OkStatus();
}

std::string EncodeRecordFrame(uint64_t lsn, const Record& r) { return Frame(ToProto(lsn, r)); }

std::string EncodeRawRecordFrame(std::string_view payload) { return FramePayload(payload); }

std::string EncodeSealFrame(uint64_t next_segment) {
  state::LogRecord p;
  p.mutable_sealed()->set_next_segment(next_segment);
  return Frame(p);
}

namespace {

void AddSession(state::Snapshot& snap, SessionId id, const SessionState& session) {
  auto* s = snap.add_sessions();
  s->set_session_id(id.value());
  s->set_ttl_ns(Nanos(session.ttl));
  s->set_secret_digest(session.secret_digest);
  s->set_owner(session.owner);
}

void AddLock(state::Snapshot& snap, std::string_view lock, std::span<const HolderState> holders,
             const std::optional<LockDelay>& delay_all,
             const std::optional<LockDelay>& delay_writers) {
  for (const HolderState& h : holders) {  // ascending token
    auto* out = snap.add_holders();
    out->set_lock(std::string(lock));
    out->set_session_id(h.session.value());
    out->set_token(h.token.value());
    out->set_ttl_ns(Nanos(h.ttl));
    out->set_mode(ModeToProto(h.mode));
    out->set_lock_delay_ns(Nanos(h.lock_delay));
  }
  for (const auto& [delay, lost] : {std::pair(&delay_all, LockMode::kExclusive),
                                    std::pair(&delay_writers, LockMode::kShared)}) {
    if (!delay->has_value()) continue;
    auto* out = snap.add_delays();
    out->set_lock(std::string(lock));
    out->set_lost(ModeToProto(lost));
    out->set_length_ns(Nanos((*delay)->length));
  }
}

// The snapshot's sequences and its pools (few and small: read whole at the moment).
void AddHead(state::Snapshot& snap, const StateMachine& state, uint64_t last_lsn,
             FenceToken last_token, SessionId last_session_id) {
  snap.set_last_lsn(last_lsn);
  snap.set_last_token(last_token.value());
  snap.set_last_session_id(last_session_id.value());
  for (const auto& [name, pool] : state.pools()) {  // ascending name
    auto* out = snap.add_pools();
    out->set_name(name);
    out->set_generation(pool.generation);
    out->set_budget(pool.budget);
    for (const PoolProfileDef& spec : pool.profiles) ProfileToProto(spec, out->add_profiles());
    for (const auto& [key, lease] : pool.leases) {
      auto* l = out->add_leases();
      l->set_profile(key.first);
      l->set_slot(key.second);
      l->set_token(lease.token.value());
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
}

// Fills in the header in front of `file`'s payload (kSnapshotHeaderBytes reserved for it).
void PutSnapshotHeader(std::string& file) {
  const std::string_view payload = std::string_view(file).substr(kSnapshotHeaderBytes);
  std::string header(kSnapshotMagic, 4);
  PutU32(&header, kSnapshotVersion);
  PutU64(&header, payload.size());
  PutU32(&header, Crc32c(payload));
  PutU32(&header, Crc32c(header));
  file.replace(0, kSnapshotHeaderBytes, header);
}

}  // namespace

std::string EncodeSnapshot(const StateMachine& state, uint64_t last_lsn) {
  state::Snapshot snap;
  AddHead(snap, state, last_lsn, state.last_token(), state.last_session_id());
  for (const auto& [id, session] : state.sessions()) AddSession(snap, id, session);
  for (const LockState* lock : state.locks()) {  // ascending name
    AddLock(snap, lock->name(), lock->holders(), lock->delay_all(), lock->delay_writers());
  }
  return EncodeRawSnapshot(snap.SerializeAsString());
}

SnapshotEncoder::SnapshotEncoder(const StateMachine& state, uint64_t last_lsn,
                                 uint64_t expected_bytes)
    : state_(&state), file_(kSnapshotHeaderBytes, '\0') {
  file_.reserve(expected_bytes);
  state.Freeze();
  state::Snapshot head;
  AddHead(head, state, last_lsn, state.frozen_last_token(), state.frozen_last_session_id());
  head.AppendToString(&file_);
}

SnapshotEncoder::~SnapshotEncoder() {
  if (!done_) state_->Thaw();
}

bool SnapshotEncoder::EncodeSome(size_t max) {
  if (done_) return true;
  // Concatenated serializations of one message type parse as one message whose repeated
  // fields hold every part's entries in order: each slice appends a message of its own.
  state::Snapshot part;
  done_ = state_->ReadFrozen(
      max, [&](SessionId id, const SessionState& s) { AddSession(part, id, s); },
      [&](std::string_view lock, std::span<const HolderState> holders,
          const std::optional<LockDelay>& all, const std::optional<LockDelay>& writers) {
        AddLock(part, lock, holders, all, writers);
      });
  part.AppendToString(&file_);
  return done_;
}

std::string SnapshotEncoder::Finish() && {
  PutSnapshotHeader(file_);
  return std::move(file_);
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

}  // namespace fencelock::server
