// The client's core: every rule of the lock client, without I/O (ADR-006 D1 to D5).
//
// One ClientCore is one Client's session with lockd: the session and its secret, the held
// leases and their deadlines, the acquires in flight (waiting for a session, settling an earlier
// relinquish, sent, renewing a late grant, withdrawn), releases and relinquishes, the heartbeat
// schedule and its backoff, the choice of replica and its redirects, reconnect and resume, and
// loss detection. It has no threads, no sleeps, no locks and no clock: every call takes `now`,
// read by the caller from the client's monotonic clock just before the call, and everything the
// core wants done comes back from TakeActions(): a replica to dial, connections to close,
// requests to write (in order), operations completed, leases lost, log lines. NextWakeup() says
// when OnTick() is due next.
//
// D2 on a core without I/O: the t_send of a request is the `now` of the call that emitted it.
// The runtime writes what TakeActions() returns after that call; a write that comes later only
// makes the deadline earlier than it could be, never later.
//
// The transport below (the client runtime's connections, or the simulator's network) dials,
// runs Hello (protocol/session.h), and reports back with OnDialed / OnDialFailed; it hands every
// Response of a connection to OnResponse, and its end to OnDisconnected. Requests carry ids from
// CoreOptions::next_request_id, unique on the connection (a runtime whose Clients share one
// connection passes one counter to all of them).
//
// Not thread-safe: one caller at a time (the runtime serializes calls). LeaseState objects it
// hands out are thread-safe, so that checkStillHeld reads them without the core.
#ifndef FENCELOCK_LOCK_CLIENT_CORE_CLIENT_CORE_H_
#define FENCELOCK_LOCK_CLIENT_CORE_CLIENT_CORE_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "clock/clock.h"
#include "fencelock/wire.pb.h"
#include "lock-client/core/indices.h"
#include "lock-client/core/lease.h"
#include "metrics/metrics.h"
#include "protocol/defaults.h"

namespace fencelock::client_core {

using client_internal::LeaseState;
using client_internal::SessionRenewal;

struct CoreOptions {
  // lockd's addresses: one, or the replicas on one etcd prefix. Never empty.
  std::vector<std::string> replicas;
  absl::Duration session_ttl = defaults::kSessionTtl;
  absl::Duration default_lock_ttl = defaults::kLockTtl;
  double safety_margin = defaults::kSafetyMargin;
  // Zero: a third of the shortest TTL in play, shortened for the costliest step (see
  // HeartbeatInterval()).
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  absl::Duration request_timeout = absl::Seconds(5);
  // A dial round (every replica once) gives up after this.
  absl::Duration connect_timeout = absl::Seconds(5);
  // The costliest step the caller declared (D4); zero for none.
  absl::Duration costliest_step = absl::ZeroDuration();
  // Request ids, unique on every connection this core's requests travel on. Default: the
  // core's own counter from 1.
  std::function<uint64_t()> next_request_id;
  // Where the core records its metrics (docs/metrics.md). Default: a registry of its own.
  std::shared_ptr<metrics::Registry> metrics;
};

// A dial the core asks for: connect to `address` (replicas[replica]), run Hello, and answer
// with OnDialed or OnDialFailed, within `timeout`.
struct Dial {
  size_t replica = 0;
  std::string address;
  absl::Duration timeout;
};

struct Outgoing {
  uint64_t conn = 0;
  wire::Request request;
};

// An operation's outcome. For an acquire: `lease` is the grant, or nullptr for a try-acquire
// that found the lock held (status OK), or the error.
struct Completion {
  uint64_t op = 0;
  absl::Status status;
  std::shared_ptr<LeaseState> lease;
};

struct LogLine {
  LogLevel level = LogLevel::kInfo;
  std::string message;
};

struct Actions {
  std::optional<Dial> dial;
  std::vector<uint64_t> close;  // connections to close (their end is not reported back)
  std::vector<Outgoing> sends;  // in this order, each connection's requests in one write
  std::vector<Completion> completions;
  // Leases that stopped being held for any reason but their release (deadline passed, fenced
  // out, session lost), each once, when the core saw it.
  std::vector<std::shared_ptr<LeaseState>> lost;
  std::vector<LogLine> logs;
  bool empty() const {
    return !dial && close.empty() && sends.empty() && completions.empty() && lost.empty() &&
           logs.empty();
  }
};

class ClientCore {
 public:
  explicit ClientCore(CoreOptions options);
  ClientCore(const ClientCore&) = delete;
  ClientCore& operator=(const ClientCore&) = delete;

  // Unique in the process: what the leases this core grants name as their owner.
  uint64_t id() const { return id_; }

