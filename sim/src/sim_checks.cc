// The checks on lockd as the run goes: recovery against the log, the shadow of each lock's
// holders and delays (ADR 0006), tokens, the reply gate, FIFO waiters, and checkStillHeld.
#include "simulation.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace fencelock::sim::internal {

void Simulation::CheckRecovered(const server::OpenedCommitLog& opened, MonoTime now,
                                const std::string& who) {
  // Nothing committed may be lost, and recovery must give exactly the log up to where it ends.
  const uint64_t recovered_lsn = opened.log->last_lsn();
  if (recovered_lsn < committed_lsn_) {
    Fail(absl::StrCat(who, ": recovery ends at lsn ", recovered_lsn, " but lsn ", committed_lsn_,
                      " was committed (acknowledged state lost)"));
  }
  appended_.erase(appended_.upper_bound(recovered_lsn), appended_.end());
  max_token_appended_ = FenceToken();
  committed_lsn_ = recovered_lsn;
  // From the snapshot recovery began with: the state when lockd began it (not the log up to
  // it: see snapshot_states_), then the log after it. snapshot-0 is the empty state.
  StateMachine replayed;
  uint64_t from = 0;
  if (auto it = snapshot_states_.find(opened.snapshot_lsn);
      opened.snapshot_lsn > 0 && it != snapshot_states_.end()) {
    replayed = it->second;
    from = opened.snapshot_lsn;
  }
  for (auto it = appended_.upper_bound(from); it != appended_.end(); ++it) {
    replayed.Apply(it->second, now);
  }
  if (replayed.DebugString() != opened.state.DebugString()) {
    Fail(absl::StrCat(who, ": recovered state differs from the committed log",
                      from > 0 ? absl::StrCat(" after the snapshot at lsn ", from) : "",
                      ": recovered {", opened.state.DebugString(), "} log {",
                      replayed.DebugString(), "}"));
  }
  // Later recoveries begin from this snapshot or a later one; none begins past what was kept.
  snapshot_states_.erase(snapshot_states_.begin(), snapshot_states_.lower_bound(from));
  snapshot_states_.erase(snapshot_states_.upper_bound(recovered_lsn), snapshot_states_.end());
  snapshot_checked_lsn_ = std::min(snapshot_checked_lsn_, recovered_lsn);
  if (!acked_tokens_.empty() && opened.state.last_token() < *acked_tokens_.rbegin()) {
    Fail(absl::StrCat(who, ": after recovery the next token would be ", opened.state.last_token() + 1,
                      ", but token ", *acked_tokens_.rbegin(), " was acknowledged"));
  }
}

namespace {
const char* Shared(LockMode mode) { return mode == LockMode::kShared ? " (shared)" : ""; }
const char* Shared(server::LockMode mode) {
  return mode == server::LockMode::kShared ? " (shared)" : "";
}
}  // namespace

void Simulation::ResetShadow(const ServerCore& core) {
  shadow_.clear();
  for (const server::LockState* held : core.service().state().locks()) {
    ShadowLock& s = shadow_[std::string(held->name())];
    for (const server::HolderState& h : held->holders()) {
      s.holders[h.token] = ShadowHolder{h.mode, h.lock_delay, h.expires_at};
    }
    if (held->delay_all()) s.all_until = held->delay_all()->until;
    if (held->delay_writers()) s.writers_until = held->delay_writers()->until;
  }
}

