#include "lock-server/lock_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fencelock::server {

LockService::LockService(ServiceOptions options) : LockService(std::move(options), StateMachine()) {}

LockService::LockService(ServiceOptions options, StateMachine restored)
    : options_(std::move(options)),
      state_(std::move(restored)),
      pools_(options_.pools, &state_, [this](const Record& r, MonoTime now) { Commit(r, now); }) {}

void LockService::FailAllWaiters(const absl::Status& status) {
  std::vector<WaiterId> all;
  for (const auto& [id, place] : waiter_index_) all.push_back(id);
  std::sort(all.begin(), all.end());  // outcomes in the same order in every run
  for (WaiterId id : all) RemoveWaiter(id, status, /*hand_off_at=*/std::nullopt);
}

void LockService::Commit(const Record& r, MonoTime now) {
  state_.Apply(r, now);
  if (observer_) observer_(r);
}

absl::StatusOr<absl::Duration> LockService::ResolveTtl(absl::Duration requested,
                                                       absl::Duration default_ttl) const {
  if (requested == absl::ZeroDuration()) return default_ttl;
  if (requested < options_.min_ttl || requested > options_.max_ttl) {
    return absl::InvalidArgumentError(
        absl::StrCat("TTL ", absl::FormatDuration(requested), " is outside the accepted range [",
                     absl::FormatDuration(options_.min_ttl), ", ",
                     absl::FormatDuration(options_.max_ttl), "]"));
  }
  return requested;
}

absl::StatusOr<std::pair<SessionId, absl::Duration>> LockService::OpenSession(
    absl::Duration ttl, MonoTime now, const Caller& caller, std::string secret) {
  Advance(now);
  auto resolved = ResolveTtl(ttl, options_.default_session_ttl);
  if (!resolved.ok()) return resolved.status();
  const SessionId id = state_.last_session_id().Next();
  // Only the digest is kept: whoever reads the log or etcd cannot resume the session.
  Commit(record::SessionOpened{id, *resolved, SessionSecretDigest(id, secret), caller.identity},
         now);
  state_.BindSession(id, caller.connection);
  return std::make_pair(id, *resolved);
}

absl::Status LockService::Deny(std::string message) {
  ++stats_.permission_denied_total;
  if (options_.on_permission_denied) options_.on_permission_denied(message);
  return absl::PermissionDeniedError(std::move(message));
}

absl::Status LockService::Authorize(SessionId session, const Caller& caller) {
  const SessionState* s = state_.FindSession(session);
  if (s == nullptr) return absl::OkStatus();
  if (s->owner != caller.identity) {
    return Deny(absl::StrCat("session ", session, " belongs to another identity"));
  }
  if (s->connection != caller.connection) {
    return Deny(absl::StrCat("session ", session,
                             " is not bound to this connection: resume it with its secret "
                             "(ResumeSession) first"));
  }
  return absl::OkStatus();
}

bool LockService::SentByItsDriver(SessionId session, const Caller& caller) const {
  if (state_.FindSession(session) != nullptr) return true;  // Authorize() judged it
  const auto ended = ended_sessions_.find(session);
  if (ended == ended_sessions_.end()) return false;
  return (ended->second.connection != 0 && ended->second.connection == caller.connection) ||
         (ended->second.identity_hash != 0 && !caller.identity.empty() &&
          ended->second.identity_hash == std::hash<std::string>{}(caller.identity));
}

absl::StatusOr<absl::Duration> LockService::Resume(SessionId session, std::string_view secret,
                                                   const Caller& caller) {
  const SessionState* s = state_.FindSession(session);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("session ", session, " does not exist"));
  // The digests are compared in full whatever differs, so the time taken tells nothing.
  const std::string given = SessionSecretDigest(session, secret);
  const std::string& kept = s->secret_digest;
  unsigned char diff = kept.size() == given.size() && !kept.empty() ? 0 : 1;
  for (size_t i = 0; i < given.size() && i < kept.size(); ++i) {
    diff |= static_cast<unsigned char>(kept[i] ^ given[i]);
  }
  if (diff != 0 || s->owner != caller.identity) {
    return Deny(absl::StrCat("session ", session, " cannot be resumed with this secret",
                             s->owner != caller.identity ? " by this identity" : ""));
  }
  // The session moves to another connection: its Acquires still waiting were sent on the old
  // one, whose requester gave it up. They are cancelled (answered there), so that none is left
  // that a grant would come to unseen, or that nobody could withdraw.
  if (s->connection.has_value() && s->connection != caller.connection) {
    CancelWaitersOf(session, "was resumed on another connection while waiting", now_);
  }
  state_.BindSession(session, caller.connection);
  return s->ttl;
}

