#include "lock-server/server_core.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "logging/logging.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "lock-server/dispatch.h"
#include "fencelock/wire.pb.h"
#include "google/protobuf/descriptor.h"
#include "lease_timers.h"
#include "log_limiter.h"
#include "protocol/codes.h"
#include "protocol/frame.h"
#include "reply_gate.h"

namespace fencelock::server {
namespace {

uint64_t ToMillis(absl::Duration d) { return static_cast<uint64_t>(absl::ToInt64Milliseconds(d)); }

void LogToStderr(const std::string& line) { logging::Lockd().Warning(line); }

std::string EncodeFrame(const wire::Response& response, size_t max_frame_bytes) {
  // Serialized in place behind the header: one allocation a reply, not three.
  const size_t size = response.ByteSizeLong();
  if (size <= max_frame_bytes) {
    std::string frame(protocol::kFrameHeaderBytes + size, '\0');
    protocol::WriteFrameHeader(static_cast<uint32_t>(size), frame.data());
    response.SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(frame.data() + protocol::kFrameHeaderBytes));
    return frame;
  }
  std::string frame;
  wire::Response too_big;
  too_big.set_request_id(response.request_id());
  too_big.set_code(wire::UNAVAILABLE);
  too_big.set_message("reply exceeds the maximum frame size");
  frame.clear();
  (void)protocol::AppendFrame(too_big.SerializeAsString(), &frame);
  return frame;
}

// A reply by which lockd acts as the state's server (Act), or nullopt.
std::optional<Act::Kind> ActOf(const wire::Response& r) {
  if (r.code() != wire::OK) return std::nullopt;
  if (r.has_acquire() && r.acquire().granted()) return Act::kGrant;
  if (r.has_pool_acquire() && r.pool_acquire().granted()) return Act::kGrant;
  if (r.has_keep_alive() || r.has_renew()) return Act::kRenew;
  if (r.has_validate()) return Act::kValidate;
  return std::nullopt;
}

// 16 bytes from the kernel's random number generator.
std::string RandomSecret() {
  std::string secret(16, '\0');
  size_t filled = 0;
  while (filled < secret.size()) {
    const ssize_t n = getrandom(secret.data() + filled, secret.size() - filled, 0);
    if (n > 0) {
      filled += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      // No getrandom (a kernel before 3.17): the C++ library's nondeterministic source.
      std::random_device device;
      for (char& c : secret) c = static_cast<char>(device());
      return secret;
    }
  }
  return secret;
}

CoreOptions Resolve(CoreOptions options) {
  if (!options.log) options.log = LogToStderr;
  if (!options.session_secrets) options.session_secrets = RandomSecret;
  return options;
}

// Repeated operator lines of one kind go out at most once per this long, with a count.
constexpr absl::Duration kLogInterval = absl::Seconds(10);

}  // namespace

class ServerCore::Impl final : public DispatchHost, public CommitLogListener {
 public:
  Impl(const CoreOptions& options, TimeSource* time, OpenedCommitLog opened)
      : options_(Resolve(options)),
        time_(time),
        limiter_(time, kLogInterval, options_.log),
        service_(WithLogs(options_.service), std::move(opened.state)),
        log_(std::move(opened.log)),
        leadership_(opened.leadership ? std::move(opened.leadership) : SoleLeadership()),
        standing_by_(dynamic_cast<const StandingBy*>(leadership_.get())),
        gate_([this](ConnectionId c, std::string frames) { Deliver(c, frames); }),
        lazy_flush_(time->NewTimer()),
        expiry_(time, [this] { OnExpiryDue(); }),
        stall_(time, options_.stall_threshold,
               [this](absl::Duration gap) { OnStall(gap); }) {
    log_->SetListener(this);
    service_.set_record_observer([this](const Record& r) {
      // A reservation covering every id handed out goes to the log before the batch that holds
      // the record, so a restart never reissues a token or session id, even if that batch is
      // lost.
      if (std::holds_alternative<record::LockGranted>(r) ||
          std::holds_alternative<record::PoolLeaseGranted>(r) ||
          std::holds_alternative<record::SessionOpened>(r)) {
        log_->ReserveFor(service_.state().last_token(), service_.state().last_session_id());
      }
      log_->Append(r);
      // Where the facts a KeepAlive's reply may reflect are, until they are committed.
      if (const auto* opened = std::get_if<record::SessionOpened>(&r)) {
        NotePending(opened->session, log_->newest_batch(), opened_in_, opened_order_);
      } else if (const auto* granted = std::get_if<record::LockGranted>(&r)) {
        NotePending(granted->token, log_->newest_batch(), granted_in_, granted_order_);
      }
    });
  }