void Simulation::OnApplied(int replica, const Record& r) {
  if (replica != current_ || replicas_[replica].core == nullptr) return;
  const server::StateMachine& state = replicas_[replica].core->service().state();
  if (const auto* g = std::get_if<server::record::LockGranted>(&r)) {
    const server::HolderState* h = state.FindLock(g->lock)->FindToken(g->token);
    const MonoTime granted_at = h->expires_at - g->ttl;
    ShadowLock& s = shadow_[g->lock];
    for (const auto& [token, other] : s.holders) {
      if (g->mode == server::LockMode::kExclusive || other.mode == server::LockMode::kExclusive) {
        Fail(absl::StrCat("lock ", g->lock, " granted with token ", g->token, Shared(g->mode),
                          " while token ", token, Shared(other.mode), " holds it"));
      }
    }
    const MonoTime until = g->mode == server::LockMode::kExclusive
                               ? std::max(s.all_until, s.writers_until)
                               : s.all_until;
    if (granted_at < until) {
      Fail(absl::StrCat("lock ", g->lock, " granted with token ", g->token, Shared(g->mode), " ",
                        absl::FormatDuration(until - granted_at),
                        " before the end of a lock delay that blocks it"));
    }
    s.holders[g->token] = ShadowHolder{g->mode, g->lock_delay, h->expires_at};
    if (g->mode == server::LockMode::kShared) ++result_.shared_grants;
  } else if (const auto* renewed = std::get_if<server::record::LockRenewed>(&r)) {
    auto s = shadow_.find(renewed->lock);
    if (s == shadow_.end()) return;
    auto h = s->second.holders.find(renewed->token);
    const server::LockState* held = state.FindLock(renewed->lock);
    if (h != s->second.holders.end() && held != nullptr && held->FindToken(renewed->token)) {
      h->second.expires_at = held->FindToken(renewed->token)->expires_at;
    }
  } else if (const auto* released = std::get_if<server::record::LockReleased>(&r)) {
    auto s = shadow_.find(released->lock);
    if (s == shadow_.end()) return;
    auto h = s->second.holders.find(released->token);
    if (h == s->second.holders.end()) return;
    const ShadowHolder gone = h->second;
    s->second.holders.erase(h);
    if (released->reason == server::ReleaseReason::kReleased ||
        gone.delay <= absl::ZeroDuration()) {
      return;
    }
    ++result_.delays_started;
    const server::LockState* held = state.FindLock(released->lock);
    const auto& delay = gone.mode == server::LockMode::kExclusive
                            ? (held ? held->delay_all() : std::nullopt)
                            : (held ? held->delay_writers() : std::nullopt);
    // A lease that ran out was lost at its end, which this shadow knows (renewals included);
    // when lockd stalled, it postponed that end, so the delay can only be later than this.
    MonoTime until = delay ? delay->until : MonoTime::Min();
    if (released->reason == server::ReleaseReason::kLeaseExpired &&
        until < gone.expires_at + gone.delay) {
      Fail(absl::StrCat("lock ", released->lock, " token ", released->token,
                        " lost at its lease's end: its delay of ", absl::FormatDuration(gone.delay),
                        " ends ", absl::FormatDuration(gone.expires_at + gone.delay - until),
                        " early"));
      until = gone.expires_at + gone.delay;
    }
    MonoTime& shadow_until =
        gone.mode == server::LockMode::kExclusive ? s->second.all_until : s->second.writers_until;
    shadow_until = std::max(shadow_until, until);
  }
}

void Simulation::OnSnapshot(int replica, uint64_t lsn, const StateMachine& state) {
  if (replica != current_) return;
  snapshot_states_.insert_or_assign(lsn, state);
}

void Simulation::CheckSnapshots(int replica) {
  if (replica != current_ || options_.replicas > 1) return;  // etcd keeps no snapshot files
  auto names = disk_.ListDir(kDataDir);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    uint64_t lsn = 0;
    if (!absl::StartsWith(name, "snapshot-") ||
        !absl::SimpleAtoi(name.substr(sizeof("snapshot-") - 1), &lsn) ||
        lsn <= snapshot_checked_lsn_) {
      continue;
    }
    auto then = snapshot_states_.find(lsn);
    if (then == snapshot_states_.end()) continue;
    const std::string path = absl::StrCat(kDataDir, "/", name);
    auto data = disk_.ReadFile(path);
    if (!data.ok()) continue;
    auto held = server::DecodeSnapshot(path, *data, lsn, MonoTime());
    if (!held.ok()) {
      Fail(absl::StrCat("lockd wrote a snapshot it cannot read: ", held.status().ToString()));
    } else if (held->DebugString() != then->second.DebugString()) {
      Fail(absl::StrCat("the snapshot at lsn ", lsn, " holds {", held->DebugString(),
                        "} but the state when lockd began it was {",
                        then->second.DebugString(), "}"));
    }
    snapshot_checked_lsn_ = std::max(snapshot_checked_lsn_, lsn);
  }
}

