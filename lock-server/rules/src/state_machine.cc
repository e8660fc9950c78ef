#include "lock-server/state_machine.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include <openssl/evp.h>

#include "logging/logging.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fencelock::server {

namespace {

// SHA-256 over `label` (with its terminating NUL), `salt` and `secret`; empty for an empty
// secret.
std::string Digest(std::string_view label, std::string_view salt, std::string_view secret) {
  if (secret.empty()) return "";
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = ctx != nullptr && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1 &&
                  EVP_DigestUpdate(ctx, label.data(), label.size()) == 1 &&
                  EVP_DigestUpdate(ctx, "", 1) == 1 &&
                  EVP_DigestUpdate(ctx, salt.data(), salt.size()) == 1 &&
                  EVP_DigestUpdate(ctx, secret.data(), secret.size()) == 1 &&
                  EVP_DigestFinal_ex(ctx, out, &n) == 1;
  EVP_MD_CTX_free(ctx);
  if (!ok) {
    // Only an allocation failure inside OpenSSL gets here; no digest means no resume, which
    // must not be silently weakened.
    logging::Lockd().Error("OpenSSL could not compute a SHA-256 digest");
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(out), n);
}

}  // namespace

std::string SessionSecretDigest(SessionId session, std::string_view secret) {
  char id[8];
  for (int i = 0; i < 8; ++i) id[i] = static_cast<char>(session.value() >> (56 - 8 * i));
  return Digest("fencelock session secret v1", std::string_view(id, sizeof(id)), secret);
}

std::string PoolOwnerKeyDigest(const std::string& pool, const std::string& profile,
                               uint64_t epoch, std::string_view key) {
  // The names cannot hold NUL (pool_service's CheckName), so they separate unambiguously.
  const std::string salt = pool + std::string(1, '\0') + profile + std::string(1, '\0') +
                           std::to_string(epoch);
  return Digest("fencelock pool owner key v1", salt, key);
}

namespace {

[[noreturn]] void InvariantBroken(const std::string& what) {
  logging::Lockd().Error(absl::StrCat("state machine invariant broken: ", what));
  std::abort();
}

}  // namespace

absl::Status StateMachine::Check(const Record& r) const {
  return std::visit([&](const auto& rec) { return CheckOne(rec); }, r);
}

void StateMachine::Apply(const Record& r, MonoTime now) {
  if (absl::Status s = Check(r); !s.ok()) InvariantBroken(std::string(s.message()));
  ApplyChecked(r, now);
}

void StateMachine::ApplyChecked(const Record& r, MonoTime now) {
  std::visit([&](const auto& rec) { ApplyOne(rec, now); }, r);
}

absl::Status StateMachine::RaiseFloors(FenceToken token_floor, SessionId session_floor) {
  const FenceToken token = std::max(last_token_, token_floor);
  const SessionId session = std::max(last_session_id_, session_floor);
  if (token.value() > FenceToken::kMaxInState || session.value() > SessionId::kMaxInState) {
    return absl::DataLossError(absl::StrCat(
        "the next fencing token would be above ", token, " and the next session id above ", session,
        ": beyond 2^63, which no lockd reaches, so the state is damaged or hand-made; "
        "lockd does not serve it, for its ids would wrap to 0"));
  }
  last_token_ = token;
  last_session_id_ = session;
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::SessionOpened& r) const {
  if (r.session <= last_session_id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("session id ", r.session, " not above last id ", last_session_id_));
  }
  if (r.ttl <= absl::ZeroDuration()) {
    return absl::FailedPreconditionError(absl::StrCat("session ", r.session, " has no TTL"));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::SessionRenewed& r) const {
  if (!sessions_.contains(r.session)) {
    return absl::FailedPreconditionError(absl::StrCat("renew of unknown session ", r.session));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::SessionEnded& r) const {
  auto it = sessions_.find(r.session);
  if (it == sessions_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("end of unknown session ", r.session));
  }
  if (!it->second.locks.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", r.session, " ended while holding ", it->second.locks.size(), " locks"));
  }
  return absl::OkStatus();
}

// The delays are not checked against `now`: a replayed log applies its records at one time,
// and a grant in the log shows that its delay had passed when it was made. LockService
// decides when a grant may be made; the simulator's checker checks it did.
absl::Status StateMachine::CheckOne(const record::LockGranted& r) const {
  if (r.token <= last_token_) {
    return absl::FailedPreconditionError(
        absl::StrCat("token ", r.token, " not above last token ", last_token_));
  }
  return CheckHolder(r);
}