  void Start() {
    stopped_ = false;
    // Whatever the restore cost, and however long a standby waited for the prefix before it,
    // every restored lease runs its full TTL from the moment the core begins to serve.
    service_.RestartLeases(time_->Now());
    // A state written before secrets (sessions', pool managers' owner keys) were kept as
    // digests: a snapshot now holds only digests,
    // and the log drops what it covers (WAL segments; etcd's log keys, older snapshots and
    // history), so no secret stays at rest in clear.
    if (const uint64_t clear = service_.state().secrets_read_in_clear();
        clear > 0 && !upgraded_secrets_ && log_->fault() == nullptr) {
      upgraded_secrets_ = true;
      options_.log(absl::StrCat(clear,
                                clear == 1 ? " secret (a session's or a pool manager's) was"
                                           : " secrets (sessions' or pool managers') were",
                                " stored in clear (written by an older lockd); writing a snapshot "
                                "that keeps only their digests, which drops the records that "
                                "held them"));
      log_->Snapshot(service_.state());
    }
    stall_.Start();
    expiry_.ArmFor(service_.NextDeadline());
  }
  void Stop() {
    stopped_ = true;
    lazy_flush_->Cancel();
    log_->Flush();  // what waited for company
    expiry_.Stop();
    stall_.Stop();
    limiter_.Flush();
    for (auto& [id, c] : connections_) c.timer.reset();
  }

  ConnectionId Connect(ConnectionSink* sink, std::string identity) {
    const ConnectionId id = ++last_connection_id_;
    Conn& c = connections_[id];
    c.sink = sink;
    c.state.caller = Caller{id, std::move(identity)};
    c.timer = time_->NewTimer();
    c.timer->ArmAt(time_->Now() + options_.connections.hello_timeout, [this, id] { OnHelloTimeout(id); });
    return id;
  }

  void Receive(ConnectionId id, std::span<const std::string> payloads) {
    auto it = connections_.find(id);
    if (it == connections_.end() || it->second.closing) return;
    NoticeStall();
    const MonoTime now = time_->Now();  // receipt time for every lease in this read
    it->second.last_request_at = now;
    for (const std::string& payload : payloads) {
      Conn& c = connections_.at(id);
      const bool hello_was_done = c.state.hello_done;
      Dispatched d = Dispatch(payload, c.state, *this, now);
      if (c.state.hello_done && !hello_was_done && options_.connections.idle_timeout > absl::ZeroDuration()) {
        // From Hello on, the connection's timer watches for idleness instead.
        c.timer->ArmAt(now + options_.connections.idle_timeout, [this, id] { OnIdleCheck(id); });
      }
      switch (d.then) {
        case Dispatched::Then::kReply:
          if (d.reflects.has_value()) {
            Reply(id, d.response, BatchOf(*d.reflects));
          } else {
            Reply(id, d.response);
          }
          break;
        case Dispatched::Then::kReplyAndClose:
          ReplyAndClose(id, d.response);
          break;
        case Dispatched::Then::kQueued:
          // Dispatch put it in the connection's index of waiting Acquires (state.queued).
          waiters_[d.waiter] = WaiterRoute{id, d.response.request_id()};
          break;
      }
      if (connections_.at(id).closing) break;
    }
    AfterRequest();
  }

  void RejectStream(ConnectionId id, int code, const std::string& message) {
    if (!connections_.contains(id)) return;
    CountProtocolError();
    wire::Response r;
    r.set_code(static_cast<wire::Code>(code));
    r.set_message(message);
    ReplyAndClose(id, r);
  }

