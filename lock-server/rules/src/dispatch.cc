#include "lock-server/dispatch.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch_pool.h"
#include "protocol/codes.h"
#include "protocol/limits.h"
#include "protocol/millis.h"
#include "protocol/version.h"

namespace fencelock::server {
namespace {

size_t entry_count(const wire::ListReply* list) {
  return static_cast<size_t>(list->locks_size() + list->sessions_size());
}

// One request on its way through Dispatch, for the handlers of its body below: each answers in
// `resp` (and `out`), and may change the connection's state.
struct Call {
  const wire::Request& req;
  ConnectionState& conn;
  DispatchHost& host;
  LockService& service;
  const MonoTime now;
  Dispatched& out;
  wire::Response& resp;

  // Answers with `s`'s code, and its message if it failed.
  void Finish(const absl::Status& s) {
    resp.set_code(protocol::CodeFromStatus(s));
    if (!s.ok()) resp.set_message(std::string(s.message()));
  }
  // Answers as set, then closes the connection.
  void Close() { out.then = Dispatched::Then::kReplyAndClose; }
  // A request that drives a session must come from the connection the session is bound to.
  absl::Status Authorize(SessionId session) {
    service.Advance(now);
    return service.Authorize(session, conn.caller);
  }

  void Hello();
  void OpenSession();
  void ResumeSession();
  void KeepAlive();
  void Renew();
  void CloseSession();
  void Acquire();
  void WithdrawAcquire();
  void Release();
  void Validate();
  void GetStats();
  void ListLocks();
};

void Call::Hello() {
  if (conn.hello_done) {
    host.CountProtocolError();
    return Finish(absl::InvalidArgumentError("Hello was already received on this connection"));
  }
  auto version = protocol::NegotiateVersion(
      {req.hello().min_version(), req.hello().max_version()}, protocol::VersionRange{});
  if (!version.ok()) {
    host.CountProtocolError();
    resp.set_code(wire::UNSUPPORTED_VERSION);
    resp.set_message(std::string(version.status().message()));
    return Close();
  }
  conn.hello_done = true;
  conn.version = *version;
  resp.mutable_hello()->set_version(*version);
  resp.mutable_hello()->set_server_name("lockd");
  return Finish(absl::OkStatus());
}

void Call::OpenSession() {
  // Sessions outlive connections; only the ones still open count against this one. Those
  // that ended are forgotten once the list is full, not at every open: a connection's opens
  // cost one pass over its sessions per `limit` of them, not one each.
  service.Advance(now);
  const size_t limit = host.max_sessions_per_connection();
  if (conn.sessions.size() >= limit) {
    std::erase_if(conn.sessions,
                  [&](SessionId id) { return service.state().FindSession(id) == nullptr; });
  }
  if (conn.sessions.size() >= limit) {
    return Finish(absl::ResourceExhaustedError(absl::StrCat(
        "this connection already has ", conn.sessions.size(),
        " open sessions, the most one connection may (lockd --max-sessions-per-connection=",
        limit, ")")));
  }
  std::string secret = host.NewSessionSecret();
  auto opened = service.OpenSession(protocol::FromWireMillis(req.open_session().ttl_ms()), now, conn.caller,
                                    secret);
  if (opened.ok()) {
    conn.sessions.push_back(opened->first);
    resp.mutable_open_session()->set_session_id(opened->first.value());
    resp.mutable_open_session()->set_ttl_ms(protocol::ToWireMillis(opened->second));
    resp.mutable_open_session()->set_secret(std::move(secret));
  }
  return Finish(opened.status());
}

void Call::ResumeSession() {
  const auto& r = req.resume_session();
  const SessionId session(r.session_id());
  service.Advance(now);
  auto ttl = service.Resume(session, r.secret(), conn.caller);
  if (ttl.ok()) {
    if (std::find(conn.sessions.begin(), conn.sessions.end(), session) == conn.sessions.end() &&
        std::find(conn.renewed.begin(), conn.renewed.end(), session) == conn.renewed.end()) {
      std::erase_if(conn.renewed,
                    [&](SessionId id) { return service.state().FindSession(id) == nullptr; });
      if (conn.renewed.size() >= host.max_sessions_per_connection()) {
        conn.renewed.erase(conn.renewed.begin());
      }
      conn.renewed.push_back(session);
    }
    resp.mutable_resume_session()->set_session_ttl_ms(protocol::ToWireMillis(*ttl));
  }
  return Finish(ttl.status());
}

void Call::KeepAlive() {
  const auto& ka = req.keep_alive();
  const SessionId session(ka.session_id());
  if (absl::Status s = Authorize(session); !s.ok()) return Finish(s);
  std::vector<LockRef> refs;
  refs.reserve(ka.locks_size());
  for (const auto& l : ka.locks()) refs.push_back(LockRef{l.lock(), FenceToken(l.token())});
  auto results = service.KeepAlive(session, refs, now);
  if (results.ok()) {
    auto* reply = resp.mutable_keep_alive();
    const SessionState* s = service.state().FindSession(session);
    reply->set_session_ttl_ms(protocol::ToWireMillis(s->ttl));
    if (conn.version >= protocol::kRenewProtocolVersion) reply->set_losses(s->losses);
    Dispatched::Reflects reflects{.sessions = {session}};
    bool all_renewed = true;
    for (size_t i = 0; i < results->size(); ++i) {
      reply->add_lock_codes(protocol::CodeFromStatus((*results)[i]));
      all_renewed = all_renewed && (*results)[i].ok();
      reflects.grants.push_back(refs[i].token);
    }
    // A FENCED_OUT reflects a release or an expiry, which may still be on its way to the
    // disk: such a reply waits for every record applied before it, as any other reply does.
    if (all_renewed) out.reflects = std::move(reflects);
  }
  return Finish(results.status());
}

void Call::Renew() {
  if (!RequireVersion(conn, protocol::kRenewProtocolVersion, "Renew needs", host, resp)) return;
  const auto& sessions = req.renew().sessions();
  const size_t limit = host.max_sessions_per_connection();
  if (sessions.empty() || static_cast<size_t>(sessions.size()) > limit) {
    return Finish(absl::InvalidArgumentError(absl::StrCat(
        "a Renew names 1 to ", limit, " sessions (lockd --max-sessions-per-connection), got ",
        sessions.size())));
  }
  if (sessions.size() > 1) {
    // Each would renew the session's locks again: one frame, many passes over them. Sorted,
    // so that a Renew of many sessions costs k log k here, not k squared; a client's usual
    // Renew of one session pays nothing.
    std::vector<uint64_t> ids;
    ids.reserve(sessions.size());
    for (const auto& renewal : sessions) ids.push_back(renewal.session_id());
    std::sort(ids.begin(), ids.end());
    if (auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end()) {
      return Finish(absl::InvalidArgumentError(
          absl::StrCat("a Renew names session ", *twice, " more than once")));
    }
  }
  auto* reply = resp.mutable_renew();
  Dispatched::Reflects reflects;
  bool all_renewed = true;
  for (const auto& renewal : sessions) {
    const SessionId session(renewal.session_id());
    auto* renewed = reply->add_sessions();
    renewed->set_session_id(session.value());
    const absl::Status authorized = Authorize(session);
    std::vector<LockRef> confirm;
    if (authorized.ok()) {
      confirm.reserve(renewal.confirm_size());
      for (const auto& l : renewal.confirm()) confirm.push_back({l.lock(), FenceToken(l.token())});
    }
    const absl::StatusOr<LockService::Renewed> r =
        authorized.ok() ? service.Renew(session, confirm, now)
                        : absl::StatusOr<LockService::Renewed>(authorized);
    renewed->set_code(protocol::CodeFromStatus(r.status()));
    if (!r.ok()) {
      renewed->set_message(std::string(r.status().message()));
      all_renewed = false;
      continue;
    }
    renewed->set_session_ttl_ms(protocol::ToWireMillis(r->ttl));
    renewed->set_losses(r->losses);
    renewed->set_held(r->held);
    // What it asserts: the sessions, and the grants it confirms. A lock confirmed before was
    // named by its client after the grant's answer, which left only once it was committed.
    reflects.sessions.push_back(session);
    for (const LockRef& ref : confirm) reflects.grants.push_back(ref.token);
  }
  // A session not found reflects its end, which may still be on its way to the disk.
  if (all_renewed) out.reflects = std::move(reflects);
  return Finish(absl::OkStatus());
}

void Call::CloseSession() {
  const SessionId session(req.close_session().session_id());
  if (absl::Status s = Authorize(session); !s.ok()) return Finish(s);
  resp.mutable_close_session();
  return Finish(service.CloseSession(session, now));
}

void Call::Acquire() {
  const auto& a = req.acquire();
  const SessionId session(a.session_id());
  if (absl::Status s = Authorize(session); !s.ok()) return Finish(s);
  if (!host.permissions().MayAcquire(conn.caller.identity, a.lock())) {
    return Finish(service.Deny(absl::StrCat("may not acquire \"", a.lock(), "\": ",
                                            host.permissions().DescribeAcquire(conn.caller.identity))));
  }
  if (conn.queued.contains(req.request_id())) {
    // Its reply, and WithdrawAcquire, could no longer tell the two apart.
    return Finish(absl::InvalidArgumentError(absl::StrCat(
        "request id ", req.request_id(),
        " already names an Acquire that waits on this connection; a waiting Acquire's "
        "request id must be unique on its connection")));
  }
  if ((a.mode() != wire::EXCLUSIVE || a.has_lock_delay_ms()) &&
      !RequireVersion(conn, protocol::kSharedLockProtocolVersion,
                      "an Acquire's mode and lock delay need", host, resp)) {
    return;
  }
  if (a.mode() != wire::EXCLUSIVE && a.mode() != wire::SHARED) {
    return Finish(absl::InvalidArgumentError(
        absl::StrCat("unknown lock mode ", static_cast<int>(a.mode()))));
  }
  AcquireMode how;
  how.mode = a.mode() == wire::SHARED ? LockMode::kShared : LockMode::kExclusive;
  if (a.has_lock_delay_ms()) how.lock_delay = protocol::FromWireMillis(a.lock_delay_ms());
  const WaiterId waiter_id = host.NextWaiterId();
  auto result = service.Acquire(session, a.lock(), protocol::FromWireMillis(a.ttl_ms()),
                                protocol::FromWireMillis(a.wait_timeout_ms()), waiter_id, now, how);
  if (!result.ok()) {
    // The session holds it already: the refusal names the grant (granted stays false), so
    // that a client whose earlier Acquire was granted but never answered (a replica
    // deposed as it committed) can release it rather than wait out its lease.
    const LockState* held = service.state().FindLock(a.lock());
    const HolderState* holder = held == nullptr ? nullptr : held->FindSession(session);
    if (absl::IsInvalidArgument(result.status()) && holder != nullptr) {
      auto* held = resp.mutable_acquire();
      held->set_lock(a.lock());
      held->set_token(holder->token.value());
      held->set_ttl_ms(protocol::ToWireMillis(holder->ttl));
    }
    return Finish(result.status());
  }
  if (result->kind == AcquireResult::Kind::kQueued) {
    // Answered by a push when the wait is settled.
    out.then = Dispatched::Then::kQueued;
    out.waiter = waiter_id;
    conn.queued[req.request_id()] = waiter_id;
    return;
  }
  auto* reply = resp.mutable_acquire();
  reply->set_lock(a.lock());
  if (result->kind == AcquireResult::Kind::kGranted) {
    reply->set_granted(true);
    reply->set_token(result->token.value());
    reply->set_ttl_ms(protocol::ToWireMillis(result->ttl));
  }
  return Finish(absl::OkStatus());
}

void Call::WithdrawAcquire() {
  const auto& w = req.withdraw_acquire();
  if (!RequireVersion(conn, protocol::kWithdrawProtocolVersion, "WithdrawAcquire needs",
                      host, resp)) {
    return;
  }
  const SessionId session(w.session_id());
  if (absl::Status s = Authorize(session); !s.ok()) return Finish(s);
  // Only this connection's own Acquires can be named: request ids are the connection's.
  auto queued = conn.queued.find(w.acquire_request_id());
  absl::StatusOr<bool> withdrawn = false;
  if (queued != conn.queued.end()) {
    withdrawn = service.Withdraw(queued->second, session, now);
    if (withdrawn.ok()) conn.queued.erase(queued);
  }
  if (withdrawn.ok()) resp.mutable_withdraw_acquire()->set_withdrawn(*withdrawn);
  return Finish(withdrawn.status());
}

void Call::Release() {
  const auto& r = req.release();
  const SessionId session(r.session_id());
  const FenceToken token(r.token());
  if (absl::Status s = Authorize(session); !s.ok()) return Finish(s);
  resp.mutable_release();
  absl::Status released = service.Release(session, r.lock(), token, now, r.relinquish(),
                                           service.SentByItsDriver(session, conn.caller));
  // The releaser's own OK does not wait for its release to be durable (ADR 0003): it
  // reflects only the session and the grant it ended. Whatever shows the lock free to
  // anyone else (a grant, a push to a waiter, a FENCED_OUT, a listing) still waits.
  if (released.ok()) {
    out.reflects = Dispatched::Reflects{.sessions = {session}, .grants = {token}};
  }
  return Finish(released);
}

void Call::Validate() {
  const auto& v = req.validate();
  std::optional<SessionId> holder;
  if (const SessionId session(v.session_id()); session != SessionId()) {
    if (absl::Status s = Authorize(session); !s.ok()) return Finish(s);
    holder = session;
  } else if (!host.permissions().MayValidate(conn.caller.identity)) {
    // A resource's check: only for identities that check tokens, so that a stranger who
    // remembers old tokens cannot raise lock_fenced_out_total, whose healthy value is 0.
    return Finish(service.Deny(absl::StrCat(
        "may not check tokens without a session: ",
        Permissions::Name(conn.caller.identity), " has no validate right")));
  }
  resp.mutable_validate();
  return Finish(
      service.Validate(v.lock(), FenceToken(v.token()), now, holder,
                       !holder.has_value() || service.SentByItsDriver(*holder, conn.caller)));
}

void Call::GetStats() {
  host.FillStats(resp.mutable_stats());
  // Counts are anyone's; the newest token is shown only to whoever may see the tokens of the
  // locks themselves (ListLocks).
  const Permissions& permissions = host.permissions();
  if (!permissions.MayList(conn.caller.identity) && !permissions.MayInspect(conn.caller.identity)) {
    resp.mutable_stats()->clear_last_token();
  }
  return Finish(absl::OkStatus());
}

void Call::ListLocks() {
  if (const absl::Status* fault = host.fault(); fault != nullptr) {
    // Memory may hold changes the disk does not: show none of them.
    return Finish(absl::UnavailableError(absl::StrCat(
        "lockd stopped after a commit fault (", fault->message(),
        "); its memory may hold changes that never became durable, so it lists nothing; ",
        host.FaultRemedy())));
  }
  const Permissions& permissions = host.permissions();
  const std::string& who = conn.caller.identity;
  const bool inspect = permissions.MayInspect(who);
  if (!permissions.MayList(who) && !inspect) {
    return Finish(service.Deny(absl::StrCat(
        Permissions::Name(who), " may not list sessions and locks (",
        permissions.source(), " has no \"list\" or \"inspect\" rule for it)")));
  }
  const auto& q = req.list_locks();
  if (q.include_sessions() && !inspect) {
    return Finish(service.Deny(absl::StrCat(
        Permissions::Name(who), " may list locks but not sessions (",
        permissions.source(), " has no \"inspect\" rule for it)")));
  }
  if (q.limit() > protocol::kMaxListLimit) {
    return Finish(absl::InvalidArgumentError(
        absl::StrCat("ListLocks limit is at most ", protocol::kMaxListLimit, ", got ", q.limit())));
  }
  // Room for the reply's own fields around the entries.
  const size_t cap = host.max_frame_bytes() > 1024 ? host.max_frame_bytes() - 1024 : 64;
  FillList(service, q, resp.mutable_list(), now, cap);
  if (!inspect) {
    // Names and leases only: whose they are, and under which token, is not this caller's.
    for (auto& l : *resp.mutable_list()->mutable_locks()) {
      l.set_session_id(0);
      l.set_token(0);
      for (auto& h : *l.mutable_holders()) {
        h.set_session_id(0);
        h.set_token(0);
      }
    }
    resp.mutable_list()->set_redacted(true);
  }
  return Finish(absl::OkStatus());
}

}  // namespace

Dispatched Dispatch(std::string_view payload, ConnectionState& conn, DispatchHost& host,
                    MonoTime now) {
  wire::Request req;
  Dispatched out;
  wire::Response& resp = out.response;
  auto close = [&]() {
    out.then = Dispatched::Then::kReplyAndClose;
    return out;
  };
  if (!req.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    host.CountProtocolError();
    resp.set_code(wire::MALFORMED_REQUEST);
    resp.set_message(absl::StrCat("a frame of ", payload.size(),
                                  " bytes does not parse as a fencelock Request"));
    return close();
  }
  resp.set_request_id(req.request_id());
  if (const StandingBy* standing_by = host.standby(); standing_by != nullptr) {
    const StandingBy::Leader leader = standing_by->leader();
    resp.set_code(wire::NOT_LEADER);
    resp.set_message(absl::StrCat(
        "this lockd replica stands by; ",
        leader.description.empty() ? std::string("no replica serves the prefix just now")
                                   : absl::StrCat("the serving replica is ", leader.description),
        standing_by->note().empty() ? "" : "; ", standing_by->note()));
    if (req.has_hello()) resp.mutable_hello()->set_leader(leader.address);
    return close();
  }
  if (req.body_case() == wire::Request::BODY_NOT_SET) {
    host.CountProtocolError();
    resp.set_code(wire::MALFORMED_REQUEST);
    resp.set_message("request has no body: unknown message type for this protocol version");
    return close();
  }
  if (!conn.hello_done && req.body_case() != wire::Request::kHello) {
    host.CountProtocolError();
    resp.set_code(wire::HELLO_REQUIRED);
    resp.set_message("the first request on a connection must be Hello");
    return close();
  }
  LockService& service = host.service();
  const bool read_only = req.body_case() == wire::Request::kHello ||
                         req.body_case() == wire::Request::kGetStats ||
                         req.body_case() == wire::Request::kListLocks ||
                         req.body_case() == wire::Request::kPoolStatus ||
                         req.body_case() == wire::Request::kPoolStop;
  if (const absl::Status* fault = host.fault(); !read_only && fault != nullptr) {
    resp.set_code(wire::UNAVAILABLE);
    resp.set_message(absl::StrCat("lockd stopped taking requests after a commit fault (",
                                  fault->message(), "); ", host.FaultRemedy()));
    return out;
  }
  if (IsPoolRequest(req)) {
    DispatchPool(req, conn, host, now, resp);
    return out;
  }
  Call call{req, conn, host, service, now, out, resp};
  switch (req.body_case()) {
    case wire::Request::kHello:
      call.Hello();
      break;
    case wire::Request::kOpenSession:
      call.OpenSession();
      break;
    case wire::Request::kResumeSession:
      call.ResumeSession();
      break;
    case wire::Request::kKeepAlive:
      call.KeepAlive();
      break;
    case wire::Request::kRenew:
      call.Renew();
      break;
    case wire::Request::kCloseSession:
      call.CloseSession();
      break;
    case wire::Request::kAcquire:
      call.Acquire();
      break;
    case wire::Request::kWithdrawAcquire:
      call.WithdrawAcquire();
      break;
    case wire::Request::kRelease:
      call.Release();
      break;
    case wire::Request::kValidate:
      call.Validate();
      break;
    case wire::Request::kGetStats:
      call.GetStats();
      break;
    case wire::Request::kListLocks:
      call.ListLocks();
      break;
    default:
      break;
  }
  return out;
}


void FillList(const LockService& service, const wire::ListLocks& query, wire::ListReply* list,
              MonoTime now, size_t max_page_bytes) {
  size_t entries_left = query.limit() == 0 ? protocol::kDefaultListLimit : query.limit();
  const size_t budget =
      std::min<size_t>(query.max_bytes() == 0 ? protocol::kDefaultListBytes : query.max_bytes(),
                       max_page_bytes);
  size_t used = 0;
  // An entry fits if the page has none yet (a page is never empty while something matches) or
  // if it stays within the budget. Its cost is its encoding inside the reply.
  auto fits = [&](const google::protobuf::Message& entry) {
    const size_t cost = entry.ByteSizeLong() + 4;  // field tag and length prefix
    if (entry_count(list) > 0 && used + cost > budget) return false;
    used += cost;
    return true;
  };
  auto left_ms = [&](MonoTime t) {
    return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(t - now)));
  };
  const auto& locks = service.state().locks();
  const std::string& prefix = query.prefix();
  if (!query.skip_locks()) {
    // The first name after start_after that can carry the prefix.
    auto it = query.start_after() < prefix ? locks.lower_bound(prefix)
                                           : locks.upper_bound(query.start_after());
    for (; it != locks.end() && (*it)->name().starts_with(prefix); ++it) {
      if (entries_left == 0) {
        list->set_more(true);
        return;
      }
      const LockState& state = **it;
      wire::LockInfo info;
      info.set_lock(std::string(state.name()));
      info.set_mode(state.mode() == LockMode::kShared ? wire::SHARED : wire::EXCLUSIVE);
      info.set_holder_count(static_cast<uint32_t>(state.holders().size()));
      for (const HolderState& h : state.holders()) {
        if (info.holders_size() >= static_cast<int>(protocol::kMaxListedHolders)) break;
        auto* holder = info.add_holders();
        holder->set_session_id(h.session.value());
        holder->set_token(h.token.value());
        holder->set_ttl_ms(protocol::ToWireMillis(h.ttl));
        holder->set_expires_in_ms(left_ms(h.expires_at));
      }
      if (state.held()) {
        const HolderState& first = state.holders().front();
        info.set_session_id(first.session.value());
        info.set_token(first.token.value());
        info.set_ttl_ms(protocol::ToWireMillis(first.ttl));
        info.set_expires_in_ms(left_ms(first.expires_at));
      }
      // The delay that blocks the most: every grant if there is one, else writers.
      const MonoTime delayed = state.DelayedUntil(LockMode::kExclusive);
      if (delayed > now) {
        info.set_delay_left_ms(left_ms(delayed));
        info.set_delay_blocks_shared(state.DelayedUntil(LockMode::kShared) > now);
      }
      const std::vector<LockMode> queued = service.QueuedModes(std::string(state.name()));
      info.set_waiters(static_cast<uint32_t>(queued.size()));
      info.set_exclusive_waiters(
          static_cast<uint32_t>(std::count(queued.begin(), queued.end(), LockMode::kExclusive)));
      if (!fits(info)) {
        list->set_more(true);
        return;
      }
      *list->add_locks() = std::move(info);
      --entries_left;
    }
  }
  if (!query.include_sessions()) return;
  const auto& sessions = service.state().sessions();
  for (auto it = sessions.upper_bound(SessionId(query.sessions_after())); it != sessions.end();
       ++it) {
    if (entries_left == 0) {
      list->set_more_sessions(true);
      return;
    }
    const SessionState& st = it->second;
    wire::SessionInfo info;
    info.set_session_id(it->first.value());
    info.set_ttl_ms(protocol::ToWireMillis(st.ttl));
    info.set_expires_in_ms(left_ms(st.expires_at));
    info.set_locks_held(static_cast<uint32_t>(st.locks.size()));
    if (!fits(info)) {
      list->set_more_sessions(true);
      return;
    }
    *list->add_sessions() = std::move(info);
    --entries_left;
  }
}

}  // namespace fencelock::server