absl::Status LockService::CheckHolder(std::optional<SessionId> session, const std::string& lock,
                                      FenceToken token, bool count, bool from_driver) {
  if (token.value() == 0 || token > state_.last_token()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " for lock \"", lock, "\" was never issued"));
  }
  const LockState* held = state_.FindLock(lock);
  const HolderState* holder = held == nullptr ? nullptr : held->FindToken(token);
  if (holder != nullptr && (!session.has_value() || holder->session == *session)) {
    return absl::OkStatus();
  }
  // Whose token is it? Only a lease's own session acting after losing it is fenced out (the
  // must-be-zero event); a token the sender never held says nothing about any holder.
  const auto ended = ended_.find(token);
  // With a session, sent by whoever drove it (SentByItsDriver): anyone else replaying an ended
  // session's token says nothing about its holder.
  const bool own = ended != ended_.end() &&
                   ended->second.lock_hash == std::hash<std::string>{}(lock) &&
                   (!session.has_value() || (ended->second.session == *session && from_driver));
  const std::string from =
      session.has_value() ? absl::StrCat(" from session ", *session) : std::string();
  if (!own) {
    absl::Status refused = absl::AbortedError(absl::StrCat(
        "FENCED_OUT: token ", token, " does not hold lock \"", lock, "\"",
        session.has_value()
            ? absl::StrCat(" and session ", *session, " never held it with that token")
            : " and lockd does not know it as one of that lock's tokens"));
    if (count) {
      ++stats_.foreign_tokens_total;
      if (options_.on_foreign_token) {
        options_.on_foreign_token(
            absl::StrCat("refused a foreign token: ", refused.message(), from));
      }
    }
    return refused;
  }
  std::string now_held = "the lock is free";
  if (held != nullptr && held->held()) {
    const auto holders = held->holders();
    now_held = holders.size() == 1
                   ? absl::StrCat("current token ", holders.front().token)
                   : absl::StrCat("held shared by ", holders.size(),
                                  " holders, newest token ", holders.back().token);
  }
  absl::Status fenced = absl::AbortedError(absl::StrCat(
      "FENCED_OUT: token ", token, " no longer holds lock \"", lock, "\" (", now_held, ")"));
  if (count) {
    ++stats_.fenced_out_total;
    if (options_.on_fenced_out) options_.on_fenced_out(absl::StrCat(fenced.message(), from));
  }
  return fenced;
}