  void Disconnect(ConnectionId id) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    // Cancel in id order, so that a disconnect has the same effect in every run.
    std::vector<WaiterId> waiting;
    for (const auto& [request_id, waiter] : it->second.state.queued) waiting.push_back(waiter);
    std::sort(waiting.begin(), waiting.end());
    for (WaiterId w : waiting) {
      service_.CancelWaiter(w);
      waiters_.erase(w);
    }
    gate_.Drop(id);
    connections_.erase(it);
  }

  void NoticeStall() { stall_.Notice(); }

  size_t HeldReplies(ConnectionId id) const { return gate_.held(id); }
  void CountTransportEvent(TransportEvent event) {
    switch (event) {
      case TransportEvent::kClosedSlowReader:
        ++stats_.connections_closed_slow_total;
        break;
      case TransportEvent::kRefused:
        ++stats_.connections_refused_total;
        break;
    }
  }

  CoreStats stats() const {
    CoreStats s = stats_;
    s.service = service_.stats();
    s.pools = service_.pools().stats();
    s.protocol_errors_total = protocol_errors_total_;
    s.stalls_total = stalls_total_;
    return s;
  }

  // The service's refusal lines go through the limiter: a peer can cause them in bulk.
  ServiceOptions WithLogs(ServiceOptions service) {
    if (!service.on_fenced_out) {
      service.on_fenced_out = [this](const std::string& line) {
        limiter_.Log("fenced out", line);
        if (options_.on_act) {
          options_.on_act(Act{.kind = Act::kFencedOut, .at = time_->Now(),
                              .owned_until = leadership_->ServesUntil(), .key = "-"});
        }
      };
    }
    if (!service.on_foreign_token) {
      service.on_foreign_token = [this](const std::string& line) {
        limiter_.Log("foreign token", line);
      };
    }
    if (!service.on_permission_denied) {
      service.on_permission_denied = [this](const std::string& line) {
        limiter_.Log("permission denied", line);
      };
    }
    return service;
  }

  // DispatchHost
  LockService& service() override { return service_; }
  const absl::Status* fault() const override { return log_->fault(); }
  std::string FaultRemedy() const override { return leadership_->FaultRemedy(); }
  // Asked for every request: no clock read (an etcd leadership's role() reads one).
  const StandingBy* standby() const override { return standing_by_; }
  WaiterId NextWaiterId() override { return ++last_waiter_id_; }
  std::string NewSessionSecret() override { return options_.session_secrets(); }
  void CountProtocolError() override { ++protocol_errors_total_; }
  const Permissions& permissions() const override { return options_.permissions; }
  void SetPermissions(Permissions permissions) { options_.permissions = std::move(permissions); }
  size_t max_sessions_per_connection() const override {
    return options_.connections.max_sessions_per_connection;
  }
  size_t max_frame_bytes() const override { return options_.connections.max_frame_bytes; }
  void RequestStop() override {
    // After the reply: the transport writes it before the stop closes the connection.
    if (options_.on_stop_requested) time_->Post(options_.on_stop_requested);
  }
  absl::Status HoldAdmissionNamespace() override {
    if (!options_.hold_admission_namespace) return absl::OkStatus();
    auto taken = options_.hold_admission_namespace();
    if (taken.ok() && !taken->empty()) options_.log(*taken);
    return taken.status();
  }
  void LetGoOfAdmissionNamespace() override {
    if (options_.let_go_of_admission_namespace) options_.let_go_of_admission_namespace();
  }
  void FillStats(wire::StatsReply* stats) const override;

  // CommitLogListener
  void OnCommitted(uint64_t batch) override {
    // A leased ownership that ran out while the batch was in etcd: its replies are refused, not
    // sent by a lockd that may have a successor by now (what the batch holds is committed, and
    // a successor restores it).
    if (const absl::Status* fault = log_->fault(); fault != nullptr) {
      OnCommitFault(*fault);
      return;
    }
    ForgetCommitted(batch, opened_in_, opened_order_);
    ForgetCommitted(batch, granted_in_, granted_order_);
    gate_.Committed(batch);
  }
  void OnCommitFault(const absl::Status& status) override;
  void OnSnapshotDue() override { log_->Snapshot(service_.state()); }

  const LockService& service_ref() const { return service_; }
  const CommitLog& log() const { return *log_; }
  const Leadership& leadership() const { return *leadership_; }

 private:
  bool upgraded_secrets_ = false;  // the snapshot that drops clear secrets was asked for
  struct Conn {
    ConnectionSink* sink = nullptr;
    ConnectionState state;
    // The Hello timeout until Hello arrives, then the idle check.
    std::unique_ptr<Timer> timer;
    MonoTime last_request_at = MonoTime::Min();
    bool closing = false;
  };
  struct WaiterRoute {
    ConnectionId connection;
    uint64_t request_id;
  };

  // Notes that the record of `key` is in `batch`, until that batch is committed.
  template <typename Key>
  static void NotePending(Key key, uint64_t batch, absl::flat_hash_map<Key, uint64_t>& in,
                          std::deque<std::pair<uint64_t, Key>>& order) {
    in[key] = batch;
    order.emplace_back(batch, key);
  }
  // Forgets what batches up to `batch` hold: it is committed.
  template <typename Key>
  static void ForgetCommitted(uint64_t batch, absl::flat_hash_map<Key, uint64_t>& in,
                              std::deque<std::pair<uint64_t, Key>>& order) {
    while (!order.empty() && order.front().first <= batch) {
      auto it = in.find(order.front().second);
      if (it != in.end() && it->second <= batch) in.erase(it);
      order.pop_front();
    }
  }
  // The newest batch that holds what a reply reflecting `facts` depends on; 0 once all of it
  // is committed.
  uint64_t BatchOf(const Dispatched::Reflects& facts) const {
    uint64_t batch = 0;
    for (SessionId session : facts.sessions) {
      if (auto it = opened_in_.find(session); it != opened_in_.end()) {
        batch = std::max(batch, it->second);
      }
    }
    for (FenceToken token : facts.grants) {
      if (auto it = granted_in_.find(token); it != granted_in_.end()) {
        batch = std::max(batch, it->second);
      }
    }
    return batch;
  }

  // Sends `response` on `id` once every record it may reflect is committed: by default every
  // record applied before it (the newest batch), or those in `batch` and before. After a fault
  // nothing becomes committed again; replies then carry no mutation and go at once.
  void Reply(ConnectionId id, const wire::Response& response) {
    Reply(id, response, log_->newest_batch());
  }
  void Reply(ConnectionId id, const wire::Response& response, uint64_t batch) {
    std::optional<Act::Kind> kind = ActOf(response);
    const MonoTime until = kind ? leadership_->ServesUntil() : MonoTime::Max();
    // A local log's ownership is not leased and only the event loop changes its fault, which
    // dispatch checked: nothing to check again, and no clock to read unless acts are recorded.
    if (kind && (until != MonoTime::Max() || options_.on_act)) {
      // The request was checked against the log's ownership when it was dispatched; a leased
      // ownership (etcd) can run out between that check and now. Read the time first, so that
      // an act recorded at `at` is known to precede `until`.
      const MonoTime at = time_->Now();
      if (const absl::Status* fault = log_->fault(); fault != nullptr || at >= until) {
        wire::Response refused;
        refused.set_request_id(response.request_id());
        refused.set_code(wire::UNAVAILABLE);
        refused.set_message(absl::StrCat(
            "lockd no longer serves this state: ",
            fault != nullptr ? fault->message() : "its ownership of the state ran out"));
        gate_.Submit(id, log_->newest_batch(), UINT64_MAX, refused.request_id(),
                     EncodeFrame(refused, options_.connections.max_frame_bytes));
        return;
      }
      if (options_.on_act) {
        options_.on_act(Act{.kind = *kind,
                            .at = at,
                            .owned_until = until,
                            .key = response.has_acquire()        ? response.acquire().lock()
                                   : response.has_pool_acquire() ? std::string("pool")
                                                                 : std::string("-"),
                            .token = response.has_acquire() ? response.acquire().token()
                                     : response.has_pool_acquire()
                                         ? response.pool_acquire().token()
                                         : 0});
      }
    }
    std::string frame = EncodeFrame(response, options_.connections.max_frame_bytes);
    const uint64_t committed =
        log_->fault() != nullptr ? UINT64_MAX : log_->committed_batch();
    gate_.Submit(id, batch, committed, response.request_id(), std::move(frame));
  }
  void ReplyAndClose(ConnectionId id, const wire::Response& response) {
    Reply(id, response);
    Conn& c = connections_.at(id);
    if (c.closing) return;
    c.closing = true;
    c.timer.reset();
    c.sink->CloseAfterSend();
  }
  void Deliver(ConnectionId id, const std::string& frames) {
    auto it = connections_.find(id);
    if (it != connections_.end()) it->second.sink->Send(frames);
  }

  // Delivers settled waiter outcomes, starts committing what the request changed, and makes
  // sure the expiry timer wakes for the earliest deadline. Called after every request.
  void AfterRequest();
  void ScheduleFlush();
  void OnExpiryDue();
  void OnStall(absl::Duration gap);
  void OnHelloTimeout(ConnectionId id);
  void OnIdleCheck(ConnectionId id);
  // True while the connection has a session that is still open (opened or renewed on it), a
  // queued acquire, or a reply waiting for its commit.
  bool HasWork(ConnectionId id, const Conn& c) const;

  CoreOptions options_;  // only the permissions change (SetPermissions)
  TimeSource* const time_;
  LogLimiter limiter_;
  LockService service_;
  std::unique_ptr<CommitLog> log_;
  std::unique_ptr<Leadership> leadership_;  // after log_: it may refer to the log
  const StandingBy* const standing_by_;      // leadership_, for a standby's core; else null
  ReplyGate gate_;
  // How long records that no reply waits for may wait for others to share their sync.
  static constexpr absl::Duration kLazyFlush = absl::Milliseconds(2);
  std::unique_ptr<Timer> lazy_flush_;
  ExpiryTimer expiry_;
  StallWatch stall_;
  bool stopped_ = true;
  bool flush_scheduled_ = false;
  bool ending_reported_ = false;  // on_ending_fault was called
  ConnectionId last_connection_id_ = 0;
  WaiterId last_waiter_id_ = 0;
  uint64_t protocol_errors_total_ = 0;
  uint64_t stalls_total_ = 0;
  CoreStats stats_;  // the connection counters
  std::map<ConnectionId, Conn> connections_;
  absl::flat_hash_map<WaiterId, WaiterRoute> waiters_;
  // Sessions opened and locks granted (by token) in batches not yet committed, with the batch,
  // and the same in the order they were appended (for forgetting them once committed).
  absl::flat_hash_map<SessionId, uint64_t> opened_in_;
  std::deque<std::pair<uint64_t, SessionId>> opened_order_;
  absl::flat_hash_map<FenceToken, uint64_t> granted_in_;
  std::deque<std::pair<uint64_t, FenceToken>> granted_order_;
};

