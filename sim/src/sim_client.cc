// A client: the client library's core driven by a worker, over the simulated network, and the
// checks on what lockd answered it.
#include "simulation.h"

namespace fencelock::sim::internal {

// ---- the client ----

void SimClient::Start() {
  client_core::CoreOptions options;
  for (int i = 0; i < sim_->replica_count(); ++i) options.replicas.push_back(sim_->ReplicaAddress(i));
  options.session_ttl = rng_->Between(absl::Seconds(2), absl::Seconds(5));
  options.safety_margin = sim_->options().safety_margin;
  options.request_timeout = kRequestTimeout;
  options.connect_timeout = kRequestTimeout;
  options.next_request_id = [this] { return ++next_request_; };
  core_ = std::make_unique<client_core::ClientCore>(std::move(options));
  work_ = time_.NewTimer();
  wake_ = time_.NewTimer();
  dial_timeout_ = time_.NewTimer();
  work_->ArmAt(time_.Now() + rng_->Between(absl::Milliseconds(1), absl::Milliseconds(50)),
               [this] {
                 core_->Start(time_.Now());
                 Apply();
                 Work();
               });
}

void SimClient::Apply() {
  for (;;) {
    client_core::Actions a = core_->TakeActions();
    if (a.empty()) break;
    for (const auto& line : a.logs) world_->Mix(line.message);
    for (uint64_t conn : a.close) sim_->CutConnection(static_cast<int>(conn) - 1);
    for (auto& out : a.sends) {
      const int conn = static_cast<int>(out.conn) - 1;
      const wire::Request& r = out.request;
      if (r.has_acquire() && acquire_op_ != 0 && r.acquire().lock() == acquiring_) {
        acquire_rid_ = r.request_id();
        acquire_session_ = SessionId(r.acquire().session_id());
      }
      sent_[r.request_id()] = {conn, r};
      sim_->ClientSend(conn, r);
    }
    for (const auto& lease : a.lost) {
      auto it = held_.find(lease->lock());
      if (it == held_.end() || it->second.lease != lease) continue;
      if (lease->Check(MonoTime::Min()) == LossReason::kDeadlinePassed) {
        GiveUp(lease->lock(), FenceToken(lease->token()), it->second.session,
               "its deadline passed");
      }
      held_.erase(it);
    }
    for (const auto& c : a.completions) {
      if (!completed_.insert(c.op).second) {
        sim_->Fail(absl::StrCat("client ", node_, ": operation ", c.op, " completed twice"));
      }
      if (c.op != acquire_op_) continue;
      if (c.lease != nullptr) {
        if (acquire_cancelled_) {
          sim_->Fail(absl::StrCat("client ", node_, ": the withdrawn acquire of ", acquiring_,
                                  " was handed over as granted (token ", c.lease->token(), ")"));
        }
        held_[c.lease->lock()] = Held{c.lease, acquire_session_};
        orphans_.erase({c.lease->lock(), FenceToken(c.lease->token())});
      }
      acquire_op_ = 0;
      acquire_rid_ = 0;
    }
    if (a.dial) Dial(*a.dial);
  }
  const MonoTime next = core_->NextWakeup();
  if (next == MonoTime::Max()) {
    wake_->Cancel();
  } else if (wake_->armed_for() != next) {
    wake_->ArmAt(next, [this] {
      core_->OnTick(time_.Now());
      Apply();
    });
  }
}

void SimClient::Dial(const client_core::Dial& dial) {
  dialing_ = sim_->OpenConnection(node_, static_cast<int>(dial.replica));
  dial_replica_ = dial.replica;
  wire::Request hello = protocol::HelloRequest("sim-client");
  hello.set_request_id(hello_id_ = ++next_request_);
  sim_->ClientSend(dialing_, hello);
  dial_timeout_->ArmAt(time_.Now() + dial.timeout, [this] {
    if (dialing_ < 0) return;
    sim_->CutConnection(dialing_);
    DialFailed(absl::DeadlineExceededError("no Hello answer in time"), "");
  });
}

void SimClient::DialFailed(const absl::Status& status, const std::string& leader) {
  dialing_ = -1;
  dial_timeout_->Cancel();
  core_->OnDialFailed(time_.Now(), dial_replica_, status, leader);
  Apply();
}

void SimClient::OnDisconnected(int conn) {
  if (conn == dialing_) return DialFailed(absl::UnavailableError("connection refused"), "");
  // Every request in flight on it is unanswered for good.
  for (auto it = sent_.begin(); it != sent_.end();) {
    it = it->second.first == conn ? sent_.erase(it) : std::next(it);
  }
  resumed_.erase(conn);
  core_->OnDisconnected(time_.Now(), static_cast<uint64_t>(conn) + 1);
  Apply();
}

void SimClient::OnResponse(int conn, const wire::Response& r) {
  if (conn == dialing_ && r.request_id() == hello_id_) {
    const int d = dialing_;
    dialing_ = -1;
    dial_timeout_->Cancel();
    std::string leader;
    auto version =
        protocol::ReadHelloReply(r, sim_->ReplicaAddress(static_cast<int>(dial_replica_)), &leader);
    if (!version.ok()) {
      sim_->CutConnection(d);
      core_->OnDialFailed(time_.Now(), dial_replica_, version.status(), leader);
    } else {
      core_->OnDialed(time_.Now(), dial_replica_, static_cast<uint64_t>(d) + 1, *version);
    }
    Apply();
    return;
  }
  Observe(conn, r);
  const bool resume_ok = [&] {
    auto it = sent_.find(r.request_id());
    return it != sent_.end() && it->second.second.has_resume_session() && r.code() == wire::OK;
  }();
  sent_.erase(r.request_id());
  std::vector<std::pair<std::string, FenceToken>> owed;
  if (resume_ok) {
    for (const auto& [key, session] : given_up_) owed.push_back(key);
  }
  core_->OnResponse(time_.Now(), static_cast<uint64_t>(conn) + 1, r);
  Apply();
  if (resume_ok)
    resumed_[conn] = Resumed{next_request_, std::move(owed), SessionId(core_->session_id())};
}

void SimClient::Observe(int conn, const wire::Response& r) {
  auto it = sent_.find(r.request_id());
  if (it == sent_.end()) return;
  const wire::Request& q = it->second.second;
  if (r.code() == wire::PERMISSION_DENIED) {
    // Every client drives only its own session, resumed with its own secret first.
    sim_->Fail(absl::StrCat("lockd refused client ", node_, "'s own request: ", r.message()));
  }
  if (r.code() == wire::SESSION_NOT_FOUND) {
    uint64_t s = 0;
    if (q.has_keep_alive()) s = q.keep_alive().session_id();
    if (q.has_resume_session()) s = q.resume_session().session_id();
    if (q.has_acquire()) s = q.acquire().session_id();
    if (q.has_release()) s = q.release().session_id();
    if (s != 0) gone_sessions_.insert(SessionId(s));
  }
  // lockd read every request sent with a resume's handling: what the client owed it then
  // (relinquishes unanswered when the old connection broke) has been given back.
  if (auto res = resumed_.find(conn);
      res != resumed_.end() && r.request_id() > res->second.last_request) {
    for (const auto& [lock, token] : res->second.owed) {
      const auto* h = sim_->HolderOf(lock, res->second.session);
      auto g = given_up_.find({lock, token});
      if (h != nullptr && h->token == token && g != given_up_.end()) {
        sim_->Fail(absl::StrCat("client ", node_, " gave up ", lock, " (token ", token, ": ",
                                g->second.why,
                                ") and resumed its session on a new connection, and lockd still "
                                "holds it for the session: it was not given back again"));
      }
    }
    resumed_.erase(res);
  }
  if (q.has_withdraw_acquire() && r.code() == wire::OK && r.withdraw_acquire().withdrawn()) {
    withdrawn_.insert(q.withdraw_acquire().acquire_request_id());
    sim_->CountWithdrawal();
  }
  if (q.has_acquire()) {
    if (withdrawn_.erase(r.request_id()) > 0 && r.code() != wire::CANCELLED) {
      sim_->Fail(absl::StrCat("lockd answered Acquire ", r.request_id(), " of client ", node_,
                              " with ", wire::Code_Name(r.code()),
                              " after it said it had withdrawn it"));
    }
    if (r.code() == wire::OK && r.acquire().granted()) {
      sim_->CountGrant(FenceToken(r.acquire().token()));
      // A grant nobody waits for any more (withdrawn, or its wait ran out) is given back.
      if (r.request_id() != acquire_rid_ || acquire_op_ == 0 || acquire_cancelled_) {
        GiveUp(q.acquire().lock(), FenceToken(r.acquire().token()),
               SessionId(q.acquire().session_id()),
               withdrawn_acquires_.contains(r.request_id()) ? "a grant that crossed its withdrawal"
                                                            : "a grant nobody waited for any more");
      }
    }
  }
  if (q.has_keep_alive() && r.code() == wire::OK) {
    const auto& codes = r.keep_alive().lock_codes();
    for (int i = 0; i < q.keep_alive().locks_size() && i < codes.size(); ++i) {
      const auto& l = q.keep_alive().locks(i);
      if (codes[i] == wire::OK && sim_->WasStale(conn, r.request_id(), l.lock())) {
        sim_->Fail(absl::StrCat("lockd renewed ", l.lock(), " for token ", l.token(),
                                ", which was stale when the renewal arrived"));
      }
      if (codes[i] == wire::FENCED_OUT) sim_->CountFencedOut();
    }
  }
  if (q.has_release()) {
    if (r.code() == wire::OK && sim_->WasStale(conn, r.request_id(), q.release().lock())) {
      sim_->Fail(absl::StrCat("lockd accepted a release of ", q.release().lock(), " with token ",
                              q.release().token(), ", which was stale when it arrived"));
    }
    if (r.code() == wire::FENCED_OUT) sim_->CountFencedOut();
    given_up_.erase({q.release().lock(), FenceToken(q.release().token())});  // answered: settled
  }
  if (q.has_validate()) {
    if (r.code() == wire::OK && sim_->WasStale(conn, r.request_id(), q.validate().lock())) {
      sim_->Fail(absl::StrCat("lockd confirmed ", q.validate().lock(), " for token ",
                              q.validate().token(), ", which was stale when the step arrived"));
    }
    if (r.code() == wire::FENCED_OUT) sim_->CountFencedOut();
  }
}

void SimClient::Step(const std::string& lock, Held held) {
  // The caller checked long ago and acts now: the resource asks lockd whether the token still
  // holds the lock (fence 1 for a resource that stores no tokens), on the client's connection
  // beside the core's requests, whatever the client believes.
  const uint64_t conn = core_->conn();
  if (conn == 0) return;
  wire::Request validate = protocol::request::Validate(lock, held.lease->token());
  validate.set_request_id(++next_request_);
  sent_[validate.request_id()] = {static_cast<int>(conn) - 1, validate};
  sim_->ClientSend(static_cast<int>(conn) - 1, validate);
}

void SimClient::Work() {
  const MonoTime now = time_.Now();
  // The critical section: checkStillHeld before each step.
  std::vector<std::string> lost;
  for (const auto& [lock, held] : held_) {
    if (held.lease->Check(now) != LossReason::kNone) {
      lost.push_back(lock);
      continue;
    }
    if (gone_sessions_.contains(held.session)) {
      sim_->Fail(absl::StrCat("client ", node_, " passed checkStillHeld for ", lock, " (token ",
                              held.lease->token(), ") after lockd told it that session ",
                              held.session, " is gone"));
    }
    sim_->CheckHeld(node_, lock, FenceToken(held.lease->token()), held.session, held.lease->mode());
    // Now and then the check asks lockd too (checkStillHeld with Confirm::kWithServer).
    if (rng_->Chance(0.05)) core_->Validate(now, held.lease);
    if (rng_->Chance(0.1)) {
      // The caller checked, then stalls before its step (a GC pause, a slow hop).
      const absl::Duration stall = rng_->Chance(0.5) ? absl::ZeroDuration()
                                                     : rng_->Between(absl::Milliseconds(1), absl::Seconds(3));
      Held h = held;
      std::string name = lock;
      world_->At(world_->now() + Ns(stall), node_, [this, name, h] { Step(name, h); });
    }
  }
  for (const std::string& lock : lost) held_.erase(lock);
  // Locks lockd keeps for this client's session that it neither holds a handle for nor is
  // acquiring (a grant handed to nobody, or one it gave up): lockd's own expiry ends one
  // within its TTL (4 s at most) unless the client keeps renewing it.
  const SessionId session(core_->session_id());
  if (session != SessionId()) {
    for (int l = 0; l < sim_->options().locks; ++l) {
      const std::string lock = absl::StrCat("lock-", l);
      const auto* h = sim_->HolderOf(lock, session);
      if (h == nullptr) continue;
      auto mine = held_.find(lock);
      if ((mine != held_.end() && FenceToken(mine->second.lease->token()) == h->token) ||
          (acquire_op_ != 0 && acquiring_ == lock)) {
        orphans_.erase({lock, h->token});
        continue;
      }
      // A grant whose answer was lost with its connection is unknown to the client; lockd
      // ends it within its TTL (at most 4 s) of when it last restarted or stalled.
      auto [it, fresh] = orphans_.try_emplace({lock, h->token}, world_->now());
      const int64_t since = std::max(it->second, sim_->lockd_undisturbed_since());
      if (!fresh && world_->now() - since > Ns(absl::Seconds(5))) {
        auto g = given_up_.find({lock, h->token});
        sim_->Fail(absl::StrCat("lockd has kept ", lock, " (token ", h->token, ") for client ",
                                node_, "'s session ", session,
                                " for 5 s, and the client holds no handle for it",
                                g == given_up_.end() ? "" : " (it gave it up: ",
                                g == given_up_.end() ? "" : g->second.why,
                                g == given_up_.end() ? "" : ")"));
        orphans_.erase(it);
      }
    }
  }
  if (acquire_op_ != 0 && !acquire_cancelled_ && rng_->Chance(0.05)) {
    // The caller gives up waiting: the core withdraws the Acquire from the lock's queue.
    acquire_cancelled_ = core_->Cancel(now, acquire_op_);
    if (acquire_cancelled_ && acquire_rid_ != 0) withdrawn_acquires_.insert(acquire_rid_);
  } else if (!held_.empty() && rng_->Chance(sim_->release_chance())) {
    auto it = std::next(held_.begin(), static_cast<long>(rng_->Below(held_.size())));
    const Held held = it->second;
    const std::string lock = it->first;
    held_.erase(it);
    // Released; awaited, or sent with the next request (releaseWithNextRequest).
    const bool await = rng_->Chance(0.5);
    GiveUp(lock, FenceToken(held.lease->token()), held.session,
           await ? "released" : "released with the next request");
    core_->Release(now, held.lease, await);
  } else if (held_.empty() && acquire_op_ == 0 && rng_->Chance(0.5)) {
    acquiring_ = absl::StrCat("lock-", rng_->Below(sim_->options().locks));
    const absl::Duration ttl = rng_->Between(absl::Seconds(1), absl::Seconds(4));
    const absl::Duration wait =
        rng_->Chance(0.5) ? absl::ZeroDuration() : rng_->Between(absl::Milliseconds(100), absl::Seconds(3));
    // ADR 0006: shared now and then, and sometimes with a lock delay that its loss starts.
    const LockMode mode = rng_->Chance(0.4) ? LockMode::kShared : LockMode::kExclusive;
    std::optional<absl::Duration> delay;
    if (rng_->Chance(0.3)) delay = rng_->Between(absl::Milliseconds(50), absl::Milliseconds(800));
    acquire_cancelled_ = false;
    acquire_rid_ = 0;
    acquire_op_ = core_->Acquire(now, acquiring_, wait, ttl, mode, delay);
  } else if (held_.empty() && acquire_op_ == 0 && rng_->Chance(0.01)) {
    core_->Close(now);
  }
  Apply();
  work_->ArmAt(now + rng_->Between(absl::Milliseconds(10), absl::Milliseconds(150)), [this] { Work(); });
}

}  // namespace fencelock::sim::internal