void LockService::RememberEnded(const std::string& lock, FenceToken token, SessionId session) {
  if (options_.remembered_lease_ends == 0) return;
  ended_.emplace(token, EndedLease{std::hash<std::string>{}(lock), session});
  ended_order_.push_back(token);
  // Forget by age of the end, not of the grant: a lease held for a day and lost just now is
  // the likeliest to be acted on stale.
  while (ended_order_.size() > options_.remembered_lease_ends) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

absl::StatusOr<std::vector<absl::Status>> LockService::KeepAlive(
    SessionId session, std::span<const LockRef> locks, MonoTime now) {
  Advance(now);
  if (state_.FindSession(session) == nullptr) {
    return absl::NotFoundError(absl::StrCat("session ", session, " does not exist"));
  }
  Commit(record::SessionRenewed{session}, now);
  std::vector<absl::Status> results;
  results.reserve(locks.size());
  for (const LockRef& ref : locks) {
    absl::Status s = CheckHolder(session, ref.lock, ref.token);
    if (s.ok()) Commit(record::LockRenewed{ref.lock, ref.token}, now);
    results.push_back(std::move(s));
  }
  return results;
}

absl::StatusOr<LockService::Renewed> LockService::Renew(SessionId session,
                                                        std::span<const LockRef> confirm,
                                                        MonoTime now) {
  Advance(now);
  const SessionState* s = state_.FindSession(session);
  if (s == nullptr) {
    return absl::NotFoundError(absl::StrCat("session ", session, " does not exist"));
  }
  for (const LockRef& ref : confirm) {
    const LockState* lock = state_.FindLock(ref.lock);
    const HolderState* holder = lock == nullptr ? nullptr : lock->FindToken(ref.token);
    // Renewing it confirms it (a stale one is no news: its loss is counted in `losses`).
    if (holder != nullptr && holder->session == session) {
      Commit(record::LockRenewed{ref.lock, ref.token}, now);
    }
  }
  Commit(record::SessionRenewed{session, /*locks=*/true}, now);
  s = state_.FindSession(session);
  return Renewed{.ttl = s->ttl, .losses = s->losses, .held = s->locks.size()};
}

absl::Status LockService::CloseSession(SessionId session, MonoTime now) {
  Advance(now);
  if (state_.FindSession(session) == nullptr) {
    return absl::NotFoundError(absl::StrCat("session ", session, " does not exist"));
  }
  EndSession(session, EndReason::kClosed, now);
  return absl::OkStatus();
}

absl::StatusOr<AcquireResult> LockService::Acquire(SessionId session, const std::string& lock,
                                                   absl::Duration ttl, absl::Duration wait,
                                                   WaiterId waiter, MonoTime now,
                                                   const AcquireMode& how) {
  Advance(now);
  const SessionState* s = state_.FindSession(session);  // valid until the Commit below
  if (s == nullptr) {
    return absl::NotFoundError(absl::StrCat("session ", session, " does not exist"));
  }
  if (lock.empty() || lock.size() > options_.max_lock_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("lock name must be 1 to ",
                                                   options_.max_lock_name_bytes, " bytes, got ",
                                                   lock.size()));
  }
  auto resolved = ResolveTtl(ttl, options_.default_lock_ttl);
  if (!resolved.ok()) return resolved.status();
  if (wait < absl::ZeroDuration() || wait > options_.max_wait) {
    return absl::InvalidArgumentError(absl::StrCat("wait ", absl::FormatDuration(wait),
                                                   " is outside [0, ",
                                                   absl::FormatDuration(options_.max_wait), "]"));
  }
  const absl::Duration delay = how.lock_delay.value_or(options_.default_lock_delay);
  if (delay < absl::ZeroDuration() || delay > options_.max_lock_delay) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lock delay ", absl::FormatDuration(delay), " is outside [0, ",
        absl::FormatDuration(options_.max_lock_delay), "] (lockd --max-lock-delay)"));
  }
  const LockState* state = state_.FindLock(lock);
  if (const HolderState* own = state == nullptr ? nullptr : state->FindSession(session)) {
    return absl::InvalidArgumentError(absl::StrCat("session ", session, " already holds lock \"",
                                                   lock, "\" (token ", own->token, ")"));
  }
  // No barging: while anyone waits, a request queues behind them whatever its mode.
  const auto queue = queues_.find(lock);
  const size_t queued = queue == queues_.end() ? 0 : queue->second.size();
  const bool grantable = queued == 0 && Grantable(lock, how.mode, now);
  const auto waiting = waiting_.find(session);
  const size_t in_use = s->locks.size() + (waiting == waiting_.end() ? 0 : waiting->second);
  if (in_use >= options_.max_locks_per_session && (grantable || wait > absl::ZeroDuration())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", session, " already holds or waits for ", in_use,
        " locks, the most one session may (lockd --max-locks-per-session=",
        options_.max_locks_per_session, ")"));
  }
  if (grantable) {
    const FenceToken token = state_.last_token().Next();
    Commit(record::LockGranted{lock, session, token, *resolved, how.mode, delay}, now);
    ++stats_.grants_total;
    if (how.mode == LockMode::kShared) ++stats_.shared_grants_total;
    return AcquireResult{AcquireResult::Kind::kGranted, token, *resolved};
  }
  if (queued == 0 && state != nullptr && state->DelayedUntil(how.mode) > now) {
    // Held back by a delay alone: no holder excludes it.
    const bool excluded = state->held() && (how.mode == LockMode::kExclusive ||
                                            state->mode() == LockMode::kExclusive);
    if (!excluded) ++stats_.lock_delay_blocked_acquires_total;
  }
  if (wait == absl::ZeroDuration()) return AcquireResult{AcquireResult::Kind::kBusy};
  if (waiter_index_.contains(waiter)) {
    return absl::InvalidArgumentError(absl::StrCat("waiter id ", waiter, " is already queued"));
  }
  if (queued >= options_.max_waiters_per_lock) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "lock \"", lock, "\" already has ", queued,
        " waiters, the most one lock may (lockd --max-waiters-per-lock=",
        options_.max_waiters_per_lock, ")"));
  }
  const MonoTime give_up_at = now + wait;
  queues_[lock].push_back(Waiter{waiter, session, *resolved, give_up_at, how.mode, delay});
  ++waiting_[session];
  waiter_index_[waiter] = WaiterPlace{lock, session, give_up_at};
  waiter_deadlines_.emplace(give_up_at, waiter);
  return AcquireResult{AcquireResult::Kind::kQueued};
}