void ServerCore::Impl::AfterRequest() {
  for (WaiterOutcome& o : service_.TakeWaiterOutcomes()) {
    auto it = waiters_.find(o.waiter);
    if (it == waiters_.end()) continue;
    const WaiterRoute route = it->second;
    waiters_.erase(it);
    auto c = connections_.find(route.connection);
    if (c == connections_.end()) continue;
    if (auto q = c->second.state.queued.find(route.request_id);
        q != c->second.state.queued.end() && q->second == o.waiter) {
      c->second.state.queued.erase(q);
    }
    wire::Response resp;
    resp.set_request_id(route.request_id);
    resp.set_code(protocol::CodeFromStatus(o.status));
    if (o.status.ok()) {
      auto* reply = resp.mutable_acquire();
      reply->set_granted(true);
      reply->set_token(o.token.value());
      reply->set_ttl_ms(ToMillis(o.ttl));
      reply->set_lock(o.lock);
    } else {
      resp.set_message(std::string(o.status.message()));
    }
    Reply(route.connection, resp);
  }
  if (!gate_.empty()) log_->StartIfIdle();  // else nothing waits: see ScheduleFlush
  ScheduleFlush();
  // After a disk fault nothing expires (expiries are mutations too): the timer stays off rather
  // than waking again and again for a deadline it may not act on.
  if (!stopped_ && log_->fault() == nullptr) expiry_.ArmIfEarlier(service_.NextDeadline());
}

