#include "lock-client/core/client_core.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "protocol/codes.h"
#include "protocol/requests.h"
#include "protocol/version.h"

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
namespace {

namespace req = protocol::request;

// After a failed exchange or dial round the next try comes sooner than a period, from here
// doubling up to the period: leases are renewed as soon as lockd answers again.
constexpr absl::Duration kRetryFirst = absl::Milliseconds(20);

std::string LeaseName(const LeaseState& state) {
  return absl::StrCat("lock \"", state.lock(), "\" (token ", state.token(), ")");
}

// The reason a lease was lost, without looking at its deadline; kNone while it is not marked.
LossReason MarkedReason(const LeaseState& state) {
  const LossReason r = state.Check(MonoTime::Min());
  return r == LossReason::kDeadlinePassed && state.deadline() != MonoTime::Min()
             ? LossReason::kNone
             : r;
}

}  // namespace

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
    held_.erase(it);
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
  held_.clear();
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
    pending_.emplace(rid, Pending{.kind = Kind::kUnawaitedRelease, .t_send = now,
                                  .session = release.release().session_id(),
                                  .lock = release.release().lock(),
                                  .token = release.release().token()});
    actions_.sends.push_back(Outgoing{conn_, std::move(release)});
  }
  deferred_.clear();
  const uint64_t rid = next_id();
  request.set_request_id(rid);
  pending.t_send = now;  // D2: the request is written after this call, never before
  pending_.emplace(rid, std::move(pending));
  actions_.sends.push_back(Outgoing{conn_, std::move(request)});
  return rid;
}

absl::Duration ClientCore::HeartbeatIntervalWith(absl::Duration ttl) const {
  if (options_.heartbeat_interval > absl::ZeroDuration()) return options_.heartbeat_interval;
  absl::Duration shortest = std::min(ttl, session_id_ != 0 ? session_ttl_ : options_.session_ttl);
  for (const auto& [name, held] : held_) shortest = std::min(shortest, held.state->ttl());
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

// ---- the link ----

void ClientCore::MaybeDial(MonoTime now) {
  if (link_ != Link::kDown) return;
  const bool needed = want_session_ || session_id_ != 0 || !waiting_.empty();
  if (!needed || now < redial_at_) return;
  // The replica that answered last first, then the others in order; one that fell silent
  // comes last, with no more than the silence it was abandoned for: a frozen one costs
  // little, and one that was only slow is back once it answers in time again.
  const size_t n = options_.replicas.size();
  const size_t first = preferred_ < n ? preferred_ : 0;
  round_.clear();
  for (size_t k = 0; k < n; ++k) {
    if ((first + k) % n != silent_) round_.push_back((first + k) % n);
  }
  if (silent_ < n) round_.push_back(silent_);
  round_pos_ = 0;
  round_give_up_ = now + options_.connect_timeout;
  round_failures_.clear();
  DialNext(now);
}

void ClientCore::DialNext(MonoTime now) {
  const size_t i = round_[round_pos_];
  absl::Duration share =
      std::max((round_give_up_ - now) / static_cast<int64_t>(round_.size() - round_pos_),
               absl::Milliseconds(1));
  if (i == silent_) share = std::min(share, silent_timeout_);
  link_ = Link::kDialing;
  actions_.dial = Dial{.replica = i, .address = options_.replicas[i], .timeout = share};
}

void ClientCore::OnDialed(MonoTime now, size_t replica, uint64_t conn, uint32_t version) {
  if (link_ != Link::kDialing || round_pos_ >= round_.size() || round_[round_pos_] != replica) {
    actions_.close.push_back(conn);  // not asked for (any more)
    return;
  }
  link_ = Link::kUp;
  conn_ = conn;
  replica_ = replica;
  version_ = version;
  preferred_ = replica;
  silent_ = SIZE_MAX;
  StartSession(now);
}

void ClientCore::OnDialFailed(MonoTime now, size_t replica, const absl::Status& status,
                              const std::string& leader) {
  if (link_ != Link::kDialing || round_pos_ >= round_.size() || round_[round_pos_] != replica) {
    return;
  }
  // A bad address or no common version is no better on another try.
  if (absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status) ||
      options_.replicas.size() == 1) {
    return RoundFailed(now, status);
  }
  round_failures_.push_back(std::string(status.message()));
  // A standby named the serving replica: that one next, if it is one of ours and not tried yet
  // (a redirect never leads outside the configured list).
  if (!leader.empty()) {
    auto named = std::find_if(round_.begin() + static_cast<long>(round_pos_) + 1, round_.end(),
                              [&](size_t j) { return options_.replicas[j] == leader && j != silent_; });
    if (named != round_.end()) {
      std::rotate(round_.begin() + static_cast<long>(round_pos_) + 1, named, named + 1);
    }
  }
  if (++round_pos_ < round_.size()) return DialNext(now);
  RoundFailed(now, absl::UnavailableError(
                       absl::StrCat("no lockd replica answered: ", absl::StrJoin(round_failures_, "; "))));
}