  // ---- calls from the user; each returns an operation id whose Completion comes later ----

  // Opens the session (dialing first). Completes when it is open, or with why not.
  uint64_t Start(MonoTime now);
  // Acquires `lock` in `mode`, with `lock_delay` (unset: lockd's default; ADR 0006): `wait`
  // zero is a try. `ttl` zero means the default lock TTL. Completes with the lease, nullptr
  // (a try that found it held), or an error: kDeadlineExceeded (the wait ran out), kUnavailable
  // (lockd unreachable, or the session was lost meanwhile), kInvalidArgument, kCancelled
  // (Cancel), kFailedPrecondition (a shared lock or a delay from a lockd older than protocol 5).
  uint64_t Acquire(MonoTime now, const std::string& lock, absl::Duration wait,
                   absl::Duration ttl, LockMode mode = LockMode::kExclusive,
                   std::optional<absl::Duration> lock_delay = std::nullopt);
  // Gives up an acquire that has not completed; lockd withdraws it from the queue (protocol 3).
  // It completes with kCancelled; a grant that crosses is relinquished. False if it had already
  // completed.
  bool Cancel(MonoTime now, uint64_t op);
  // Releases `lease`. With `await`, completes with lockd's answer; without, the Release goes
  // with this core's next request (or the next heartbeat) and the operation completes at once.
  // A lease already lost completes with kAborted naming why, without a stale request (one whose
  // deadline passed is relinquished). A lease of another core: kInvalidArgument, nothing done.
  uint64_t Release(MonoTime now, const std::shared_ptr<LeaseState>& lease, bool await);
  // One heartbeat now: OK, kAborted if a lock was fenced out, kNotFound if the session is gone,
  // or why it got no answer.
  uint64_t Renew(MonoTime now);
  // FR-13: asks lockd whether `lease`'s token still holds its lock. OK, kAborted (fenced out:
  // the lease is lost; or already lost here, without a request), or why lockd did not answer.
  uint64_t Validate(MonoTime now, const std::shared_ptr<LeaseState>& lease);
  // Closes the session: every held lease ends (as released), pending acquires complete with
  // kCancelled. Completes when lockd answered, or at once when there is no session.
  uint64_t Close(MonoTime now);

  // ---- events from the transport and the timer ----

  void OnDialed(MonoTime now, size_t replica, uint64_t conn, uint32_t version);
  // `leader`: with a standby's refusal, the serving replica it named (may be empty).
  void OnDialFailed(MonoTime now, size_t replica, const absl::Status& status,
                    const std::string& leader);
  void OnDisconnected(MonoTime now, uint64_t conn);
  void OnResponse(MonoTime now, uint64_t conn, const wire::Response& response);
  // Time passed: timeouts, the heartbeat, deadlines, redials.
  void OnTick(MonoTime now);
  // When OnTick() is next due (MonoTime::Max() for never).
  MonoTime NextWakeup() const;
  // What the core wants done since the last call, in order.
  Actions TakeActions();

  // ---- reads ----

  uint64_t session_id() const { return session_id_; }
  // The connection the core uses, or 0.
  uint64_t conn() const { return link_ == Link::kUp ? conn_ : 0; }
  uint32_t version() const { return link_ == Link::kUp ? version_ : 0; }
  // The heartbeat period now (ClientOptions::heartbeat_interval).
  absl::Duration HeartbeatInterval() const { return HeartbeatIntervalWith(absl::InfiniteDuration()); }
  // The 99th percentile of the last 128 heartbeat round trips (zero before the first).
  absl::Duration RttP99() const;
  size_t held() const { return held_.size(); }
  // Entries of held leases and requests in flight looked at so far to find the next deadline,
  // timeout and heartbeat period (indices.h): what a test watches to see that the work of one
  // call does not grow with how much is held.
  uint64_t index_visits() const { return held_.visits() + pending_.visits(); }
  // Operations not completed yet.
  size_t pending_ops() const { return ops_.size(); }
  // Locks given up whose release lockd has not confirmed.
  size_t unsettled() const { return unsettled_.size(); }
  // Grants published that no answered renewal has confirmed to lockd yet (ADR 0014).
  size_t unconfirmed() const { return unconfirmed_.size(); }
  const std::shared_ptr<metrics::Registry>& metrics() const { return metrics_; }