void ServerCore::Impl::ScheduleFlush() {
  // Flushing from a task posted behind the handlers that are already due lets every request
  // that arrived together join one batch.
  if (flush_scheduled_) return;
  flush_scheduled_ = true;
  time_->Post([this] {
    flush_scheduled_ = false;
    if (stopped_) return log_->Flush();
    // No reply waits for the pending records (a release answered before it is durable, ADR
    // 0003): they wait up to kLazyFlush for the next request's records, so that a release and
    // the acquire after it share one sync. Anything that waits flushes them at once.
    if (gate_.empty() && log_->fault() == nullptr) {
      if (lazy_flush_->armed_for() == MonoTime::Max()) {
        lazy_flush_->ArmAt(time_->Now() + kLazyFlush, [this] { log_->Flush(); });
      }
      return;
    }
    // The grant path comes here every round: a timer that is not armed is left alone.
    if (lazy_flush_->armed_for() != MonoTime::Max()) lazy_flush_->Cancel();
    log_->Flush();
  });
}

void ServerCore::Impl::OnExpiryDue() {
  if (stopped_ || log_->fault() != nullptr) return;
  NoticeStall();
  service_.Advance(time_->Now());
  AfterRequest();
  expiry_.ArmFor(service_.NextDeadline());
}

void ServerCore::Impl::OnStall(absl::Duration gap) {
  ++stalls_total_;
  service_.PostponeLeases(gap);
  // Every expiry moved later: wake for the new earliest one.
  if (!stopped_ && log_->fault() == nullptr) expiry_.ArmFor(service_.NextDeadline());
  options_.log(absl::StrCat("did not run for ", absl::FormatDuration(gap),
                            " (frozen, suspended or starved of CPU); every session, lock "
                            "lease, provisional pool lease and pool demand is extended by that "
                            "much"));
}