void ClientCore::RoundFailed(MonoTime now, const absl::Status& status) {
  link_ = Link::kDown;
  round_.clear();
  // Whoever waits for the link learns why now; the heartbeat (for a session that lockd may
  // still keep) tries again soon.
  const std::deque<uint64_t> waiting = waiting_;
  for (uint64_t op : waiting) Complete(op, status);
  want_session_ = false;
  DelayRedial(now);
  if (session_id_ != 0 && !beat_failing_) {
    beat_failing_ = true;
    Log(LogLevel::kWarning, absl::StrCat("heartbeat failed (", status.ToString(),
                                         "); retrying from 20 ms, doubling up to the period"));
  }
}

void ClientCore::DelayRedial(MonoTime now) {
  redial_backoff_ = redial_backoff_ == absl::ZeroDuration()
                        ? kRetryFirst
                        : std::min(redial_backoff_ * 2, HeartbeatInterval());
  redial_at_ = now + redial_backoff_;
}

void ClientCore::CloseLink(MonoTime now, bool abandon, absl::Duration silence) {
  if (link_ != Link::kUp) return;
  actions_.close.push_back(conn_);
  if (abandon && options_.replicas.size() > 1) {
    silent_ = replica_;
    silent_timeout_ = silence;
    preferred_ = (replica_ + 1) % options_.replicas.size();
  }
  LinkLost(now);
}

void ClientCore::OnDisconnected(MonoTime now, uint64_t conn) {
  if (link_ != Link::kUp || conn != conn_) return;
  LinkLost(now);
}

void ClientCore::LinkLost(MonoTime now) {
  link_ = Link::kDown;
  conn_ = 0;
  version_ = 0;
  session_state_ = SessionState::kNone;
  // Releases that were to go with the next request are given back after the resume instead.
  for (const wire::Request& release : deferred_) {
    Relinquish(now, release.release().session_id(), release.release().lock(),
               release.release().token());
  }
  deferred_.clear();
  // Every request in flight failed: none of them extends anything (D5).
  std::map<uint64_t, Pending> pending = std::exchange(pending_, {});
  bool beat_failed = false;
  for (auto& [rid, p] : pending) {
    auto op = ops_.find(p.op);
    const bool alive = p.op != 0 && op != ops_.end();
    switch (p.kind) {
      case Kind::kOpen:
      case Kind::kResume:
      case Kind::kWithdraw:
        break;
      case Kind::kKeepAlive:
        heartbeat_failures_.Increment();
        if (p.background) {
          beat_in_flight_ = false;
          beat_failed = true;
        } else if (alive && op->second.attempts < 2) {
          // The connection turned out to be dead: once more on the next one, as a new
          // exchange with its own t_send.
          op->second.stage = Stage::kWaiting;
          waiting_.push_back(p.op);
        } else if (alive) {
          Complete(p.op, absl::UnavailableError("the connection to lockd was lost"));
        }
        break;
      case Kind::kAcquire:
        if (alive) {
          Complete(p.op, absl::UnavailableError(absl::StrCat(
                             "the connection to lockd was lost while acquiring \"", p.lock, "\"")));
        }
        break;
      case Kind::kGrantRenewal:
        Relinquish(now, p.session, p.lock, p.token);
        if (alive) {
          Complete(p.op, absl::UnavailableError(absl::StrCat(
                             "lock \"", p.lock,
                             "\" was granted after a long wait and its lease could not be "
                             "renewed: the connection to lockd was lost")));
        }
        break;
      case Kind::kRelease:
        if (alive) Complete(p.op, absl::UnavailableError("the connection to lockd was lost"));
        [[fallthrough]];
      case Kind::kUnawaitedRelease:
      case Kind::kRelinquish:
        // Given back again once the session is resumed.
        Relinquish(now, p.session, p.lock, p.token);
        break;
      case Kind::kSettle:
        if (auto u = unsettled_.find(p.lock); u != unsettled_.end()) u->second.request = 0;
        if (alive) {
          op->second.stage = Stage::kWaiting;
          waiting_.push_back(p.op);
        }
        break;
      case Kind::kValidate:
        if (alive) Complete(p.op, absl::UnavailableError("the connection to lockd was lost"));
        break;
      case Kind::kClose:
        if (alive) Complete(p.op, absl::OkStatus());
        break;
    }
  }
  for (uint64_t op : waiting_) {
    if (auto it = ops_.find(op); it != ops_.end() && it->second.stage == Stage::kRenewingSession) {
      it->second.stage = Stage::kWaiting;
    }
  }
  if (beat_failed) HeartbeatDone(now, false);
  MaybeDial(now);
}