absl::Status StateMachine::CheckHolder(const record::LockGranted& r) const {
  auto session = sessions_.find(r.session);
  if (session == sessions_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("grant of ", r.lock, " to unknown session ", r.session));
  }
  if (const LockState* lock = FindLock(r.lock); lock != nullptr && lock->held()) {
    if (r.mode == LockMode::kExclusive || lock->mode() == LockMode::kExclusive) {
      return absl::FailedPreconditionError(absl::StrCat(
          "grant of held lock ", r.lock,
          r.mode == LockMode::kShared ? " (shared, while held exclusive)" : ""));
    }
  }
  if (session->second.locks.contains(std::string_view(r.lock))) {
    return absl::FailedPreconditionError(
        absl::StrCat("grant of ", r.lock, " to session ", r.session, " that holds it"));
  }
  if (r.ttl <= absl::ZeroDuration()) {
    return absl::FailedPreconditionError(absl::StrCat("grant of ", r.lock, " has no TTL"));
  }
  if (r.lock_delay < absl::ZeroDuration()) {
    return absl::FailedPreconditionError(
        absl::StrCat("grant of ", r.lock, " has a negative delay"));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::LockRenewed& r) const {
  const LockState* lock = FindLock(r.lock);
  if (lock == nullptr || lock->FindToken(r.token) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "renew of ", r.lock, " with token ", r.token, " that does not hold it"));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::LockReleased& r) const {
  const LockState* lock = FindLock(r.lock);
  if (lock == nullptr || lock->FindToken(r.token) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "release of ", r.lock, " with token ", r.token, " that does not hold it"));
  }
  return absl::OkStatus();
}