void Simulation::OnAppended(int replica, uint64_t lsn, const Record& r) {
  // A deposed replica's records are never committed (its transactions are guarded by its
  // ownership; CheckTxn); only the serving one's count.
  if (replica != current_) return;
  appended_[lsn] = r;
  if (const auto* g = std::get_if<server::record::LockGranted>(&r)) {
    // Within one run of lockd every grant takes a higher token; across crashes no grant may
    // take a token that ever left lockd (in any reply). A token granted but never acknowledged
    // (its batch lost with its reservation) was never issued and may be used again.
    if (g->token <= max_token_appended_) {
      Fail(absl::StrCat("token ", g->token, " granted after token ", max_token_appended_,
                        " in the same run of lockd"));
    }
    if (g->token <= max_token_sent_) {
      Fail(absl::StrCat("token ", g->token, " granted again: token ", max_token_sent_,
                        " already left lockd"));
    }
    max_token_appended_ = g->token;
    grant_lsn_[g->token] = lsn;
    grants_this_event_.emplace_back(g->lock, g->session);
  } else if (const auto* o = std::get_if<server::record::SessionOpened>(&r)) {
    session_lsn_[o->session] = lsn;
  }
}

void Simulation::CheckReplyGate(int conn, std::string_view frames) {
  protocol::FrameDecoder decoder;
  decoder.Feed(frames);
  std::string payload;
  while (decoder.Next(&payload) == protocol::FrameDecoder::Result::kFrame) {
    wire::Response r;
    if (!r.ParseFromString(payload)) continue;
    if (r.has_acquire() && r.acquire().granted()) {
      max_token_sent_ = std::max(max_token_sent_, FenceToken(r.acquire().token()));
    }
    for (const auto& l : r.list().locks()) {
      max_token_sent_ = std::max(max_token_sent_, FenceToken(l.token()));
    }
    if (r.code() != wire::OK) continue;
    // On etcd every act is checked again as it leaves the replica, whatever the core said.
    if (on_etcd() && conns_[conn]->client != env_node_) {
      if (r.has_acquire() && r.acquire().granted()) {
        CheckAct(conns_[conn]->replica, server::Act::kGrant, r.acquire().lock(), r.acquire().token(),
                 true);
      } else if (r.has_keep_alive() || r.has_renew()) {
        CheckAct(conns_[conn]->replica, server::Act::kRenew, "-", 0, true);
      } else if (r.has_validate()) {
        CheckAct(conns_[conn]->replica, server::Act::kValidate, "-", 0, true);
      }
    }
    // The lsns are the serving replica's; a deposed one's acts are CheckAct's.
    if (conns_[conn]->replica != current_) continue;
    // `lsns`: grant_lsn_ or session_lsn_, by token or session id.
    auto committed = [&](const auto& lsns, auto key, const char* what) {
      auto it = lsns.find(key);
      if (it != lsns.end() && it->second > current_committed_lsn_) {
        Fail(absl::StrCat("reply acknowledging ", what, " ", key, " left lockd before lsn ",
                          it->second, " was committed (committed: ", current_committed_lsn_, ")"));
      }
    };
    if (r.has_acquire() && r.acquire().granted()) {
      committed(grant_lsn_, FenceToken(r.acquire().token()), "grant of token");
    }
    if (r.has_open_session()) {
      const SessionId session(r.open_session().session_id());
      committed(session_lsn_, session, "session");
      secrets_by_session_[session] = {conn, r.open_session().secret()};
    }
    if (r.has_keep_alive() || r.has_renew()) {
      // A renewal is answered without waiting for other batches; what it asserts (its session
      // and tokens) must be committed all the same.
      auto renewal = renewals_.find({conn, r.request_id()});
      if (renewal == renewals_.end()) continue;
      const bool all_ok =
          r.has_renew()
              ? std::all_of(r.renew().sessions().begin(), r.renew().sessions().end(),
                            [](const wire::RenewedSession& s) { return s.code() == wire::OK; })
              : std::all_of(r.keep_alive().lock_codes().begin(),
                            r.keep_alive().lock_codes().end(),
                            [](int code) { return code == wire::OK; });
      if (all_ok) {
        committed(session_lsn_, renewal->second.first, "renewal of session");
        for (FenceToken token : renewal->second.second) {
          committed(grant_lsn_, token, "renewal of token");
        }
      }
      renewals_.erase(renewal);
    }
  }
}