// ---- the session ----

void ClientCore::StartSession(MonoTime now) {
  if (session_id_ != 0) {
    // lockd lets only the connection a session is bound to drive it: a session that may have
    // survived on the server is resumed here, with its secret, before anything else is sent.
    session_state_ = SessionState::kResuming;
    Send(now, req::Resume(session_id_, secret_),
         Pending{.kind = Kind::kResume, .timeout_at = now + options_.request_timeout,
                 .session = session_id_});
    return;
  }
  if (!want_session_ && waiting_.empty()) return;
  session_state_ = SessionState::kOpening;
  Send(now, req::OpenSession(options_.session_ttl),
       Pending{.kind = Kind::kOpen, .timeout_at = now + options_.request_timeout});
}

void ClientCore::LoseSession(MonoTime now, LossReason reason) {
  if (session_id_ != 0) {
    Log(LogLevel::kWarning, absl::StrCat("session ", session_id_, " is gone on lockd (",
                                         LossReasonName(reason), "): ", held_.size(),
                                         " held lock(s) lost with it"));
  }
  for (auto& [name, held] : held_) {
    if (held.state->Check(now) == LossReason::kNone) CountLoss(reason);
    LoseLease(held.state, reason);
  }
  held_.clear();
  unsettled_.clear();  // the session's locks went with it
  recent_releases_.clear();
  session_id_ = 0;
  secret_.clear();
  session_deadline_ = MonoTime::Min();
  next_beat_ = MonoTime::Max();
  if (session_state_ != SessionState::kOpening) session_state_ = SessionState::kNone;
}

void ClientCore::LoseLease(const std::shared_ptr<LeaseState>& state, LossReason reason) {
  const LossReason before = MarkedReason(*state);
  state->MarkLost(reason);
  if (before == LossReason::kNone && reason != LossReason::kReleased) {
    actions_.lost.push_back(state);
  }
}

