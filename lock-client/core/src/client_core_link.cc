// ClientCore (lock-client/core/client_core.h): the link to lockd (dialing the replicas in turn,
// losing a connection) and the session on it.
#include "lock-client/core/client_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client_core_internal.h"
#include "protocol/version.h"

namespace fencelock::client_core {

namespace req = protocol::request;
using internal::kRetryFirst;
using internal::MarkedReason;

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
  std::map<uint64_t, Pending> pending = pending_.TakeAll();
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
    // Its losses are learned again on this connection (a lockd that restarted counts anew).
    renew_synced_ = false;
    Send(now, req::Resume(session_id_, secret_),
         Pending{.kind = Kind::kResume, .timeout_at = now + options_.request_timeout,
                 .session = session_id_});
    return;
  }
  if (!want_session_ && waiting_.empty()) return;
  renew_synced_ = false;
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
  held_.Clear();
  unsettled_.clear();  // the session's locks went with it
  recent_releases_.clear();
  session_id_ = 0;
  secret_.clear();
  session_deadline_ = MonoTime::Min();
  renewal_.reset();
  renew_synced_ = false;
  unconfirmed_.clear();
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

}  // namespace fencelock::client_core