const SessionState* StateMachine::FindSession(SessionId id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

void StateMachine::BindSession(SessionId id, uint64_t connection) {
  sessions_.at(id).connection = connection;
}

const LockState* StateMachine::FindLock(std::string_view lock) const {
  auto it = locks_.find(lock);
  return it == locks_.end() ? nullptr : *it;
}

LockState* StateMachine::MutableLock(std::string_view lock) {
  auto it = locks_.find(lock);
  return it == locks_.end() ? nullptr : *it;
}

const HolderState* StateMachine::FindHolder(std::string_view lock) const {
  const LockState* state = FindLock(lock);
  return state == nullptr || !state->held() ? nullptr : &state->holders().front();
}

StateMachine::StateMachine(const StateMachine& other) { *this = other; }

// Every field is copied here; the lock states are made anew, and the indexes that refer to
// them (each session's locks, the expiry index) point at the copies.
StateMachine& StateMachine::operator=(const StateMachine& other) {
  if (this == &other) return *this;
  frozen_.reset();  // a reading is the original's alone
  locks_.Free();
  lock_expiry_.clear();
  sessions_ = other.sessions_;
  held_locks_ = other.held_locks_;
  session_expiry_ = other.session_expiry_;
  delay_ends_ = other.delay_ends_;
  pools_ = other.pools_;
  pool_expiry_ = other.pool_expiry_;
  last_token_ = other.last_token_;
  last_session_id_ = other.last_session_id_;
  secrets_read_in_clear_ = other.secrets_read_in_clear_;
  for (auto& [id, session] : sessions_) session.locks.clear();
  for (const LockState* from : other.locks_) {
    LockState::Owned to = LockState::Make(from->name());
    to->one_ = from->one_;
    to->holder_count_ = from->holder_count_;
    if (from->extra_ != nullptr) to->extra_ = std::make_unique<LockState::Extra>(*from->extra_);
    LockState* state = to.release();
    locks_.insert(locks_.end(), state);
    for (const HolderState& h : state->holders()) {
      lock_expiry_.emplace(std::make_pair(h.expires_at, h.token), state);
      sessions_.at(h.session).locks.insert(state);
    }
  }
  return *this;
}

StateMachine::LockTable::LockTable(LockTable&& other) noexcept : LockSet(std::move(other)) {
  other.clear();
}

StateMachine::LockTable& StateMachine::LockTable::operator=(LockTable&& other) noexcept {
  if (this == &other) return *this;
  Free();
  LockSet::operator=(std::move(other));
  other.clear();
  return *this;
}

void StateMachine::LockTable::Forget(LockState* state) {
  erase(state);
  LockState::Free()(state);
}

void StateMachine::LockTable::Free() {
  for (LockState* state : *this) LockState::Free()(state);
  clear();
}

LockState& StateMachine::LockOf(std::string_view lock) {
  // A name after every other (a version-3 snapshot restores them so) goes at the end without a
  // search, which at 10,000,000 names is a cache miss per level; else one search, where the
  // name is or where it goes.
  auto it = locks_.empty() || (*locks_.rbegin())->name() < lock ? locks_.end()
                                                                 : locks_.lower_bound(lock);
  if (it != locks_.end() && (*it)->name() == lock) return **it;
  LockState* state = LockState::Make(lock).release();
  locks_.insert(it, state);
  return *state;
}

void StateMachine::MoveExpiry(LockState* state, HolderState& h, MonoTime at) {
  lock_expiry_.erase({h.expires_at, h.token});
  h.expires_at = at;
  lock_expiry_.emplace(std::make_pair(at, h.token), state);
}

void StateMachine::SetDelay(LockState& state, LockMode lost, std::optional<LockDelay> value) {
  const std::optional<LockDelay>& now_set =
      lost == LockMode::kExclusive ? state.delay_all() : state.delay_writers();
  if (!now_set.has_value() && !value.has_value()) return;  // every grant: nothing to do
  const std::string lock(state.name());
  std::optional<LockDelay>& slot = state.mutable_delay(lost);
  if (slot.has_value()) delay_ends_.erase({slot->until, lock, lost});
  slot = value;
  if (slot.has_value()) delay_ends_.emplace(slot->until, lock, lost);
  state.Compact();
}

void StateMachine::ForgetIfUnused(LockState* state) {
  if (!state->held() && !state->delay_all().has_value() && !state->delay_writers().has_value()) {
    locks_.Forget(state);
  }
}

absl::Status StateMachine::RestoreDelay(const std::string& lock, LockMode lost,
                                        absl::Duration length, MonoTime now) {
  if (length <= absl::ZeroDuration()) {
    return absl::FailedPreconditionError(
        absl::StrCat("lock ", lock, " has a delay of ", absl::FormatDuration(length)));
  }
  KeepLock(lock);
  SetDelay(LockOf(lock), lost, LockDelay{length, now + length});
  return absl::OkStatus();
}

void StateMachine::ForgetEndedDelays(const std::string& lock, MonoTime now) {
  LockState* state = MutableLock(lock);
  if (state == nullptr) return;
  KeepLock(lock);
  for (LockMode lost : {LockMode::kExclusive, LockMode::kShared}) {
    const std::optional<LockDelay>& slot =
        lost == LockMode::kExclusive ? state->delay_all() : state->delay_writers();
    if (slot.has_value() && slot->until <= now) SetDelay(*state, lost, std::nullopt);
  }
  ForgetIfUnused(state);
}

std::optional<std::string> StateMachine::EndedDelay(MonoTime now) const {
  if (delay_ends_.empty() || std::get<0>(*delay_ends_.begin()) > now) return std::nullopt;
  return std::get<1>(*delay_ends_.begin());
}

std::string StateMachine::DebugString() const {
  std::vector<std::string> parts;
  for (const auto& [id, s] : sessions_) {
    parts.push_back(absl::StrCat("s", id, "/", absl::FormatDuration(s.ttl)));
  }
  for (const LockState* state : locks_) {
    const std::string lock(state->name());
    for (const HolderState& h : state->holders()) {
      parts.push_back(absl::StrCat(lock, "=", h.token, "@s", h.session,
                                   h.mode == LockMode::kShared ? "/shared" : ""));
    }
    if (state->delay_all().has_value()) {
      parts.push_back(
          absl::StrCat(lock, "/delay-all:", absl::FormatDuration(state->delay_all()->length)));
    }
    if (state->delay_writers().has_value()) {
      parts.push_back(absl::StrCat(lock, "/delay-writers:",
                                   absl::FormatDuration(state->delay_writers()->length)));
    }
  }
  for (const auto& [name, pool] : pools_) {
    parts.push_back(absl::StrCat("pool:", name, "/g", pool.generation, "/d", pool.decision));
    for (const auto& [key, lease] : pool.leases) {
      parts.push_back(absl::StrCat("pool:", name, "/", key.first, "/", key.second, "=",
                                   lease.token, lease.active ? "A" : "P"));
    }
    for (const auto& [profile, owner] : pool.owners) {
      parts.push_back(absl::StrCat("pool:", name, "/", profile, "/e", owner.epoch, "/g",
                                   owner.acked_generation, "/by:", owner.claimed_by));
    }
  }
  std::sort(parts.begin(), parts.end());
  return absl::StrJoin(parts, " ");
}

void StateMachine::PostponeExpiries(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  session_expiry_.clear();
  lock_expiry_.clear();
  for (auto& [id, s] : sessions_) {
    s.expires_at = s.expires_at + d;
    session_expiry_.emplace(s.expires_at, id);
  }
  delay_ends_.clear();
  for (LockState* state : locks_) {
    for (HolderState& h : state->mutable_holders()) {
      h.expires_at = h.expires_at + d;
      lock_expiry_.emplace(std::make_pair(h.expires_at, h.token), state);
    }
    for (LockMode lost : {LockMode::kExclusive, LockMode::kShared}) {
      if (state->extra_ == nullptr) break;
      std::optional<LockDelay>& delay = state->mutable_delay(lost);
      if (!delay.has_value()) continue;
      delay->until = delay->until + d;
      delay_ends_.emplace(delay->until, std::string(state->name()), lost);
    }
  }
  pool_expiry_.clear();
  for (auto& [name, pool] : pools_) {
    for (auto& [key, lease] : pool.leases) {
      if (lease.active) continue;
      lease.expires_at = lease.expires_at + d;
      pool_expiry_.emplace(lease.expires_at, name, key.first, key.second);
    }
  }
}

void StateMachine::RestartLeases(MonoTime now) {
  session_expiry_.clear();
  lock_expiry_.clear();
  pool_expiry_.clear();
  for (auto& [id, s] : sessions_) {
    s.expires_at = std::max(s.expires_at, now + s.ttl);
    session_expiry_.emplace(s.expires_at, id);
  }
  delay_ends_.clear();
  for (LockState* state : locks_) {
    for (HolderState& h : state->mutable_holders()) {
      h.expires_at = std::max(h.expires_at, now + h.ttl);
      lock_expiry_.emplace(std::make_pair(h.expires_at, h.token), state);
    }
    for (LockMode lost : {LockMode::kExclusive, LockMode::kShared}) {
      if (state->extra_ == nullptr) break;
      std::optional<LockDelay>& delay = state->mutable_delay(lost);
      if (!delay.has_value()) continue;
      delay->until = std::max(delay->until, now + delay->length);
      delay_ends_.emplace(delay->until, std::string(state->name()), lost);
    }
  }
  for (auto& [name, pool] : pools_) {
    for (auto& [key, lease] : pool.leases) {
      if (lease.active) continue;
      lease.expires_at = std::max(lease.expires_at, now + lease.ttl);
      pool_expiry_.emplace(lease.expires_at, name, key.first, key.second);
    }
  }
}

MonoTime StateMachine::NextExpiry() const {
  MonoTime next = MonoTime::Max();
  if (!session_expiry_.empty()) next = std::min(next, session_expiry_.begin()->first);
  if (!lock_expiry_.empty()) next = std::min(next, lock_expiry_.begin()->first.first);
  if (!pool_expiry_.empty()) next = std::min(next, std::get<0>(*pool_expiry_.begin()));
  if (!delay_ends_.empty()) next = std::min(next, std::get<0>(*delay_ends_.begin()));
  return next;
}

std::optional<SessionId> StateMachine::ExpiredSession(MonoTime now) const {
  if (session_expiry_.empty() || session_expiry_.begin()->first > now) return std::nullopt;
  return session_expiry_.begin()->second;
}

std::optional<std::pair<std::string, FenceToken>> StateMachine::ExpiredLock(MonoTime now) const {
  if (lock_expiry_.empty() || lock_expiry_.begin()->first.first > now) return std::nullopt;
  const auto& [key, state] = *lock_expiry_.begin();
  return std::make_pair(std::string(state->name()), key.second);
}

void StateMachine::ApplyOne(const record::SessionOpened& r, MonoTime now) {
  last_session_id_ = r.session;
  SessionState& s = sessions_[r.session];
  s.ttl = r.ttl;
  s.expires_at = now + r.ttl;
  s.secret_digest = r.secret_digest;
  if (r.read_in_clear) ++secrets_read_in_clear_;
  s.owner = r.owner;
  session_expiry_.emplace(s.expires_at, r.session);
}

void StateMachine::ApplyOne(const record::SessionRenewed& r, MonoTime now) {
  auto it = sessions_.find(r.session);
  session_expiry_.erase({it->second.expires_at, r.session});
  it->second.expires_at = now + it->second.ttl;
  session_expiry_.emplace(it->second.expires_at, r.session);
  if (!r.locks) return;
  for (LockState* state : it->second.locks) {
    for (HolderState& h : state->mutable_holders()) {
      if (h.session != r.session || !h.confirmed) continue;
      MoveExpiry(state, h, now + h.ttl);
    }
  }
}

void StateMachine::ApplyOne(const record::SessionEnded& r, MonoTime now) {
  KeepSession(r.session);
  auto it = sessions_.find(r.session);
  session_expiry_.erase({it->second.expires_at, r.session});
  sessions_.erase(it);
}

void StateMachine::ApplyOne(const record::LockGranted& r, MonoTime now) {
  last_token_ = r.token;
  AddHolder(r, now);
}

absl::Status StateMachine::RestoreHolder(const record::LockGranted& r, MonoTime now) {
  if (r.token == FenceToken() || r.token > last_token_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "holder of ", r.lock, " with token ", r.token, " outside the token sequence (1 to ",
        last_token_, ")"));
  }
  // A name after every name held so far (a snapshot of version 3 lists them in order) is a
  // lock of its own, which no holder excludes: only the checks by session remain, and
  // AddHolder puts it at the table's end without a search.
  if (locks_.empty() || (*locks_.rbegin())->name() < r.lock) {
    const auto session = sessions_.find(r.session);
    if (session == sessions_.end() || r.ttl <= absl::ZeroDuration() ||
        r.lock_delay < absl::ZeroDuration()) {
      return CheckHolder(r);  // says why
    }
    AddHolder(r, now);
    return absl::OkStatus();
  }
  if (const LockState* lock = FindLock(r.lock);
      lock != nullptr && lock->held() && lock->holders().back().token >= r.token) {
    return absl::FailedPreconditionError(
        absl::StrCat("holders of ", r.lock, " not in ascending token order at token ", r.token));
  }
  if (absl::Status s = CheckHolder(r); !s.ok()) return s;
  AddHolder(r, now);
  return absl::OkStatus();
}