void ClientCore::CountLoss(LossReason reason) {
  if (metrics::Counter* c = lease_lost_[static_cast<size_t>(reason)]; c != nullptr) c->Increment();
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
  wire::Request request = req::KeepAlive(session_id_);
  Pending p{.kind = Kind::kKeepAlive, .op = op, .timeout_at = now + KeepAliveTimeout(),
            .session = session_id_, .background = background};
  for (const auto& [name, held] : held_) {
    req::AddLock(request, name, held.state->token());
    p.renewed.push_back(held.state);
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
  auto state = std::make_shared<LeaseState>(op.lock, token, op.granted_ttl,
                                            std::min(lock_deadline, session_deadline_), id_,
                                            op.mode);
  if (state->Check(now) != LossReason::kNone) {
    // Its lease ran out before it could be handed over (a renewal that took longer than the
    // usable lease): nobody may use it.
    Relinquish(now, op.session, op.lock, token);
    Complete(id, absl::UnavailableError(absl::StrCat(
                     "lock \"", op.lock, "\" was granted, but its lease ran out before use")));
    return;
  }
  held_[op.lock] = Held{state, lock_deadline};
  // A lock with a shorter TTL than those held so far shortens the period from now on.
  if (!beat_in_flight_) next_beat_ = std::min(next_beat_, now + HeartbeatInterval());
  Complete(id, absl::OkStatus(), std::move(state));
}

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
  pending_.erase(it);
  if (r.code() == wire::SESSION_NOT_FOUND && p.session != 0 && p.session == session_id_ &&
      p.kind != Kind::kResume) {
    // lockd no longer has the session: every lock it held is gone.
    LoseSession(now, LossReason::kSessionLost);
  }
  auto op = ops_.find(p.op);
  const bool alive = p.op != 0 && op != ops_.end();
  switch (p.kind) {
    case Kind::kOpen:
      if (r.code() != wire::OK) {
        session_state_ = SessionState::kNone;
        const absl::Status status = protocol::StatusFromCode(r.code(), r.message());
        const std::deque<uint64_t> waiting = waiting_;
        for (uint64_t w : waiting) Complete(w, status);
        want_session_ = false;
        break;
      }
      session_id_ = r.open_session().session_id();
      secret_ = r.open_session().secret();
      session_ttl_ = absl::Milliseconds(r.open_session().ttl_ms());
      session_deadline_ = UsableDeadline(p.t_send, session_ttl_, options_.safety_margin);
      session_state_ = SessionState::kOpen;
      redial_backoff_ = absl::ZeroDuration();
      next_beat_ = now + HeartbeatInterval();
      Log(LogLevel::kInfo,
          absl::StrCat("session ", session_id_, " opened on ", options_.replicas[replica_],
                       " (TTL ", absl::FormatDuration(session_ttl_), ")"));
      Pump(now);
      break;
    case Kind::kResume:
      if (r.code() == wire::SESSION_NOT_FOUND || r.code() == wire::PERMISSION_DENIED) {
        // Gone (expired, or lockd lost it), or no longer ours to drive: its locks are lost;
        // a new session is opened for whoever waits.
        LoseSession(now, LossReason::kSessionLost);
        session_state_ = SessionState::kNone;
        if (!waiting_.empty()) StartSession(now);
        break;
      }
      if (r.code() != wire::OK) {
        const absl::Status status = protocol::StatusFromCode(r.code(), r.message());
        const std::deque<uint64_t> waiting = waiting_;
        for (uint64_t w : waiting) Complete(w, status);
        // The resume is tried again on a new connection, after a pause that doubles: a lockd
        // that cannot take it now (a disk fault) is not flooded with connections.
        CloseLink(now, false, absl::ZeroDuration());
        DelayRedial(now);
        break;
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
      break;
    case Kind::kKeepAlive:
      OnKeepAliveReply(now, p, r);
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
          held_.erase(h);
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
          held_.erase(it);
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
      state->Extend(std::min(held.lock_deadline, session_deadline_), now);
    }
    absl::Duration least = absl::InfiniteDuration();
    for (const auto& [name, held] : held_) least = std::min(least, held.state->deadline() - now);
    remaining_gauge_.Set(held_.empty() ? 0.0
                                       : absl::ToDoubleSeconds(std::max(least, absl::ZeroDuration())));
    Sweep(now);
  }
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
      r.acquire().lock() == op.lock && p.session == session_id_ && held_.count(op.lock) == 0 &&
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
  for (auto it = held_.begin(); it != held_.end();) {
    const LossReason reason = it->second.state->Check(now);
    if (reason == LossReason::kNone) {
      ++it;
      continue;
    }
    const std::shared_ptr<LeaseState> state = it->second.state;
    it = held_.erase(it);
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
  std::vector<uint64_t> due;
  for (const auto& [rid, p] : pending_) {
    if (p.timeout_at <= now) due.push_back(rid);
  }
  for (uint64_t rid : due) {
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
        pending_.erase(it);
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
        p.timeout_at = MonoTime::Max();
        break;
      case Kind::kGrantRenewal: {
        Pending copy = std::move(p);
        pending_.erase(it);
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
        p.timeout_at = MonoTime::Max();
        break;
      case Kind::kValidate:
      case Kind::kClose: {
        const uint64_t op = p.op;
        const Kind kind = p.kind;
        RememberLate(rid, p.session);
        pending_.erase(it);
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
  for (const auto& [rid, p] : pending_) next = std::min(next, p.timeout_at);
  for (const auto& [name, held] : held_) next = std::min(next, held.state->deadline());
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

}  // namespace client_core
}  // namespace fencelock
