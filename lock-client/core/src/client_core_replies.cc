// ClientCore (lock-client/core/client_core.h): lockd's replies, and time (the timeouts, the
// heartbeat, the leases' deadlines).
#include "lock-client/core/client_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client_core_internal.h"
#include "protocol/codes.h"
#include "protocol/version.h"

namespace fencelock::client_core {

namespace req = protocol::request;
using internal::kRetryFirst;
using internal::LeaseName;

// ---- replies ----

void ClientCore::OnResponse(MonoTime now, uint64_t conn, const wire::Response& r) {
  if (link_ != Link::kUp || conn != conn_) return;
  auto it = pending_.find(r.request_id());
  if (it == pending_.end()) {
    // A reply nobody waits for (a timed-out heartbeat's) extends nothing; but if it says that
    // lockd no longer has the session, the session's locks are gone all the same.
    auto late = std::find_if(late_.begin(), late_.end(),
                             [&](const auto& l) { return l.first == r.request_id(); });
    if (late != late_.end()) {
      const uint64_t session = late->second;
      late_.erase(late);
      if (r.code() == wire::SESSION_NOT_FOUND && session != 0 && session == session_id_) {
        LoseSession(now, LossReason::kSessionLost);
        Pump(now);
      }
    }
    return;
  }
  Pending p = std::move(it->second);
  pending_.Erase(it);
  if (r.code() == wire::SESSION_NOT_FOUND && p.session != 0 && p.session == session_id_ &&
      p.kind != Kind::kResume) {
    // lockd no longer has the session: every lock it held is gone.
    LoseSession(now, LossReason::kSessionLost);
  }
  auto op = ops_.find(p.op);
  const bool alive = p.op != 0 && op != ops_.end();
  switch (p.kind) {
    case Kind::kOpen:
      OnOpenReply(now, p, r);
      break;
    case Kind::kResume:
      OnResumeReply(now, p, r);
      break;
    case Kind::kKeepAlive:
      if (p.renew_all) {
        OnRenewReply(now, p, r);
      } else {
        OnKeepAliveReply(now, p, r);
      }
      break;
    case Kind::kAcquire:
      OnAcquireReply(now, p, r);
      break;
    case Kind::kGrantRenewal:
      OnGrantRenewalReply(now, p, &r);
      break;
    case Kind::kRelease:
      if (r.code() == wire::FENCED_OUT) fenced_out_.Increment();
      if (r.code() == wire::OK) RememberReleased(p);
      if (alive) Complete(p.op, protocol::StatusFromCode(r.code(), r.message()));
      break;
    case Kind::kUnawaitedRelease:
      if (r.code() == wire::OK) RememberReleased(p);
      // A release nobody waits for: only a token that no longer held its lock is news.
      if (r.code() == wire::FENCED_OUT) {
        fenced_out_.Increment();
        Log(LogLevel::kWarning, absl::StrCat("the release of \"", p.lock,
                                             "\" (not waited for) was fenced out: ", r.message()));
      }
      break;
    case Kind::kRelinquish:
    case Kind::kSettle:
      // Any answer settles it: released now, or no longer held by that token anyway.
      if (auto u = unsettled_.find(p.lock);
          u != unsettled_.end() && u->second.request == r.request_id()) {
        unsettled_.erase(u);
      }
      if (p.kind == Kind::kSettle && alive) {
        if (Ready()) {
          SendAcquire(now, p.op, op->second);
        } else {
          op->second.stage = Stage::kWaiting;
          waiting_.push_back(p.op);
          Pump(now);
        }
      }
      break;
    case Kind::kValidate:
      if (!alive) break;
      if (r.code() == wire::FENCED_OUT) {
        fenced_out_.Increment();
        const std::shared_ptr<LeaseState> lease = op->second.lease;
        if (lease->Check(now) == LossReason::kNone) CountLoss(LossReason::kFencedOut);
        if (auto h = held_.find(lease->lock()); h != held_.end() && h->second.state == lease) {
          held_.Erase(h);
        }
        LoseLease(lease, LossReason::kFencedOut);
      }
      Complete(p.op, protocol::StatusFromCode(r.code(), r.message()));
      break;
    case Kind::kWithdraw:
      break;  // the Acquire's own answer (CANCELLED, or a grant to relinquish) settles it
    case Kind::kClose:
      if (alive) Complete(p.op, absl::OkStatus());
      break;
  }
}

void ClientCore::OnOpenReply(MonoTime now, const Pending& p, const wire::Response& r) {
  if (r.code() != wire::OK) {
    session_state_ = SessionState::kNone;
    const absl::Status status = protocol::StatusFromCode(r.code(), r.message());
    const std::deque<uint64_t> waiting = waiting_;
    for (uint64_t w : waiting) Complete(w, status);
    want_session_ = false;
    return;
  }
  session_id_ = r.open_session().session_id();
  secret_ = r.open_session().secret();
  session_ttl_ = absl::Milliseconds(r.open_session().ttl_ms());
  session_deadline_ = UsableDeadline(p.t_send, session_ttl_, options_.safety_margin);
  session_state_ = SessionState::kOpen;
  renewal_ = std::make_shared<SessionRenewal>();
  // A session opened just now has lost nothing yet.
  renew_synced_ = version_ >= protocol::kRenewProtocolVersion;
  losses_ = 0;
  redial_backoff_ = absl::ZeroDuration();
  next_beat_ = now + HeartbeatInterval();
  Log(LogLevel::kInfo,
      absl::StrCat("session ", session_id_, " opened on ", options_.replicas[replica_],
                   " (TTL ", absl::FormatDuration(session_ttl_), ")"));
  Pump(now);
}

void ClientCore::OnResumeReply(MonoTime now, const Pending& p, const wire::Response& r) {
  if (r.code() == wire::SESSION_NOT_FOUND || r.code() == wire::PERMISSION_DENIED) {
    // Gone (expired, or lockd lost it), or no longer ours to drive: its locks are lost;
    // a new session is opened for whoever waits.
    LoseSession(now, LossReason::kSessionLost);
    session_state_ = SessionState::kNone;
    if (!waiting_.empty()) StartSession(now);
    return;
  }
  if (r.code() != wire::OK) {
    const absl::Status status = protocol::StatusFromCode(r.code(), r.message());
    const std::deque<uint64_t> waiting = waiting_;
    for (uint64_t w : waiting) Complete(w, status);
    // The resume is tried again on a new connection, after a pause that doubles: a lockd
    // that cannot take it now (a disk fault) is not flooded with connections.
    CloseLink(now, false, absl::ZeroDuration());
    DelayRedial(now);
    return;
  }
  session_state_ = SessionState::kOpen;
  redial_backoff_ = absl::ZeroDuration();
  Log(LogLevel::kInfo,
      absl::StrCat("session ", session_id_, " resumed on a new connection to lockd (",
                   options_.replicas[replica_], ")"));
  // A lockd that restarted may have lost the last releases it answered (ADR 0003): they
  // are given back again, with the relinquishes lost with the old connection. A lock
  // released for good gets a FENCED_OUT that lockd does not count.
  for (const Released& released : recent_releases_) {
    if (released.session != session_id_ || held_.contains(released.lock) ||
        unsettled_.contains(released.lock) || unsettled_.size() >= kMaxUnsettled) {
      continue;
    }
    unsettled_.emplace(released.lock, Unsettled{released.session, released.token});
  }
  recent_releases_.clear();
  for (auto& [lock, u] : unsettled_) {
    if (u.request == 0) SendRelinquish(now, lock, u);
  }
  next_beat_ = now;  // renew at once: the leases ran on while there was no connection
  Pump(now);
  OnTick(now);
}

void ClientCore::OnKeepAliveReply(MonoTime now, Pending& p, const wire::Response& r) {
  RecordRtt(now - p.t_send);
  absl::Status status = absl::OkStatus();
  bool answered = true;
  if (r.code() == wire::SESSION_NOT_FOUND) {
    status = protocol::StatusFromCode(r.code(), r.message());
  } else if (r.code() != wire::OK) {
    // D5: a failed exchange changes no deadline; they keep running out.
    heartbeat_failures_.Increment();
    status = protocol::StatusFromCode(r.code(), r.message());
    answered = false;
  } else if (r.keep_alive().lock_codes_size() != static_cast<int>(p.renewed.size())) {
    heartbeat_failures_.Increment();
    status = absl::UnavailableError("lockd answered KeepAlive with the wrong number of locks");
    answered = false;
  } else if (p.session == session_id_) {
    session_deadline_ = std::max(session_deadline_,
                                 UsableDeadline(p.t_send, session_ttl_, options_.safety_margin));
    for (size_t i = 0; i < p.renewed.size(); ++i) {
      const std::shared_ptr<LeaseState>& state = p.renewed[i];
      auto it = held_.find(state->lock());
      const bool ours = it != held_.end() && it->second.state == state;
      if (r.keep_alive().lock_codes(static_cast<int>(i)) != wire::OK) {
        // lockd says this token no longer holds the lock: lost at once.
        fenced_out_.Increment();
        if (ours) {
          if (state->Check(now) == LossReason::kNone) CountLoss(LossReason::kFencedOut);
          held_.Erase(it);
        }
        LoseLease(state, LossReason::kFencedOut);
        status = absl::AbortedError(absl::StrCat(LeaseName(*state), " was fenced out"));
        Log(LogLevel::kWarning,
            absl::StrCat(LeaseName(*state), " was fenced out (lockd answered its renewal FENCED_OUT)"));
        continue;
      }
      if (!ours) continue;
      Held& held = it->second;
      held.lock_deadline = std::max(
          held.lock_deadline, UsableDeadline(p.t_send, state->ttl(), options_.safety_margin));
      // Refused (and left to the sweep) if the deadline had already passed: a lease that ran
      // out stays lost even if a renewal sent before that moment succeeds afterwards.
      if (state->Extend(std::min(held.lock_deadline, session_deadline_), now)) held_.Touch(state);
    }
    // Every lease held when it was sent was named, and each one lockd had taken is lost now:
    // its count of losses is what later Renews are compared with.
    if (p.full && r.keep_alive().has_losses()) {
      renew_synced_ = true;
      losses_ = r.keep_alive().losses();
    }
    // What it named (and lockd renewed) is confirmed.
    for (const std::shared_ptr<LeaseState>& state : p.renewed) unconfirmed_.erase(state->token());
    Sweep(now);
    SetRemainingGauge(now);
  }
  AfterRenewal(now, p, status, answered);
}

void ClientCore::OnRenewReply(MonoTime now, Pending& p, const wire::Response& r) {
  RecordRtt(now - p.t_send);
  absl::Status status = absl::OkStatus();
  bool answered = true;
  const wire::RenewedSession* renewed =
      r.code() == wire::OK && r.renew().sessions_size() == 1 &&
              r.renew().sessions(0).session_id() == p.session
          ? &r.renew().sessions(0)
          : nullptr;
  if (r.code() != wire::OK) {
    // D5: a failed exchange changes no deadline; they keep running out.
    heartbeat_failures_.Increment();
    status = protocol::StatusFromCode(r.code(), r.message());
    answered = false;
  } else if (renewed == nullptr) {
    heartbeat_failures_.Increment();
    status = absl::UnavailableError("lockd answered Renew for other sessions than it named");
    answered = false;
  } else if (renewed->code() == wire::SESSION_NOT_FOUND) {
    status = protocol::StatusFromCode(renewed->code(), renewed->message());
    if (p.session == session_id_) LoseSession(now, LossReason::kSessionLost);
  } else if (renewed->code() != wire::OK) {
    heartbeat_failures_.Increment();
    status = protocol::StatusFromCode(renewed->code(), renewed->message());
    answered = false;
  } else if (p.session == session_id_) {
    session_deadline_ = std::max(session_deadline_,
                                 UsableDeadline(p.t_send, session_ttl_, options_.safety_margin));
    // A lease whose deadline has passed is lost before anything is credited: one that ran out
    // stays lost, whatever a renewal sent before that moment says.
    Sweep(now);
    for (const auto& [token, lock] : p.confirms) unconfirmed_.erase(token);
    // Leases published after it was sent are not covered by it, but their session is renewed:
    // their own deadlines are no longer cut short by its old one.
    for (const auto& [token, lock] : unconfirmed_) {
      auto h = held_.find(lock);
      if (h == held_.end() || h->second.state->token() != token) continue;
      if (h->second.state->Extend(std::min(h->second.lock_deadline, session_deadline_), now)) {
        held_.Touch(h->second.state);
      }
    }
    if (renewed->losses() == losses_) {
      // lockd took none of the session's locks since the last count this client learned: every
      // lease published before it was sent was held, and confirmed, by the session when the
      // Renew arrived, so lockd renewed it then.
      renewal_->Advance(p.t_send, session_deadline_);
    } else {
      // lockd took some: which ones, a KeepAlive naming every lease tells (at once).
      Log(LogLevel::kInfo,
          absl::StrCat("lockd counts ", renewed->losses(), " lock(s) of session ", session_id_,
                       " lost as their leases ran out, this client knew of ", losses_,
                       ": renewing every lock by name to learn which"));
      renew_synced_ = false;
    }
    // (Nothing is due that the sweep above left: deadlines only moved later since.)
    SetRemainingGauge(now);
  }
  AfterRenewal(now, p, status, answered);
  if (!renew_synced_ && session_id_ != 0 && p.session == session_id_ && !beat_in_flight_) {
    next_beat_ = now;
    OnTick(now);
  }
}

void ClientCore::SetRemainingGauge(MonoTime now) {
  const absl::Duration least = held_.EarliestDeadline() - now;
  remaining_gauge_.Set(
      held_.empty() ? 0.0 : absl::ToDoubleSeconds(std::max(least, absl::ZeroDuration())));
}

void ClientCore::AfterRenewal(MonoTime now, const Pending& p, const absl::Status& status,
                              bool answered) {
  if (p.background) HeartbeatDone(now, answered);
  if (p.op != 0) Complete(p.op, status);
  // Acquires that waited for their session's renewal go on, or learn it could not be renewed.
  for (uint64_t id : std::deque<uint64_t>(waiting_)) {
    auto it = ops_.find(id);
    if (it == ops_.end() || it->second.stage != Stage::kRenewingSession) continue;
    if (session_id_ != 0 && session_deadline_ <= now) {
      Complete(id, absl::UnavailableError(absl::StrCat(
                       "the session's lease ran out and could not be renewed: ",
                       status.ok() ? "no later renewal" : status.message())));
      continue;
    }
    it->second.stage = Stage::kWaiting;
    it->second.session_renewed = true;
  }
  if (session_id_ == 0 && !waiting_.empty() && link_ == Link::kUp &&
      session_state_ == SessionState::kNone) {
    StartSession(now);
  }
  Pump(now);
}

void ClientCore::HeartbeatDone(MonoTime now, bool answered) {
  beat_in_flight_ = false;
  const absl::Duration interval = HeartbeatInterval();
  if (answered) {
    if (beat_failing_) {
      Log(LogLevel::kInfo, absl::StrCat("heartbeat answered again after ", beat_failures_,
                                        " failed exchange(s)"));
    }
    beat_failing_ = false;
    beat_failures_ = 0;
    retry_ = kRetryFirst;
    next_beat_ = session_id_ != 0 ? now + interval : MonoTime::Max();
    return;
  }
  ++beat_failures_;
  if (!beat_failing_) {
    beat_failing_ = true;
    Log(LogLevel::kWarning,
        "heartbeat failed (no answer from lockd); retrying from 20 ms, doubling up to the period");
  }
  next_beat_ = now + std::min(retry_, interval);
  retry_ = std::min(retry_ * 2, interval);
}

void ClientCore::OnAcquireReply(MonoTime now, Pending& p, const wire::Response& r) {
  auto it = ops_.find(p.op);
  const bool granted = r.code() == wire::OK && r.acquire().granted();
  if (p.op == 0 || it == ops_.end()) {
    // Nobody waits for it (cancelled, or its wait ran out): a grant is given back at once
    // rather than left stuck until its lease runs out.
    if (granted) Relinquish(now, p.session, p.lock, r.acquire().token());
    return;
  }
  Op& op = it->second;
  if (r.code() == wire::SESSION_NOT_FOUND) {
    return Complete(p.op, absl::UnavailableError(absl::StrCat(
                              "session ", p.session, " expired on lockd: ", r.message(),
                              "; retry to open a new one")));
  }
  if (r.code() == wire::INVALID_ARGUMENT && r.acquire().token() != 0 &&
      r.acquire().lock() == op.lock && p.session == session_id_ && !held_.contains(op.lock) &&
      unsettled_.count(op.lock) == 0 && !op.released_orphan) {
    // lockd says this session holds the lock already, yet this client holds no lease of it:
    // an earlier Acquire was granted and committed while its answer was lost (its replica was
    // deposed as it committed). That grant is released, and the lock acquired anew (once), so
    // that this Acquire returns a grant made while it ran, with a token above every earlier
    // one, instead of being refused until the orphan's lease runs out.
    op.released_orphan = true;
    unsettled_[op.lock] = Unsettled{.session = p.session, .token = r.acquire().token()};
    PumpAcquire(now, p.op, op);
    return;
  }
  if (r.code() != wire::OK) return Complete(p.op, protocol::StatusFromCode(r.code(), r.message()));
  if (!granted) return Complete(p.op, absl::OkStatus());  // a try that found it held
  // D1: the lease is measured from when the Acquire was written, however long it queued.
  const uint64_t token = r.acquire().token();
  op.granted_ttl = absl::Milliseconds(r.acquire().ttl_ms());
  const MonoTime lock_deadline = UsableDeadline(p.t_send, op.granted_ttl, options_.safety_margin);
  if (session_id_ != p.session) return Publish(now, p.op, op, token, lock_deadline);
  // It queued (or lockd stalled) so long that the lease left would run out before the next
  // regular heartbeat, or would not cover a declared step: renewed before it is handed over.
  const bool late = std::min(lock_deadline, session_deadline_) - now <=
                    std::max(HeartbeatIntervalWith(op.granted_ttl), options_.costliest_step);
  if (!late) return Publish(now, p.op, op, token, lock_deadline);
  op.stage = Stage::kRenewingGrant;
  Send(now, req::KeepAlive(p.session, op.lock, token),
       Pending{.kind = Kind::kGrantRenewal, .op = p.op,
               .timeout_at = now + options_.request_timeout, .session = p.session,
               .lock = op.lock, .token = token});
}

void ClientCore::OnGrantRenewalReply(MonoTime now, Pending& p, const wire::Response* r) {
  auto it = ops_.find(p.op);
  const bool renewed = r != nullptr && r->code() == wire::OK &&
                       r->keep_alive().lock_codes_size() == 1 &&
                       r->keep_alive().lock_codes(0) == wire::OK;
  if (r != nullptr && r->code() == wire::OK && p.session == session_id_) {
    session_deadline_ = std::max(session_deadline_,
                                 UsableDeadline(p.t_send, session_ttl_, options_.safety_margin));
  }
  if (p.op == 0 || it == ops_.end() || !renewed) {
    Relinquish(now, p.session, p.lock, p.token);
    if (p.op == 0 || it == ops_.end()) return;
    return Complete(p.op, absl::UnavailableError(absl::StrCat(
                              "lock \"", p.lock,
                              "\" was granted after a long wait and its lease could not be "
                              "renewed: ",
                              r == nullptr ? "no answer" : (r->code() == wire::OK ? "fenced out" : r->message()))));
  }
  Publish(now, p.op, it->second, p.token,
          UsableDeadline(p.t_send, it->second.granted_ttl, options_.safety_margin));
}

// ---- time ----

void ClientCore::Sweep(MonoTime now) {
  while (std::shared_ptr<LeaseState> state = held_.NextDue(now)) {
    const LossReason reason = state->Check(now);
    if (reason == LossReason::kNone) continue;  // (not due: NextDue says only what is)
    held_.Erase(held_.find(state->lock()));
    if (reason != LossReason::kDeadlinePassed) continue;  // told elsewhere
    CountLoss(reason);
    LoseLease(state, reason);
    Log(LogLevel::kWarning,
        absl::StrCat(LeaseName(*state), " lost: the client's deadline for it passed"));
    // The client gave it up at its deadline; tell lockd so that waiters need not wait for its
    // own expiry. A stale answer is expected and harmless, and not counted.
    Relinquish(now, session_id_, state->lock(), state->token());
  }
}

void ClientCore::OnTick(MonoTime now) {
  // Requests that ran out of time.
  for (uint64_t rid : pending_.Due(now)) {
    auto it = pending_.find(rid);
    if (it == pending_.end()) continue;  // the link went with an earlier one
    Pending& p = it->second;
    const bool alive = p.op != 0 && ops_.contains(p.op);
    switch (p.kind) {
      case Kind::kKeepAlive: {
        // A renewal that timed out took at least its timeout: it counts as a round trip of
        // that much (ADR-006 6.5 is about exactly that slow tail), though it extends nothing.
        RecordRtt(std::max(p.timeout_at - p.t_send, now - p.t_send));
        heartbeat_failures_.Increment();
        Pending copy = std::move(p);
        pending_.Erase(it);
        RememberLate(rid, copy.session);
        if (alive) {
          Complete(copy.op, absl::DeadlineExceededError(absl::StrCat(
                                "lockd did not answer the heartbeat within ",
                                absl::FormatDuration(copy.timeout_at - copy.t_send))));
        }
        if (copy.background) HeartbeatDone(now, false);
        // A silent replica: try the others (see KeepAliveTimeout).
        if (options_.replicas.size() > 1) {
          CloseLink(now, true, copy.timeout_at - copy.t_send);
        } else {
          for (uint64_t id : std::deque<uint64_t>(waiting_)) {
            auto w = ops_.find(id);
            if (w != ops_.end() && w->second.stage == Stage::kRenewingSession) {
              if (session_deadline_ <= now) {
                Complete(id, absl::UnavailableError(
                                 "the session's lease ran out and could not be renewed: "
                                 "lockd did not answer"));
              } else {
                w->second.stage = Stage::kWaiting;
                w->second.session_renewed = true;
              }
            }
          }
          Pump(now);
        }
        break;
      }
      case Kind::kAcquire:
        if (alive) {
          Complete(p.op, absl::DeadlineExceededError(absl::StrCat(
                             "lockd did not answer the acquire of \"", p.lock, "\" in time")));
        }
        // Kept without an operation: a grant that comes after all is given back.
        p.op = 0;
        pending_.SetTimeout(it, MonoTime::Max());
        break;
      case Kind::kGrantRenewal: {
        Pending copy = std::move(p);
        pending_.Erase(it);
        RememberLate(rid, copy.session);
        OnGrantRenewalReply(now, copy, nullptr);
        break;
      }
      case Kind::kRelease:
      case Kind::kSettle:
        if (alive) {
          Complete(p.op,
                   p.kind == Kind::kRelease
                       ? absl::DeadlineExceededError("lockd did not answer the release in time")
                       : absl::UnavailableError(absl::StrCat(
                             "lock \"", p.lock, "\" was given up earlier (token ", p.token,
                             ") and lockd did not confirm it in time")));
        }
        // Its answer, if it comes, settles the lock; if not, the next acquire of the name
        // releases it again first.
        if (p.kind == Kind::kRelease && p.session == session_id_ &&
            (unsettled_.contains(p.lock) || unsettled_.size() < kMaxUnsettled)) {
          unsettled_[p.lock] = Unsettled{p.session, p.token, rid};
        }
        p.kind = Kind::kRelinquish;
        p.op = 0;
        pending_.SetTimeout(it, MonoTime::Max());
        break;
      case Kind::kValidate:
      case Kind::kClose: {
        const uint64_t op = p.op;
        const Kind kind = p.kind;
        RememberLate(rid, p.session);
        pending_.Erase(it);
        if (alive) {
          Complete(op, kind == Kind::kClose
                           ? absl::OkStatus()
                           : absl::DeadlineExceededError("lockd did not answer Validate in time"));
        }
        break;
      }
      case Kind::kOpen:
      case Kind::kResume: {
        const std::deque<uint64_t> waiting = waiting_;
        for (uint64_t w : waiting) {
          Complete(w, absl::UnavailableError(absl::StrCat(
                          "lockd did not answer ",
                          p.kind == Kind::kOpen ? "OpenSession" : "ResumeSession", " in time")));
        }
        want_session_ = false;
        CloseLink(now, false, absl::ZeroDuration());
        DelayRedial(now);
        break;
      }
      case Kind::kUnawaitedRelease:
      case Kind::kRelinquish:
      case Kind::kWithdraw:
        break;
    }
  }
  Sweep(now);
  if (Ready() && !beat_in_flight_ && now >= next_beat_) SendKeepAlive(now, 0, true);
  if (!Ready()) MaybeDial(now);
}

MonoTime ClientCore::NextWakeup() const {
  MonoTime next = MonoTime::Max();
  next = std::min({next, pending_.NextTimeout(), held_.EarliestDeadline()});
  if (Ready() && !beat_in_flight_) next = std::min(next, next_beat_);
  if (link_ == Link::kDown && (want_session_ || session_id_ != 0 || !waiting_.empty())) {
    next = std::min(next, redial_at_);
  }
  return next;
}

void ClientCore::RememberReleased(const Pending& p) {
  if (p.session == 0 || p.session != session_id_) return;
  if (recent_releases_.size() >= kMaxRecentReleases) recent_releases_.pop_front();
  recent_releases_.push_back(Released{p.session, p.lock, p.token});
}

void ClientCore::RememberLate(uint64_t request_id, uint64_t session) {
  if (session == 0) return;
  if (late_.size() >= kMaxLate) late_.pop_front();
  late_.emplace_back(request_id, session);
}

void ClientCore::RecordRtt(absl::Duration rtt) {
  heartbeat_rtt_.Observe(absl::ToDoubleSeconds(rtt));
  rtts_[rtt_count_ % rtts_.size()] = rtt;
  ++rtt_count_;
  const absl::Duration p99 = RttP99();
  // ADR-006 6.5: revisit the margin once the p99 exceeds a third of lease x margin.
  const absl::Duration lease = std::min(session_ttl_, options_.default_lock_ttl);
  const absl::Duration threshold = lease * options_.safety_margin / 3;
  revisit_gauge_.Set(p99 > threshold ? 1.0 : 0.0);
  if (p99 > threshold && !revisit_warned_) {
    revisit_warned_ = true;
    Log(LogLevel::kWarning,
        absl::StrCat("heartbeat RTT p99 ", absl::FormatDuration(p99),
                     " exceeds a third of lease x margin (", absl::FormatDuration(threshold),
                     "): the safety margin ", options_.safety_margin,
                     " no longer covers observed jitter; raise it or shorten the heartbeat "
                     "period (ADR-006 6.5)"));
  }
}

absl::Duration ClientCore::RttP99() const {
  const size_t n = std::min(rtt_count_, rtts_.size());
  if (n == 0) return absl::ZeroDuration();
  std::array<absl::Duration, 128> sorted = rtts_;
  const size_t k = std::min(n - 1, static_cast<size_t>(0.99 * static_cast<double>(n)));
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(k),
                   sorted.begin() + static_cast<long>(n));
  return sorted[k];
}

}  // namespace fencelock::client_core