void StateMachine::AddHolder(const record::LockGranted& r, MonoTime now) {
  KeepLock(r.lock);
  auto session = sessions_.find(r.session);
  LockState& state = LockOf(r.lock);
  if (!state.held()) ++held_locks_;
  // A grant is made only once the delays that block it have passed (LockService), so they
  // are over; a shared grant leaves a delay that blocks writers only in place.
  SetDelay(state, LockMode::kExclusive, std::nullopt);
  if (r.mode == LockMode::kExclusive) SetDelay(state, LockMode::kShared, std::nullopt);
  // Tokens only rise, so the new holder goes last and the holders stay in token order.
  state.Add(HolderState{.session = r.session,
                        .token = r.token,
                        .ttl = r.ttl,
                        .expires_at = now + r.ttl,
                        .mode = r.mode,
                        .lock_delay = r.lock_delay});
  lock_expiry_.emplace(std::make_pair(now + r.ttl, r.token), &state);
  LockSet& mine = session->second.locks;
  mine.insert(mine.empty() || (*mine.rbegin())->name() < state.name() ? mine.end()
                                                                       : mine.begin(),
              &state);
}

void StateMachine::ApplyOne(const record::LockRenewed& r, MonoTime now) {
  LockState* state = MutableLock(r.lock);
  HolderState& h = *state->FindToken(r.token);
  h.confirmed = true;
  MoveExpiry(state, h, now + h.ttl);
}

void StateMachine::ApplyOne(const record::LockReleased& r, MonoTime now) {
  KeepLock(r.lock);
  LockState& state = *MutableLock(r.lock);
  const HolderState& h = *state.FindToken(r.token);
  lock_expiry_.erase({h.expires_at, r.token});
  auto session = sessions_.find(h.session);
  if (session != sessions_.end()) {
    session->second.locks.erase(&state);
    if (r.reason == ReleaseReason::kLeaseExpired) ++session->second.losses;
  }
  const LockMode mode = h.mode;
  const absl::Duration delay = h.lock_delay;
  state.Remove(r.token);
  if (!state.held()) --held_locks_;
  // A loss, not a release, starts the holder's delay; one already running ends at the later
  // of the two ends.
  if (r.reason != ReleaseReason::kReleased && delay > absl::ZeroDuration()) {
    const std::optional<LockDelay>& running =
        mode == LockMode::kExclusive ? state.delay_all() : state.delay_writers();
    LockDelay started{delay, now + delay};
    if (running.has_value()) {
      started.length = std::max(started.length, running->length);
      started.until = std::max(started.until, running->until);
    }
    SetDelay(state, mode, started);
  }
  ForgetIfUnused(&state);
}

}  // namespace fencelock::server