void Simulation::RunLockdEvent(int node, const std::function<void()>& fn) {
  // FIFO: a grant to a waiter while an earlier waiter for the same lock stays queued skips it.
  // Waiters are told apart by id: a session may queue again in the same event as it is
  // granted, and may have two waiters for one lock.
  Replica& r = replicas_[node];
  const uint64_t gen = r.core_gen;
  const bool serving = r.serving;
  std::map<std::string, std::vector<std::pair<server::WaiterId, SessionId>>> before;
  if (serving) {
    for (int l = 0; l < options_.locks; ++l) {
      const std::string lock = absl::StrCat("lock-", l);
      before[lock] = r.core->service().QueuedWaiters(lock);
    }
  }
  grants_this_event_.clear();
  fn();
  if (!serving || !r.serving || r.core_gen != gen) return;
  ServerCore* core = r.core.get();
  for (const auto& grant : grants_this_event_) {
    // Named, not bound: clang 14 cannot capture a structured binding in the lambdas below.
    const std::string& lock = grant.first;
    const SessionId session = grant.second;
    const auto& queue = before[lock];
    const auto after = core->service().QueuedWaiters(lock);
    auto waits = [&](server::WaiterId id) {
      return std::any_of(after.begin(), after.end(), [&](const auto& w) { return w.first == id; });
    };
    // The granted waiter: the first of the session's that left the queue.
    auto pos = std::find_if(queue.begin(), queue.end(),
                            [&](const auto& w) { return w.second == session && !waits(w.first); });
    if (pos == queue.end()) continue;  // not a waiter
    for (auto it = queue.begin(); it != pos; ++it) {
      if (waits(it->first)) {
        Fail(absl::StrCat("lock ", lock, " went to waiting session ", session,
                          " while session ", it->second, ", queued before it, still waits"));
      }
    }
  }
}

void Simulation::CheckHeld(int client, const std::string& lock, FenceToken token,
                           SessionId session, LockMode mode) {
  ++result_.checks_passed;
  // On the simulated timeline, whatever lockd's state: no other client believes it holds the
  // lock with another token right now (its own checkStillHeld would pass), unless both hold
  // it shared.
  if (bounds_hold() && !ended_by_fault(session)) {
    for (const auto& other : clients_) {
      if (other->node() == client) continue;
      const auto believed = other->Believes(lock);
      if (!believed || believed->token == token || ended_by_fault(believed->session)) continue;
      if (mode == LockMode::kShared && believed->mode == LockMode::kShared) continue;
      ++result_.overlaps;
      Fail(absl::StrCat("client ", client, " passed checkStillHeld for ", lock, " with token ",
                        token, Shared(mode), " while client ", other->node(),
                        " would pass it too with token ", believed->token,
                        Shared(believed->mode)));
    }
  }
  const ServerCore* core = ServingCore();
  if (core == nullptr) return;
  const server::LockState* held = core->service().state().FindLock(lock);
  if (held == nullptr || !held->held() || held->FindToken(token) != nullptr) return;
  ++result_.overlaps;
  if (bounds_hold() && !ended_by_fault(session)) {
    const server::HolderState& holder = held->holders().front();
    Fail(absl::StrCat("client ", client, " passed checkStillHeld for ", lock, " with token ",
                      token, " while session ", holder.session, " holds it with token ",
                      holder.token, Shared(holder.mode)));
  }
}


}  // namespace fencelock::sim::internal
