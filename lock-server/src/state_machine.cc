#include "lock-server/state_machine.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fencelock::server {
namespace {

[[noreturn]] void InvariantBroken(const std::string& what) {
  std::fprintf(stderr, "lockd: state machine invariant broken: %s\n", what.c_str());
  std::abort();
}

}  // namespace

absl::Status StateMachine::Check(const Record& r) const {
  return std::visit([&](const auto& rec) { return CheckOne(rec); }, r);
}

void StateMachine::Apply(const Record& r, MonoTime now) {
  if (absl::Status s = Check(r); !s.ok()) InvariantBroken(std::string(s.message()));
  std::visit([&](const auto& rec) { ApplyOne(rec, now); }, r);
}

void StateMachine::RaiseFloors(FenceToken token_floor, SessionId session_floor) {
  last_token_ = std::max(last_token_, token_floor);
  last_session_id_ = std::max(last_session_id_, session_floor);
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

absl::Status StateMachine::CheckOne(const record::LockGranted& r) const {
  if (r.token <= last_token_) {
    return absl::FailedPreconditionError(
        absl::StrCat("token ", r.token, " not above last token ", last_token_));
  }
  if (!sessions_.contains(r.session)) {
    return absl::FailedPreconditionError(
        absl::StrCat("grant of ", r.lock, " to unknown session ", r.session));
  }
  if (holders_.contains(r.lock)) {
    return absl::FailedPreconditionError(absl::StrCat("grant of held lock ", r.lock));
  }
  if (r.ttl <= absl::ZeroDuration()) {
    return absl::FailedPreconditionError(absl::StrCat("grant of ", r.lock, " has no TTL"));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::LockRenewed& r) const {
  auto it = holders_.find(r.lock);
  if (it == holders_.end() || it->second.token != r.token) {
    return absl::FailedPreconditionError(absl::StrCat(
        "renew of ", r.lock, " with token ", r.token, " that does not hold it"));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::LockReleased& r) const {
  auto it = holders_.find(r.lock);
  if (it == holders_.end() || it->second.token != r.token) {
    return absl::FailedPreconditionError(absl::StrCat(
        "release of ", r.lock, " with token ", r.token, " that does not hold it"));
  }
  return absl::OkStatus();
}

const SessionState* StateMachine::FindSession(SessionId id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const HolderState* StateMachine::FindHolder(const std::string& lock) const {
  auto it = holders_.find(lock);
  return it == holders_.end() ? nullptr : &it->second;
}

std::string StateMachine::DebugString() const {
  std::vector<std::string> parts;
  for (const auto& [id, s] : sessions_) {
    parts.push_back(absl::StrCat("s", id, "/", absl::FormatDuration(s.ttl)));
  }
  for (const auto& [lock, h] : holders_) {
    parts.push_back(absl::StrCat(lock, "=", h.token, "@s", h.session));
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
  for (auto& [lock, h] : holders_) {
    h.expires_at = h.expires_at + d;
    lock_expiry_.emplace(h.expires_at, lock);
  }
}

MonoTime StateMachine::NextExpiry() const {
  MonoTime next = MonoTime::Max();
  if (!session_expiry_.empty()) next = std::min(next, session_expiry_.begin()->first);
  if (!lock_expiry_.empty()) next = std::min(next, lock_expiry_.begin()->first);
  return next;
}

std::optional<SessionId> StateMachine::ExpiredSession(MonoTime now) const {
  if (session_expiry_.empty() || session_expiry_.begin()->first > now) return std::nullopt;
  return session_expiry_.begin()->second;
}

std::optional<std::string> StateMachine::ExpiredLock(MonoTime now) const {
  if (lock_expiry_.empty() || lock_expiry_.begin()->first > now) return std::nullopt;
  return lock_expiry_.begin()->second;
}

void StateMachine::ApplyOne(const record::SessionOpened& r, MonoTime now) {
  last_session_id_ = r.session;
  SessionState& s = sessions_[r.session];
  s.ttl = r.ttl;
  s.expires_at = now + r.ttl;
  s.secret = r.secret;
  s.owner = r.owner;
  session_expiry_.emplace(s.expires_at, r.session);
}

void StateMachine::ApplyOne(const record::SessionRenewed& r, MonoTime now) {
  auto it = sessions_.find(r.session);
  session_expiry_.erase({it->second.expires_at, r.session});
  it->second.expires_at = now + it->second.ttl;
  session_expiry_.emplace(it->second.expires_at, r.session);
}

void StateMachine::ApplyOne(const record::SessionEnded& r, MonoTime now) {
  auto it = sessions_.find(r.session);
  session_expiry_.erase({it->second.expires_at, r.session});
  sessions_.erase(it);
}

void StateMachine::ApplyOne(const record::LockGranted& r, MonoTime now) {
  auto session = sessions_.find(r.session);
  auto it = holders_.try_emplace(r.lock).first;
  last_token_ = r.token;
  it->second = HolderState{r.session, r.token, r.ttl, now + r.ttl};
  lock_expiry_.emplace(it->second.expires_at, r.lock);
  session->second.locks.insert(r.lock);
}

void StateMachine::ApplyOne(const record::LockRenewed& r, MonoTime now) {
  auto it = holders_.find(r.lock);
  lock_expiry_.erase({it->second.expires_at, r.lock});
  it->second.expires_at = now + it->second.ttl;
  lock_expiry_.emplace(it->second.expires_at, r.lock);
}

void StateMachine::ApplyOne(const record::LockReleased& r, MonoTime now) {
  auto it = holders_.find(r.lock);
  lock_expiry_.erase({it->second.expires_at, r.lock});
  auto session = sessions_.find(it->second.session);
  if (session != sessions_.end()) session->second.locks.erase(r.lock);
  holders_.erase(it);
}

}  // namespace fencelock::server