void ServerCore::Impl::OnHelloTimeout(ConnectionId id) {
  auto it = connections_.find(id);
  if (it == connections_.end() || it->second.state.hello_done || it->second.closing) return;
  CountProtocolError();
  wire::Response r;
  r.set_code(wire::HELLO_REQUIRED);
  r.set_message(absl::StrCat("no Hello within ", absl::FormatDuration(options_.connections.hello_timeout),
                             " of connecting (lockd --hello-timeout)"));
  ReplyAndClose(id, r);
}

bool ServerCore::Impl::HasWork(ConnectionId id, const Conn& c) const {
  if (!c.state.queued.empty() || gate_.held(id) > 0) return true;
  auto open = [&](SessionId s) { return service_.state().FindSession(s) != nullptr; };
  return std::any_of(c.state.sessions.begin(), c.state.sessions.end(), open) ||
         std::any_of(c.state.renewed.begin(), c.state.renewed.end(), open);
}

void ServerCore::Impl::OnIdleCheck(ConnectionId id) {
  auto it = connections_.find(id);
  if (it == connections_.end() || it->second.closing || stopped_) return;
  Conn& c = it->second;
  const MonoTime now = time_->Now();
  const MonoTime idle_at = c.last_request_at + options_.connections.idle_timeout;
  if (now < idle_at) {
    c.timer->ArmAt(idle_at, [this, id] { OnIdleCheck(id); });
    return;
  }
  if (HasWork(id, c)) {
    // Its sessions' keep-alives may come less often than the idle timeout: look again later.
    c.timer->ArmAt(now + options_.connections.idle_timeout, [this, id] { OnIdleCheck(id); });
    return;
  }
  ++stats_.connections_closed_idle_total;
  wire::Response r;
  r.set_code(wire::UNAVAILABLE);
  r.set_message(absl::StrCat("closing an idle connection: no request for ",
                             absl::FormatDuration(options_.connections.idle_timeout),
                             " and no open session or queued acquire on it (lockd --idle-timeout)"));
  ReplyAndClose(id, r);
}

void ServerCore::Impl::OnCommitFault(const absl::Status& status) {
  const std::string message =
      absl::StrCat("lockd could not make this durable (", status.message(),
                   ") and stopped taking requests; ", leadership_->FaultRemedy());
  // Nothing held back was committed: none of it may be acknowledged.
  for (const auto& [id, request_id] : gate_.TakeAll()) {
    wire::Response r;
    r.set_request_id(request_id);
    r.set_code(wire::UNAVAILABLE);
    r.set_message(message);
    Deliver(id, EncodeFrame(r, options_.connections.max_frame_bytes));
  }
  service_.FailAllWaiters(absl::UnavailableError(message));
  AfterRequest();
  expiry_.Stop();
  if (leadership_->leased() && !ending_reported_ && options_.on_ending_fault) {
    ending_reported_ = true;
    options_.on_ending_fault(status);
  }
}