absl::Status LockService::Release(SessionId session, const std::string& lock, FenceToken token,
                                  MonoTime now, bool relinquish, bool from_driver) {
  Advance(now);
  absl::Status s = CheckHolder(session, lock, token, /*count=*/!relinquish, from_driver);
  if (!s.ok()) return s;
  ReleaseAndHandOff(lock, token, ReleaseReason::kReleased, now);
  return absl::OkStatus();
}

absl::Status LockService::Validate(const std::string& lock, FenceToken token, MonoTime now,
                                   std::optional<SessionId> holder, bool from_driver) {
  Advance(now);
  // A resource has the token, not a session; a holder confirming its lock names its session.
  return CheckHolder(holder, lock, token, /*count=*/true, from_driver);
}

void LockService::ReleaseAndHandOff(const std::string& lock, FenceToken token,
                                    ReleaseReason reason, MonoTime now) {
  const HolderState* holder = state_.FindLock(lock)->FindToken(token);
  RememberEnded(lock, token, holder->session);
  const bool delays =
      reason != ReleaseReason::kReleased && holder->lock_delay > absl::ZeroDuration();
  Commit(record::LockReleased{lock, token, reason}, now);
  HandOff(lock, now);
  if (delays) {
    ++stats_.lock_delays_started_total;
    stats_.lock_delay_blocked_acquires_total += HeldBackByDelay(lock, now);
  }
}

size_t LockService::HeldBackByDelay(const std::string& lock, MonoTime now) const {
  const auto q = queues_.find(lock);
  const LockState* state = state_.FindLock(lock);
  if (q == queues_.end() || state == nullptr) return 0;
  size_t held_back = 0;
  for (const Waiter& w : q->second) {
    const bool excluded = state->held() && (w.mode == LockMode::kExclusive ||
                                            state->mode() == LockMode::kExclusive);
    if (excluded || state->DelayedUntil(w.mode) <= now) break;
    ++held_back;
    if (w.mode == LockMode::kExclusive) break;  // those behind it wait for it anyway
  }
  return held_back;
}

bool LockService::Grantable(const std::string& lock, LockMode mode, MonoTime now) const {
  const LockState* state = state_.FindLock(lock);
  if (state == nullptr) return true;
  if (state->held() &&
      (mode == LockMode::kExclusive || state->mode() == LockMode::kExclusive)) {
    return false;
  }
  return state->DelayedUntil(mode) <= now;
}

void LockService::HandOff(const std::string& lock, MonoTime now) {
  for (;;) {
    auto q = queues_.find(lock);
    // Waiters are removed from the queue when their session ends or their wait runs out, so the
    // front waiter is always live.
    if (q == queues_.end() || !Grantable(lock, q->second.front().mode, now)) return;
    const Waiter w = q->second.front();
    // A session may wait for a lock it holds (a second Acquire of one client, sent while the
    // first waited); it is granted once its own hold ends, as with exclusive locks, and those
    // behind it wait in line.
    if (const LockState* held = state_.FindLock(lock); held && held->FindSession(w.session)) return;
    q->second.pop_front();
    if (q->second.empty()) queues_.erase(q);
    waiter_index_.erase(w.id);
    waiter_deadlines_.erase({w.give_up_at, w.id});
    Unqueued(w.session);
    const FenceToken next = state_.last_token().Next();
    Commit(record::LockGranted{lock, w.session, next, w.ttl, w.mode, w.lock_delay}, now);
    ++stats_.grants_total;
    if (w.mode == LockMode::kShared) ++stats_.shared_grants_total;
    outcomes_.push_back(WaiterOutcome{w.id, lock, absl::OkStatus(), next, w.ttl});
    // An exclusive grant excludes the rest; after a shared one, Grantable lets in the shared
    // waiters that follow and stops at the first exclusive one.
  }
}

void LockService::CancelWaitersOf(SessionId session, const std::string& why, MonoTime now) {
  if (!waiting_.contains(session)) return;
  std::vector<WaiterId> waiting;
  for (const auto& [id, place] : waiter_index_) {
    if (place.session == session) waiting.push_back(id);
  }
  std::sort(waiting.begin(), waiting.end());  // outcomes in the same order in every run
  for (WaiterId id : waiting) {
    RemoveWaiter(id, absl::CancelledError(absl::StrCat("session ", session, " ", why)), now);
  }
}