 private:
  enum class Link { kDown, kDialing, kUp };
  enum class SessionState { kNone, kOpening, kResuming, kOpen };
  enum class OpKind { kStart, kAcquire, kRelease, kRenew, kValidate, kClose };
  // Where an acquire is.
  enum class Stage {
    kWaiting,         // for the link and the session
    kRenewingSession, // its session's lease ran short: a heartbeat first
    kSettling,        // an earlier relinquish of the same name is being confirmed
    kSent,            // the Acquire is on the wire
    kRenewingGrant,   // granted so late that it is renewed before it is handed over
    kHeartbeat,       // (kRenew) its KeepAlive is on the wire
  };
  struct Op {
    OpKind kind;
    Stage stage = Stage::kWaiting;
    std::string lock;
    absl::Duration wait;
    absl::Duration ttl;
    LockMode mode = LockMode::kExclusive;
    std::optional<absl::Duration> lock_delay;
    uint64_t session = 0;     // the session the Acquire went out under
    uint64_t request = 0;     // its request id once sent
    std::shared_ptr<LeaseState> lease;  // Validate's, and a grant being renewed
    absl::Duration granted_ttl;
    int attempts = 0;         // kRenew: sends so far
    bool session_renewed = false;  // kAcquire: its short session lease was renewed once
    bool released_orphan = false;  // kAcquire: a grant of the name it never knew was released
  };
  enum class Kind {
    kOpen, kResume, kKeepAlive, kAcquire, kGrantRenewal, kRelease, kUnawaitedRelease,
    kRelinquish, kSettle, kValidate, kWithdraw, kClose
  };
  struct Pending {
    Kind kind;
    uint64_t op = 0;           // 0: no operation waits for it
    MonoTime t_send;
    MonoTime timeout_at = MonoTime::Max();
    uint64_t session = 0;
    std::string lock;
    uint64_t token = 0;
    std::vector<std::shared_ptr<LeaseState>> renewed;  // kKeepAlive: the leases it names
    bool background = false;   // kKeepAlive: the regular heartbeat
    bool full = false;         // kKeepAlive: it names every lease held when it was sent
    bool renew_all = false;    // kKeepAlive: a Renew, naming no lease (ADR 0014)
    // kKeepAlive, a Renew: the grants it confirms (token, lock).
    std::vector<std::pair<uint64_t, std::string>> confirms;
  };
  using Held = HeldLeases::Held;
  struct Unsettled {
    uint64_t session;
    uint64_t token;
    uint64_t request = 0;  // the relinquish on the wire; 0 when it is to be (re)sent
  };

  uint64_t NewOp(OpKind kind);
  void Complete(uint64_t op, absl::Status status, std::shared_ptr<LeaseState> lease = nullptr);
  void Log(LogLevel level, std::string message);
  // Emits `request` on the link (with any deferred releases before it) and remembers it.
  uint64_t Send(MonoTime now, wire::Request request, Pending pending);
  bool Ready() const { return link_ == Link::kUp && session_state_ == SessionState::kOpen; }
  // Dials if something needs the link and no dial is under way or backed off.
  void MaybeDial(MonoTime now);
  void DialNext(MonoTime now);
  void RoundFailed(MonoTime now, const absl::Status& status);
  void CloseLink(MonoTime now, bool abandon, absl::Duration silence);
  // The next dial waits: from 20 ms, doubling up to the heartbeat period.
  void DelayRedial(MonoTime now);
  void LinkLost(MonoTime now);
  // Opens or resumes the session on a new link.
  void StartSession(MonoTime now);
  // Moves every acquire, renew and validate that can go.
  void Pump(MonoTime now);
  void PumpAcquire(MonoTime now, uint64_t id, Op& op);
  void SendAcquire(MonoTime now, uint64_t id, Op& op);
  void SendKeepAlive(MonoTime now, uint64_t op, bool background);
  void OnOpenReply(MonoTime now, const Pending& p, const wire::Response& r);
  void OnResumeReply(MonoTime now, const Pending& p, const wire::Response& r);
  void OnKeepAliveReply(MonoTime now, Pending& p, const wire::Response& r);
  void OnRenewReply(MonoTime now, Pending& p, const wire::Response& r);
  // lock_lease_remaining_seconds: the earliest deadline held, from `now`.
  void SetRemainingGauge(MonoTime now);
  // After a heartbeat's answer: the acquires that waited for it go on.
  void AfterRenewal(MonoTime now, const Pending& p, const absl::Status& status, bool answered);
  void OnAcquireReply(MonoTime now, Pending& p, const wire::Response& r);
  void OnGrantRenewalReply(MonoTime now, Pending& p, const wire::Response* r);
  void HeartbeatDone(MonoTime now, bool answered);
  void FailPending(MonoTime now, uint64_t request, Pending& p, const absl::Status& status);
  void Publish(MonoTime now, uint64_t id, Op& op, uint64_t token, MonoTime lock_deadline);
  void Relinquish(MonoTime now, uint64_t session, const std::string& lock, uint64_t token);
  void SendRelinquish(MonoTime now, const std::string& lock, Unsettled& u);
  void LoseSession(MonoTime now, LossReason reason);
  void LoseLease(const std::shared_ptr<LeaseState>& state, LossReason reason);
  void Sweep(MonoTime now);
  void CountLoss(LossReason reason);
  void RecordRtt(absl::Duration rtt);
  void RememberLate(uint64_t request_id, uint64_t session);
  void RememberReleased(const Pending& p);
  bool SessionLeaseShort(MonoTime now) const {
    return session_deadline_ - now <= options_.costliest_step;
  }
  absl::Duration KeepAliveTimeout() const;