void ServerCore::Impl::FillStats(wire::StatsReply* stats) const {
  // After a disk fault memory may hold changes that never became durable: the figures of the
  // state (sessions, holders, waiters, the last token and lsn) are left out; the counters stay.
  const bool show_state = log_->fault() == nullptr;
  if (show_state) {
    stats->set_sessions(service_.state().session_count());
    stats->set_locks_held(service_.state().held_lock_count());
    stats->set_waiters(service_.waiter_count());
    stats->set_last_token(service_.state().last_token().value());
    stats->set_last_lsn(log_->last_lsn());
  }
  stats->set_storage(log_->Describe());
  stats->set_depositions_total(options_.depositions);
  stats->set_last_deposition(options_.last_deposition);
  if (const MonoTime until = leadership_->ServesUntil(); until != MonoTime::Max()) {
    const absl::Duration left = std::max(until - time_->Now(), absl::ZeroDuration());
    stats->set_ownership_left_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(left)));
  }
  // Every counter by its Prometheus name; the lock rules' and the core's, which GetStats has
  // always had fields for, in the field of the same name too (the pools' names are not theirs:
  // the pools' grants_total is not the locks').
  const google::protobuf::Descriptor* descriptor = stats->GetDescriptor();
  const google::protobuf::Reflection* reflection = stats->GetReflection();
  auto fill = [&](const CounterRef& c, bool named) {
    wire::CounterValue* value = stats->add_counters();
    value->set_name(c.metric);
    value->set_value(c.value);
    const google::protobuf::FieldDescriptor* field =
        named ? descriptor->FindFieldByName(c.field) : nullptr;
    if (field != nullptr && field->type() == google::protobuf::FieldDescriptor::TYPE_UINT64 &&
        !field->is_repeated()) {
      reflection->SetUInt64(stats, field, c.value);
    }
  };
  const CoreStats counted = this->stats();
  counted.service.ForEach([&](const CounterRef& c) { fill(c, true); });
  counted.pools.ForEach([&](const CounterRef& c) { fill(c, false); });
  counted.ForEach([&](const CounterRef& c) { fill(c, true); });
  const CommitLogStats log = log_->stats();
  stats->set_log_syncs_total(log.commits);
  stats->set_log_records_total(log.records);
  stats->set_log_bytes_total(log.bytes);
  stats->set_wal_segment(log.segment);
  stats->set_snapshots_total(log.snapshots);
  stats->set_log_sync_ns_total(static_cast<uint64_t>(log.total_commit_ns));
  stats->set_term(log.term);
  stats->set_commit_retries_total(log.commit_retries);
  for (const StoreMember& m : leadership_->Members()) {
    wire::StoreMemberInfo* info = stats->add_store_members();
    info->set_endpoint(m.endpoint);
    info->set_reachable(m.reachable);
    info->set_leader(m.leader);
    info->set_raft_index(m.raft_index);
    info->set_db_bytes(m.db_bytes);
    info->set_error(m.error);
  }
  if (const absl::Status* fault = log_->fault()) stats->set_disk_fault(fault->ToString());
}

ServerCore::ServerCore(const CoreOptions& options, TimeSource* time, OpenedCommitLog opened)
    : impl_(std::make_unique<Impl>(options, time, std::move(opened))) {}
ServerCore::~ServerCore() = default;
void ServerCore::Start() { impl_->Start(); }
void ServerCore::Stop() { impl_->Stop(); }
void ServerCore::SetPermissions(Permissions permissions) {
  impl_->SetPermissions(std::move(permissions));
}

ConnectionId ServerCore::Connect(ConnectionSink* sink, std::string identity) {
  return impl_->Connect(sink, std::move(identity));
}
void ServerCore::Receive(ConnectionId id, std::span<const std::string> payloads) {
  impl_->Receive(id, payloads);
}
void ServerCore::RejectStream(ConnectionId id, int code, const std::string& message) {
  impl_->RejectStream(id, code, message);
}
void ServerCore::Disconnect(ConnectionId id) { impl_->Disconnect(id); }
size_t ServerCore::HeldReplies(ConnectionId id) const { return impl_->HeldReplies(id); }
void ServerCore::CountTransportEvent(TransportEvent event) { impl_->CountTransportEvent(event); }
const LockService& ServerCore::service() const { return impl_->service_ref(); }
const CommitLog& ServerCore::log() const { return impl_->log(); }
const Leadership& ServerCore::leadership() const { return impl_->leadership(); }
CoreStats ServerCore::stats() const { return impl_->stats(); }
void ServerCore::FillStats(wire::StatsReply* stats) const { impl_->FillStats(stats); }

}  // namespace fencelock::server