void LockService::EndSession(SessionId session, EndReason reason, MonoTime now) {
  CancelWaitersOf(session,
                  reason == EndReason::kExpired ? "expired while waiting" : "closed while waiting",
                  now);
  const SessionState* s = state_.FindSession(session);
  std::vector<std::string> held;
  held.reserve(s->locks.size());
  for (const LockState* lock : s->locks) held.emplace_back(lock->name());
  for (const std::string& lock : held) {
    ReleaseAndHandOff(lock, state_.FindLock(lock)->FindSession(session)->token,
                      ReleaseReason::kSessionEnded, now);
  }
  const EndedSession who{s->connection.value_or(ConnectionId{0}),
                         s->owner.empty() ? size_t{0} : std::hash<std::string>{}(s->owner)};
  Commit(record::SessionEnded{session, reason}, now);  // `s` is gone from here on
  if (options_.remembered_lease_ends > 0) {
    ended_sessions_[session] = who;
    ended_sessions_order_.push_back(session);
    while (ended_sessions_order_.size() > options_.remembered_lease_ends) {
      ended_sessions_.erase(ended_sessions_order_.front());
      ended_sessions_order_.pop_front();
    }
  }
}

void LockService::RemoveWaiter(WaiterId waiter, absl::Status outcome,
                               std::optional<MonoTime> hand_off_at) {
  auto place = waiter_index_.find(waiter);
  if (place == waiter_index_.end()) return;
  auto q = queues_.find(place->second.lock);
  auto& dq = q->second;
  auto it = std::find_if(dq.begin(), dq.end(), [&](const Waiter& w) { return w.id == waiter; });
  const bool was_first = it == dq.begin();
  dq.erase(it);
  if (dq.empty()) queues_.erase(q);
  waiter_deadlines_.erase({place->second.give_up_at, waiter});
  Unqueued(place->second.session);
  std::string lock = std::move(place->second.lock);
  waiter_index_.erase(place);
  if (!outcome.ok()) outcomes_.push_back(WaiterOutcome{waiter, lock, std::move(outcome)});
  // A writer first in line held back the readers behind it; they may hold with the readers
  // that hold now.
  if (hand_off_at.has_value() && was_first) HandOff(lock, *hand_off_at);
}

void LockService::Unqueued(SessionId session) {
  auto it = waiting_.find(session);
  if (it != waiting_.end() && --it->second == 0) waiting_.erase(it);
}

void LockService::CancelWaiter(WaiterId waiter) { RemoveWaiter(waiter, absl::OkStatus(), now_); }

absl::StatusOr<bool> LockService::Withdraw(WaiterId waiter, SessionId session, MonoTime now) {
  Advance(now);  // a wait already settled by `now` (granted, or run out) is not withdrawn
  auto place = waiter_index_.find(waiter);
  if (place == waiter_index_.end()) return false;
  if (place->second.session != session) {
    return absl::InvalidArgumentError(absl::StrCat("that Acquire waits for session ",
                                                   place->second.session, ", not ", session));
  }
  const std::string lock = place->second.lock;
  RemoveWaiter(waiter,
               absl::CancelledError(
                   absl::StrCat("the wait for lock \"", lock, "\" was withdrawn by its client")),
               now);
  return true;
}

void LockService::Advance(MonoTime now) {
  now_ = std::max(now_, now);
  // Settle events in the order they happened, so that a lock that expired before a waiter
  // gave up is still handed to that waiter.
  for (;;) {
    const MonoTime waiter_due =
        waiter_deadlines_.empty() ? MonoTime::Max() : waiter_deadlines_.begin()->first;
    const MonoTime state_due = state_.NextExpiry();
    const MonoTime due = std::min(waiter_due, state_due);
    if (due > now) return;
    if (auto session = state_.ExpiredSession(due)) {
      ++stats_.session_expiries_total;
      EndSession(*session, EndReason::kExpired, due);
    } else if (auto lock = state_.ExpiredLock(due)) {
      ++stats_.lock_expiries_total;
      ReleaseAndHandOff(lock->first, lock->second, ReleaseReason::kLeaseExpired, due);
    } else if (state_.ExpiredPoolLease(due)) {
      pools_.Advance(due);
    } else if (auto delayed = state_.EndedDelay(due)) {
      state_.ForgetEndedDelays(*delayed, due);
      HandOff(*delayed, due);
    } else {
      const WaiterId id = waiter_deadlines_.begin()->second;
      const std::string name = waiter_index_.at(id).lock;
      RemoveWaiter(
          id, absl::DeadlineExceededError(absl::StrCat("wait for lock \"", name, "\" ran out")),
          due);
    }
  }
}

MonoTime LockService::NextDeadline() const {
  MonoTime next = state_.NextExpiry();
  if (!waiter_deadlines_.empty()) next = std::min(next, waiter_deadlines_.begin()->first);
  return next;
}

std::vector<WaiterOutcome> LockService::TakeWaiterOutcomes() {
  std::vector<WaiterOutcome> out;
  out.swap(outcomes_);
  return out;
}

}  // namespace fencelock::server