  // The heartbeat period with one more lock of `ttl` held.
  absl::Duration HeartbeatIntervalWith(absl::Duration ttl) const;

  static uint64_t NextCoreId();

  const CoreOptions options_;
  const uint64_t id_ = NextCoreId();
  uint64_t own_request_ids_ = 0;
  uint64_t next_op_ = 0;

  // The link to a replica.
  Link link_ = Link::kDown;
  uint64_t conn_ = 0;
  size_t replica_ = 0;  // of conn_
  uint32_t version_ = 0;
  size_t preferred_ = 0;           // the replica that answered last
  size_t silent_ = SIZE_MAX;       // one that fell silent: tried last, briefly
  absl::Duration silent_timeout_;
  std::vector<size_t> round_;      // the dial round's order; round_[round_pos_] is dialing
  size_t round_pos_ = 0;
  MonoTime round_give_up_;
  std::vector<std::string> round_failures_;
  MonoTime redial_at_ = MonoTime::Min();
  absl::Duration redial_backoff_;

  SessionState session_state_ = SessionState::kNone;
  uint64_t session_id_ = 0;
  std::string secret_;
  absl::Duration session_ttl_;
  MonoTime session_deadline_ = MonoTime::Min();
  bool want_session_ = false;  // Start() or an operation asked for one

  HeldLeases held_;
  // What the session's Renews give every lease it holds (ADR 0014); null without a session.
  std::shared_ptr<SessionRenewal> renewal_;
  // The session's losses (RenewedSession.losses) as a KeepAlive naming every lease learned
  // them on this connection; until then (`renew_synced_` false) heartbeats name every lease.
  bool renew_synced_ = false;
  uint64_t losses_ = 0;
  // Grants published since a Renew or a KeepAlive that named them was answered, by token: the
  // next Renew confirms them to lockd, which renews with their session only what it confirmed.
  std::map<uint64_t, std::string> unconfirmed_;
  std::map<uint64_t, Op> ops_;
  std::deque<uint64_t> waiting_;  // ops waiting for the link and session, in call order
  TimedRequests<Pending> pending_;  // by request id, on conn_
  std::map<std::string, Unsettled> unsettled_;
  static constexpr size_t kMaxUnsettled = 4096;
  // The session's last releases that lockd answered OK: lockd answers a release before it is
  // durable (ADR 0003), so a lockd that restarts may hold them again. After a resume they are
  // given back again (relinquished), as lost relinquishes are. The newest kMaxRecentReleases.
  struct Released {
    uint64_t session;
    std::string lock;
    uint64_t token;
  };
  std::deque<Released> recent_releases_;
  static constexpr size_t kMaxRecentReleases = 64;
  // Requests given up at their timeout, with the session they named (the newest kMaxLate): a
  // late answer that the session is gone still ends it.
  std::deque<std::pair<uint64_t, uint64_t>> late_;
  static constexpr size_t kMaxLate = 64;
  std::vector<wire::Request> deferred_;  // releases that go with the next request

  // The heartbeat.
  MonoTime next_beat_ = MonoTime::Max();
  bool beat_in_flight_ = false;
  bool beat_failing_ = false;
  uint64_t beat_failures_ = 0;
  absl::Duration retry_;
  std::array<absl::Duration, 128> rtts_{};
  size_t rtt_count_ = 0;
  bool revisit_warned_ = false;

  Actions actions_;

  std::shared_ptr<metrics::Registry> metrics_;
  metrics::Counter& fenced_out_;
  metrics::Counter& heartbeat_failures_;
  metrics::Histogram& heartbeat_rtt_;
  metrics::Gauge& remaining_gauge_;
  metrics::Gauge& revisit_gauge_;
  std::array<metrics::Counter*, 8> lease_lost_{};
};

}  // namespace fencelock::client_core

#endif  // FENCELOCK_LOCK_CLIENT_CORE_CLIENT_CORE_H_
