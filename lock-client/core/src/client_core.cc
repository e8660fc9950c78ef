// ClientCore (lock-client/core/client_core.h): the operations a caller starts, sending, and
// moving operations along. The link and the session are in client_core_link.cc, replies and
// time in client_core_replies.cc.
#include "lock-client/core/client_core.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "protocol/codes.h"
#include "protocol/requests.h"
#include "protocol/version.h"
#include "client_core_internal.h"

namespace fencelock {

const char* LossReasonName(LossReason reason) {
  switch (reason) {
    case LossReason::kNone:
      return "none";
    case LossReason::kDeadlinePassed:
      return "deadline_passed";
    case LossReason::kFencedOut:
      return "fenced_out";
    case LossReason::kSessionLost:
      return "session_lost";
    case LossReason::kReleased:
      return "released";
    case LossReason::kEmptyHandle:
      return "empty_handle";
    case LossReason::kInsufficientLease:
      return "insufficient_lease";
    case LossReason::kUnconfirmed:
      return "unconfirmed";
  }
  return "unknown";
}

namespace client_core {

namespace req = protocol::request;
using internal::kRetryFirst;
using internal::LeaseName;

uint64_t ClientCore::NextCoreId() {
  static std::atomic<uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed) + 1;
}

ClientCore::ClientCore(CoreOptions options)
    : options_(std::move(options)),
      session_ttl_(options_.session_ttl),
      metrics_(options_.metrics != nullptr ? options_.metrics
                                           : std::make_shared<metrics::Registry>()),
      // Not lockd's lock_fenced_out_total (which fence 1 counts): what this client was told.
      fenced_out_(metrics_->GetCounter(
          "lock_client_fenced_out_total",
          "FENCED_OUT answers this client received: a token of its that no longer held its lock")),
      heartbeat_failures_(metrics_->GetCounter("lock_heartbeat_failures_total",
                                               "Heartbeats that failed or timed out (D5)")),
      heartbeat_rtt_(metrics_->GetHistogram(
          "lock_heartbeat_rtt_seconds",
          "Heartbeat round trip, from t_send to the reply; one that timed out counts as its "
          "timeout",
          metrics::LatencyBuckets())),
      remaining_gauge_(metrics_->GetGauge(
          "lock_lease_remaining_seconds",
          "Least lease left among held locks at the last heartbeat (0 with none held)")),
      revisit_gauge_(metrics_->GetGauge(
          "lock_margin_revisit",
          "1 while the heartbeat RTT p99 exceeds a third of lease x margin (ADR-006 6.5)")) {
  for (LossReason r :
       {LossReason::kDeadlinePassed, LossReason::kFencedOut, LossReason::kSessionLost}) {
    lease_lost_[static_cast<size_t>(r)] =
        &metrics_->GetCounter("lock_lease_lost_total",
                              "Locks the client stopped holding, by reason",
                              {{"reason", LossReasonName(r)}});
  }
  retry_ = kRetryFirst;
}

// ---- operations ----

uint64_t ClientCore::NewOp(OpKind kind) {
  const uint64_t id = ++next_op_;
  ops_.emplace(id, Op{.kind = kind});
  return id;
}

void ClientCore::Complete(uint64_t op, absl::Status status, std::shared_ptr<LeaseState> lease) {
  if (ops_.erase(op) == 0) return;
  std::erase(waiting_, op);
  actions_.completions.push_back(
      Completion{.op = op, .status = std::move(status), .lease = std::move(lease)});
}

void ClientCore::Log(LogLevel level, std::string message) {
  actions_.logs.push_back(LogLine{level, std::move(message)});
}

Actions ClientCore::TakeActions() { return std::exchange(actions_, Actions{}); }

uint64_t ClientCore::Start(MonoTime now) {
  const uint64_t id = NewOp(OpKind::kStart);
  want_session_ = true;
  waiting_.push_back(id);
  Pump(now);
  return id;
}

uint64_t ClientCore::Acquire(MonoTime now, const std::string& lock, absl::Duration wait,
                             absl::Duration ttl, LockMode mode,
                             std::optional<absl::Duration> lock_delay) {
  const uint64_t id = NewOp(OpKind::kAcquire);
  const char* negative = wait < absl::ZeroDuration()  ? "wait"
                         : ttl < absl::ZeroDuration() ? "ttl"
                         : lock_delay.value_or(absl::ZeroDuration()) < absl::ZeroDuration()
                             ? "lock_delay"
                             : nullptr;
  if (negative != nullptr) {
    Complete(id, absl::InvalidArgumentError(absl::StrCat(negative, " must not be negative")));
    return id;
  }
  Op& op = ops_.at(id);
  op.lock = lock;
  op.wait = wait;
  op.ttl = ttl == absl::ZeroDuration() ? options_.default_lock_ttl : ttl;
  op.mode = mode;
  op.lock_delay = lock_delay;
  want_session_ = true;
  waiting_.push_back(id);
  Pump(now);
  return id;
}

bool ClientCore::Cancel(MonoTime now, uint64_t id) {
  auto it = ops_.find(id);
  if (it == ops_.end() || it->second.kind != OpKind::kAcquire) return false;
  Op& op = it->second;
  if (op.stage == Stage::kSent && Ready() && op.session == session_id_ &&
      version_ >= protocol::kWithdrawProtocolVersion) {
    // An older lockd does not know the request (it would close the connection): its waiter
    // stays until its wait runs out, and a grant that comes is relinquished.
    Send(now, req::WithdrawAcquire(op.session, op.request),
         Pending{.kind = Kind::kWithdraw, .session = op.session});
  }
  // Its request, if any, stays pending without an operation: a grant that crosses is
  // relinquished when it arrives.
  Complete(id, absl::CancelledError(absl::StrCat("the acquire of \"", op.lock, "\" was cancelled")));
  return true;
}

uint64_t ClientCore::Release(MonoTime now, const std::shared_ptr<LeaseState>& lease, bool await) {
  const uint64_t id = NewOp(OpKind::kRelease);
  if (lease == nullptr) {
    Complete(id, absl::InvalidArgumentError("empty lock handle"));
    return id;
  }
  if (lease->owner() != id_) {
    Complete(id, absl::InvalidArgumentError(absl::StrCat(
                     LeaseName(*lease),
                     " was acquired through another Client: release it through that one")));
    return id;
  }
  bool was_held = false;
  if (auto it = held_.find(lease->lock()); it != held_.end() && it->second.state == lease) {
    held_.Erase(it);
    unconfirmed_.erase(lease->token());
    was_held = true;
  }
  if (const LossReason lost = lease->Check(now); lost != LossReason::kNone) {
    // Already lost: nothing may be done under this token any more, so this is a clean-up, not
    // a stale request. If only the client's deadline passed, lockd may still hold it for us:
    // give it back so that waiters need not wait for lockd's own expiry.
    if (lost == LossReason::kDeadlinePassed) {
      if (was_held) LoseLease(lease, LossReason::kDeadlinePassed);
      Relinquish(now, session_id_, lease->lock(), lease->token());
    }
    Complete(id, absl::AbortedError(absl::StrCat(LeaseName(*lease),
                                                 " was already lost before release: ",
                                                 LossReasonName(lost))));
    return id;
  }
  lease->MarkLost(LossReason::kReleased);
  wire::Request request = req::Release(session_id_, lease->lock(), lease->token());
  if (!Ready()) {
    // Given back when the session is resumed on a new connection.
    Relinquish(now, session_id_, lease->lock(), lease->token());
    Complete(id, absl::UnavailableError(absl::StrCat(
                     "not connected to lockd: ", LeaseName(*lease),
                     " is given back once the session is resumed, or freed at its TTL")));
    return id;
  }
  if (!await) {
    deferred_.push_back(std::move(request));
    // Bounded: a caller that releases many without another request sends them now.
    if (deferred_.size() >= 64) {
      wire::Request last = std::move(deferred_.back());
      deferred_.pop_back();
      Send(now, std::move(last),
           Pending{.kind = Kind::kUnawaitedRelease, .session = session_id_,
                   .lock = lease->lock(), .token = lease->token()});
    }
    Complete(id, absl::OkStatus());
    return id;
  }
  ops_.at(id).stage = Stage::kSent;
  Send(now, std::move(request),
       Pending{.kind = Kind::kRelease, .op = id, .timeout_at = now + options_.request_timeout,
               .session = session_id_, .lock = lease->lock(), .token = lease->token()});
  return id;
}

uint64_t ClientCore::Renew(MonoTime now) {
  const uint64_t id = NewOp(OpKind::kRenew);
  want_session_ = true;
  waiting_.push_back(id);
  Pump(now);
  return id;
}

uint64_t ClientCore::Validate(MonoTime now, const std::shared_ptr<LeaseState>& lease) {
  const uint64_t id = NewOp(OpKind::kValidate);
  if (lease == nullptr || lease->owner() != id_) {
    Complete(id, absl::InvalidArgumentError(
                     lease == nullptr ? "empty lock handle"
                                      : absl::StrCat(LeaseName(*lease),
                                                     " was acquired through another Client")));
    return id;
  }
  if (const LossReason lost = lease->Check(now); lost != LossReason::kNone) {
    Complete(id, absl::AbortedError(absl::StrCat(LeaseName(*lease), " is no longer held: ",
                                                 LossReasonName(lost))));
    return id;
  }
  ops_.at(id).lease = lease;
  waiting_.push_back(id);
  Pump(now);
  return id;
}

uint64_t ClientCore::Close(MonoTime now) {
  const uint64_t id = NewOp(OpKind::kClose);
  for (auto& [name, held] : held_) held.state->MarkLost(LossReason::kReleased);
  held_.Clear();
  std::vector<uint64_t> others;
  for (const auto& [op, o] : ops_) {
    if (op != id) others.push_back(op);
  }
  for (uint64_t op : others) {
    Complete(op, absl::CancelledError("the client was closed (its Client destroyed)"));
  }
  want_session_ = false;
  unsettled_.clear();  // the session's locks go with it
  recent_releases_.clear();
  deferred_.clear();
  if (session_id_ == 0 || !Ready()) {
    session_id_ = 0;
    Complete(id, absl::OkStatus());
    return id;
  }
  Send(now, req::Close(session_id_),
       Pending{.kind = Kind::kClose, .op = id, .timeout_at = now + options_.request_timeout,
               .session = session_id_});
  session_id_ = 0;
  secret_.clear();
  session_state_ = SessionState::kNone;
  session_deadline_ = MonoTime::Min();
  next_beat_ = MonoTime::Max();
  return id;
}

// ---- sending ----

uint64_t ClientCore::Send(MonoTime now, wire::Request request, Pending pending) {
  auto next_id = [this] {
    return options_.next_request_id ? options_.next_request_id() : ++own_request_ids_;
  };
  for (wire::Request& release : deferred_) {
    const uint64_t rid = next_id();
    release.set_request_id(rid);
    pending_.Emplace(rid, Pending{.kind = Kind::kUnawaitedRelease, .t_send = now,
                                  .session = release.release().session_id(),
                                  .lock = release.release().lock(),
                                  .token = release.release().token()});
    actions_.sends.push_back(Outgoing{conn_, std::move(release)});
  }
  deferred_.clear();
  const uint64_t rid = next_id();
  request.set_request_id(rid);
  pending.t_send = now;  // D2: the request is written after this call, never before
  pending_.Emplace(rid, std::move(pending));
  actions_.sends.push_back(Outgoing{conn_, std::move(request)});
  return rid;
}

absl::Duration ClientCore::HeartbeatIntervalWith(absl::Duration ttl) const {
  if (options_.heartbeat_interval > absl::ZeroDuration()) return options_.heartbeat_interval;
  const absl::Duration shortest = std::min(
      {ttl, session_id_ != 0 ? session_ttl_ : options_.session_ttl, held_.ShortestTtl()});
  absl::Duration interval = shortest / 3;
  // Right before a heartbeat a lease has usable − interval left. Keep that above the costliest
  // declared step, with room for one more interval, so that D4 does not refuse a step on a
  // healthy client merely because the next renewal is due.
  const absl::Duration slack =
      shortest * (1.0 - options_.safety_margin) - options_.costliest_step;
  if (slack > absl::ZeroDuration()) interval = std::min(interval, slack / 2);
  return std::max(interval, absl::Milliseconds(10));
}

absl::Duration ClientCore::KeepAliveTimeout() const {
  // With a list of replicas, a renewal unanswered for half a heartbeat period means its lockd
  // fell silent (frozen, cut off from its clients, or held up by its store) while another may
  // serve by now: try the others instead of waiting out the request timeout on it (it is tried
  // last, until it answers in time again). Half a period: a renewal sent a period after the
  // last answered one is then given up 1.5 periods (half a TTL) into a usable lease of 0.7 TTL,
  // leaving a fifth of the TTL to resume elsewhere. Never under 1 s: a serving lockd whose
  // commits are merely slow must not be mistaken for a frozen one.
  if (options_.replicas.size() <= 1) return options_.request_timeout;
  return std::min(options_.request_timeout, std::max(HeartbeatInterval() / 2, absl::Seconds(1)));
}

// ---- moving operations ----

void ClientCore::Pump(MonoTime now) {
  if (!Ready()) {
    if (link_ == Link::kUp && session_state_ == SessionState::kNone && !waiting_.empty()) {
      StartSession(now);
    }
    MaybeDial(now);
    return;
  }
  const std::deque<uint64_t> waiting = waiting_;
  for (uint64_t id : waiting) {
    auto it = ops_.find(id);
    if (it == ops_.end() || !Ready()) continue;
    Op& op = it->second;
    switch (op.kind) {
      case OpKind::kStart:
        Complete(id, absl::OkStatus());
        break;
      case OpKind::kAcquire:
        PumpAcquire(now, id, op);
        break;
      case OpKind::kRenew:
        std::erase(waiting_, id);
        SendKeepAlive(now, id, false);
        break;
      case OpKind::kValidate: {
        std::erase(waiting_, id);
        op.stage = Stage::kSent;
        // As its holder: lockd also checks that this connection's session holds the lock.
        Send(now, req::Validate(op.lease->lock(), op.lease->token(), session_id_),
             Pending{.kind = Kind::kValidate, .op = id,
                     .timeout_at = now + options_.request_timeout, .session = session_id_,
                     .lock = op.lease->lock(), .token = op.lease->token()});
        break;
      }
      case OpKind::kRelease:
      case OpKind::kClose:
        break;
    }
  }
}

void ClientCore::PumpAcquire(MonoTime now, uint64_t id, Op& op) {
  if (op.stage == Stage::kRenewingSession) return;
  if (SessionLeaseShort(now) && !op.session_renewed) {
    // Our deadline for the session ran out, or so nearly that it would not cover a declared
    // step (heartbeats failed, or lockd or this process stalled), while lockd may still hold
    // it: a grant now would be lost, or refused its first step, the moment it arrived. Renew
    // first, measured from that send; if lockd says the session is gone, a new one is opened.
    op.stage = Stage::kRenewingSession;
    if (!beat_in_flight_) SendKeepAlive(now, 0, true);
    return;
  }
  std::erase(waiting_, id);
  if ((op.mode != LockMode::kExclusive || op.lock_delay.has_value()) &&
      version_ < protocol::kSharedLockProtocolVersion) {
    // An older lockd would read the Acquire without its mode: an exclusive grant the caller
    // did not ask for, or no delay. Refused here, unsent.
    Complete(id, absl::FailedPreconditionError(absl::StrCat(
                     "lockd speaks protocol version ", version_, "; ",
                     op.mode == LockMode::kShared ? "a shared lock" : "a lock delay", " needs ",
                     protocol::kSharedLockProtocolVersion, " (upgrade lockd)")));
    return;
  }
  if (auto u = unsettled_.find(op.lock); u != unsettled_.end()) {
    if (u->second.session != session_id_) {
      unsettled_.erase(u);  // that session is gone, and its locks with it
    } else {
      // This client gave the lock up earlier and cannot know lockd heard (the relinquish may
      // have been lost with its connection): lockd would refuse the acquire, since the session
      // still holds it. Release it again and wait for the answer first.
      op.stage = Stage::kSettling;
      u->second.request = Send(
          now, req::Release(session_id_, op.lock, u->second.token, /*relinquish=*/true),
          Pending{.kind = Kind::kSettle, .op = id, .timeout_at = now + options_.request_timeout,
                  .session = session_id_, .lock = op.lock, .token = u->second.token});
      return;
    }
  }
  SendAcquire(now, id, op);
}

void ClientCore::SendAcquire(MonoTime now, uint64_t id, Op& op) {
  op.stage = Stage::kSent;
  op.session = session_id_;
  const wire::LockMode mode = op.mode == LockMode::kShared ? wire::SHARED : wire::EXCLUSIVE;
  op.request = Send(now, req::Acquire(session_id_, op.lock, op.wait, op.ttl, mode, op.lock_delay),
                    Pending{.kind = Kind::kAcquire, .op = id,
                            .timeout_at = now + op.wait + options_.request_timeout,
                            .session = session_id_, .lock = op.lock});
}

void ClientCore::SendKeepAlive(MonoTime now, uint64_t op, bool background) {
  Sweep(now);
  Pending p{.kind = Kind::kKeepAlive, .op = op, .timeout_at = now + KeepAliveTimeout(),
            .session = session_id_, .background = background};
  // Grants released or lost since they were published: nothing to confirm.
  for (auto it = unconfirmed_.begin(); it != unconfirmed_.end();) {
    auto h = held_.find(it->second);
    const bool held = h != held_.end() && h->second.state->token() == it->first;
    it = held ? std::next(it) : unconfirmed_.erase(it);
  }
  wire::Request request;
  if (op == 0 && renew_synced_ && version_ >= protocol::kRenewProtocolVersion) {
    // ADR 0014: the session and all its confirmed locks, naming only the grants it confirms
    // (those published since the last answered renewal). A caller's Renew() names every lock,
    // so that its answer says which (if any) was fenced out.
    request = req::Renew({session_id_});
    auto* renewal = request.mutable_renew()->mutable_sessions(0);
    for (const auto& [token, lock] : unconfirmed_) {
      auto* ref = renewal->add_confirm();
      ref->set_lock(lock);
      ref->set_token(token);
      p.confirms.emplace_back(token, lock);
    }
    p.renew_all = true;
  } else {
    request = req::KeepAlive(session_id_);
    p.full = true;
    for (const auto& [name, held] : held_) {
      req::AddLock(request, name, held.state->token());
      p.renewed.push_back(held.state);
    }
  }
  if (background) beat_in_flight_ = true;
  if (op != 0) {
    Op& o = ops_.at(op);
    o.stage = Stage::kHeartbeat;
    ++o.attempts;
  }
  Send(now, std::move(request), std::move(p));
}

void ClientCore::Relinquish(MonoTime now, uint64_t session, const std::string& lock,
                            uint64_t token) {
  if (session == 0 || session != session_id_) return;  // gone with its session
  auto it = unsettled_.find(lock);
  if (it == unsettled_.end()) {
    // Bounded: past kMaxUnsettled a lost relinquish is left to lockd's own expiry.
    if (unsettled_.size() >= kMaxUnsettled) return;
    it = unsettled_.emplace(lock, Unsettled{session, token}).first;
  } else {
    it->second = Unsettled{session, token};
  }
  if (Ready()) SendRelinquish(now, lock, it->second);
}

void ClientCore::SendRelinquish(MonoTime now, const std::string& lock, Unsettled& u) {
  // Release.relinquish: no answer is awaited, and a stale token is not counted as fenced out
  // by lockd. lockd's answer settles it; if it never comes, the next acquire of this name
  // releases again first, and a new connection sends it again after the resume.
  u.request = Send(now, req::Release(u.session, lock, u.token, /*relinquish=*/true),
                   Pending{.kind = Kind::kRelinquish, .session = u.session, .lock = lock,
                           .token = u.token});
}

void ClientCore::Publish(MonoTime now, uint64_t id, Op& op, uint64_t token,
                         MonoTime lock_deadline) {
  if (session_id_ != op.session) {
    Complete(id, absl::UnavailableError(absl::StrCat(
                     "the session was lost while \"", op.lock, "\" was being acquired")));
    return;
  }
  // A Renew covers it once one sent from now on has confirmed it to lockd.
  auto state = std::make_shared<LeaseState>(
      op.lock, token, op.granted_ttl, std::min(lock_deadline, session_deadline_), id_, op.mode,
      renewal_, op.granted_ttl * (1.0 - options_.safety_margin), now);
  if (state->Check(now) != LossReason::kNone) {
    // Its lease ran out before it could be handed over (a renewal that took longer than the
    // usable lease): nobody may use it.
    Relinquish(now, op.session, op.lock, token);
    Complete(id, absl::UnavailableError(absl::StrCat(
                     "lock \"", op.lock, "\" was granted, but its lease ran out before use")));
    return;
  }
  held_.Put(op.lock, Held{state, lock_deadline});
  // On an older lockd nothing is confirmed (a newer one's first heartbeat names every lock).
  if (version_ >= protocol::kRenewProtocolVersion) unconfirmed_.emplace(token, op.lock);
  // A lock with a shorter TTL than those held so far shortens the period from now on.
  if (!beat_in_flight_) next_beat_ = std::min(next_beat_, now + HeartbeatInterval());
  Complete(id, absl::OkStatus(), std::move(state));
}

}  // namespace client_core
}  // namespace fencelock
