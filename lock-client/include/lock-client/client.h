// The lock client that worker code links: one session with lockd, exclusive and shared locks
// with fencing tokens, a background heartbeat, and a conservative local lease (ADR-006, see
// docs/adr/0001-conservative-client-lease.md; shared locks and the lock delay: ADR 0006).
//
// The client never trusts the server's clock or a reply's arrival time. For every exchange
// that renews a lease it reads its own boot-time clock immediately before the request is
// written (t_send) and computes
//
//     deadline = t_send + ttl × (1 − safety_margin)
//
// A failed or timed-out exchange never extends a deadline; a later success never moves it
// earlier than an earlier success did; once a deadline passes, or the server says the session
// or lock is gone, the lock is lost for good. checkStillHeld() compares against that deadline
// locally. The lease only buys quiet: safety comes from the fences that check the token
// (lockd's Validate/Release, and the resource's own fence).
//
// Typical use:
//
//   auto client = fencelock::Client::Create({.server = "127.0.0.1:7420"});
//   auto lock = (*client)->acquire("payout-42", absl::Seconds(10));
//   if (!lock.ok()) ...;
//   (*client)->checkStillHeld(*lock);          // throws LockLostException
//   rail.Submit(payout, lock->token());        // the resource fences on the token
//   (*client)->release(*lock);
#ifndef FENCELOCK_LOCK_CLIENT_CLIENT_H_
#define FENCELOCK_LOCK_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/export.h"
#include "clock/clock.h"
#include "metrics/metrics.h"
#include "protocol/defaults.h"

namespace fencelock {

namespace client_internal {
class LeaseState;
class ClientAnchor;
}  // namespace client_internal

// Why a lock is no longer held.
enum class LossReason : uint8_t {
  kNone = 0,
  kDeadlinePassed,  // the client's conservative deadline ran out
  kFencedOut,       // the server answered that the token no longer holds the lock
  kSessionLost,     // the server answered that the session is gone
  kReleased,        // the caller released it
  kEmptyHandle,     // the handle never held a lock
  // Not a loss: the step the caller was about to start needs more lease than is left
  // (StepRefusedException).
  kInsufficientLease,
  // Not a loss either: server confirmation (FR-13) was asked for and lockd could not be
  // reached; the lock may still be held, but the caller cannot know.
  kUnconfirmed,
};

// The name of a LossReason, for messages and logs ("deadline_passed", ...).
FENCELOCK_API const char* LossReasonName(LossReason reason);

// The level of one of the client's log lines (ClientOptions::log).
enum class LogLevel : uint8_t { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
// "debug", "info", "warning", "error".
FENCELOCK_API const char* LogLevelName(LogLevel level);

// Thrown by Client::checkStillHeld when the caller may no longer hold the lock. Deliberately an
// exception: losing the lock must unwind the critical section and must not be ignorable.
class FENCELOCK_API LockLostException : public std::runtime_error {
 public:
  LockLostException(std::string lock, uint64_t token, LossReason reason,
                    const std::string& message)
      : std::runtime_error(message), lock_(std::move(lock)), token_(token), reason_(reason) {}
  const std::string& lock() const { return lock_; }
  uint64_t token() const { return token_; }
  LossReason reason() const { return reason_; }

 private:
  std::string lock_;
  uint64_t token_;
  LossReason reason_;
};

// The worst-case duration of one irreversible step, declared before the step starts (D4).
struct FENCELOCK_API StepCost {
  std::string name;           // for messages and the abandoned-step counter's label
  absl::Duration worst_case;  // how long the step can take, at most

  // A hop whose reply the caller waits for at most `read_timeout`.
  static StepCost Hop(std::string name, absl::Duration read_timeout) {
    return {std::move(name), read_timeout};
  }
  // Submitting to the payment rail: its read timeout plus 2 s (ADR-006 D4).
  static StepCost RailSubmit(absl::Duration rail_read_timeout) {
    return {"rail_submit", rail_read_timeout + absl::Seconds(2)};
  }
};

// Thrown by Client::beginIrreversibleStep when the lease left does not cover the step. It is a
// LockLostException so that the same handler abandons the critical section; the lock itself
// may still be held (reason() is kInsufficientLease) and is best released.
class FENCELOCK_API StepRefusedException : public LockLostException {
 public:
  StepRefusedException(std::string lock, uint64_t token, const std::string& message,
                       std::string step, absl::Duration remaining, absl::Duration cost)
      : LockLostException(std::move(lock), token, LossReason::kInsufficientLease, message),
        step_(std::move(step)),
        remaining_(remaining),
        cost_(cost) {}
  const std::string& step() const { return step_; }
  absl::Duration remaining() const { return remaining_; }
  absl::Duration cost() const { return cost_; }

 private:
  std::string step_;
  absl::Duration remaining_;
  absl::Duration cost_;
};

// ADR 0006: shared holders of a lock coexist; an exclusive holder excludes every other holder.
// A shared holder keeps the same deadline, checkStillHeld and step rules as an exclusive one.
enum class LockMode { kExclusive, kShared };

// How an acquire wants its lock: Client::acquire(lock, wait, options) and its other forms.
struct AcquireOptions {
  LockMode mode = LockMode::kExclusive;
  // The lease TTL; zero: ClientOptions::default_lock_ttl.
  absl::Duration ttl = absl::ZeroDuration();
  // ADR 0006: after this holder is lost (its lease ran out or its session ended on lockd; not
  // a release), lockd grants the lock to nobody for this long (a lost shared holder delays
  // exclusive grants only), for resources that cannot check a token. Unset: lockd's
  // --lock-delay; above lockd's --max-lock-delay: kInvalidArgument.
  std::optional<absl::Duration> lock_delay;
};

// A granted lock: its name, its fencing token, and the client's deadline for it. Copies share
// the same lease (releasing through one ends them all). The deadline travels with the handle;
// there is no thread-local or ambient "current lock". Thread-safe to read from any thread.
class FENCELOCK_API LockHandle {
 public:
  LockHandle() = default;  // holds nothing; checkStillHeld throws kEmptyHandle
  const std::string& lock() const;
  // The fencing token: strictly greater than every token issued before this grant.
  uint64_t token() const;
  // The mode it was granted in (kExclusive for an empty handle).
  LockMode mode() const;

 private:
  friend class ClientImpl;
  explicit LockHandle(std::shared_ptr<client_internal::LeaseState> state)
      : state_(std::move(state)) {}
  std::shared_ptr<client_internal::LeaseState> state_;
};

struct FENCELOCK_API ClientOptions {
  // lockd's address: "host:port" for TCP or "unix:/path" for a Unix socket; or, for lockd
  // replicas on one etcd prefix (docs/high-availability.md), "a:7420,b:7420,c:7420": the
  // client connects to the one that serves and, when it is lost, to the next, where it resumes
  // its session. Default: "127.0.0.1:7420".
  std::string server = "127.0.0.1:7420";
  // lock.session.ttl: the session's TTL on the server. Default: 15 s.
  absl::Duration session_ttl = defaults::kSessionTtl;
  // lock.default.ttl: lease TTL for acquires that do not give one. Default: 30 s.
  absl::Duration default_lock_ttl = defaults::kLockTtl;
  // lock.client.safety-margin: the fraction of every lease the client refuses to use, in
  // (0, 1). Default: 0.30.
  double safety_margin = defaults::kSafetyMargin;
  // Period of the background heartbeat. Default: zero, meaning a third of the shortest TTL in
  // play (the session's and the held locks'), shortened when `steps` are declared so that the
  // lease left just before a renewal still covers the costliest step with room for one more
  // period: at most (shortest TTL × (1 − margin) − costliest step) / 2.
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  // How long one request may wait for its reply (a hop's read timeout). Default: 5 s.
  absl::Duration request_timeout = absl::Seconds(5);
  // TLS for a TCP address (docs/security.md): the CA that lockd's certificate must chain to,
  // and this client's certificate and key, all PEM files. All three or none; a unix: address
  // takes none (lockd knows its peers there by uid). Create() refuses files that do not load,
  // a key that does not belong to the certificate, and an expired certificate. Default: none,
  // plaintext TCP (which lockd serves on loopback only). Certificate rotation: when a file has
  // changed, the next connection the client makes (a reconnect) loads them again; files that do
  // not load are logged (kWarning) and the ones loaded before are used.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // The name lockd's certificate must carry. Default: empty, the host of `server`.
  std::string tls_server_name;
  // How long connecting (TCP or Unix connect, any TLS handshake, and Hello) may take.
  // Default: 5 s.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Source of t_send and "now" for every lease decision, and for every time the client counts:
  // request timeouts, the heartbeat period, retry backoff (only a single connect attempt's
  // timeout runs on the monotonic clock). Default: nullptr, the real boot-time clock
  // (CLOCK_BOOTTIME). Tests pass a SimulatedClock; it must outlive the client.
  Clock* clock = nullptr;
  // Name sent in Hello, for the server's logs. Default: "fencelock-client".
  std::string client_name = "fencelock-client";
  // The irreversible steps the caller will declare to beginIrreversibleStep. Create() refuses a
  // configuration whose usable lease, min(session TTL, lock TTL) × (1 − margin), is not larger
  // than the costliest of them: no such step could ever start. Default: none.
  std::vector<StepCost> steps;
  // FR-13: checkStillHeld(handle) also confirms with lockd, blocking for one Validate hop whose
  // measured time counts against the lease. Default: false (a local comparison only).
  bool confirm_with_server = false;
  // Where the client records its metrics (docs/metrics.md). Default: nullptr, a registry of
  // the client's own, available from Client::metrics() to serve or read.
  std::shared_ptr<metrics::Registry> metrics;
  // Receives the client's log lines with their level. kInfo: a session opened, resumed on a
  // new connection, or renewed again after failed heartbeats. kWarning: heartbeats started to
  // fail, a session or a lock was lost (and why), the margin-revisit trigger (ADR-006 6.5), a
  // ScopedLock's failed release. Called from the I/O thread the process's Clients share, or
  // from a thread inside a call of the client, every line whatever `log_level` says; must not
  // block, nor call the client. Default: nullptr, timestamped lines through spdlog on
  // standard error ("2026-12-01T19:30:00.123456Z warning fencelock-client: ...").
  std::function<void(LogLevel, const std::string&)> log;
  // The least level the default log writes. Default: kWarning, so that a process with many
  // Clients stays quiet while nothing goes wrong (kInfo adds each session opened or resumed,
  // and heartbeats answered again after failures).
  LogLevel log_level = LogLevel::kWarning;
};

enum class Confirm { kLocal, kWithServer };

class Client;

// An acquire started with Client::acquireAsync. Thread-safe; may outlive the client (cancel()
// then does nothing).
class FENCELOCK_API PendingAcquire {
 public:
  virtual ~PendingAcquire() = default;
  // Gives up the acquire. If it waits in the lock's queue, lockd takes it out (WithdrawAcquire;
  // a lockd older than protocol version 3 keeps it until its wait runs out). Its callback gets
  // kCancelled. A grant that crosses the cancellation on the wire is released by the client,
  // never handed to the callback. Returns false, and does nothing, if the acquire has already
  // completed or been cancelled.
  virtual bool cancel() = 0;
};

// A lock held for a scope. Move-only; destroying it releases the lock if this guard still
// holds it, and a release that fails is reported to the client's log sink (ClientOptions::log),
// never thrown. A lock already lost (deadline passed, fenced out) is given back the same way
// release() gives it back. A guard that outlives its Client holds nothing any more (the
// client closed its session, and lockd released the lock with it): checkStillHeld throws
// (kReleased), remaining() is zero, release() returns kFailedPrecondition saying so, and its
// destruction does nothing. Get one from Client::acquireScoped or Client::tryAcquireScoped.
class FENCELOCK_API ScopedLock {
 public:
  ScopedLock() = default;  // holds nothing
  ScopedLock(ScopedLock&& other) noexcept;
  // Releases what this guard held, then takes over `other`'s lock.
  ScopedLock& operator=(ScopedLock&& other) noexcept;
  ScopedLock(const ScopedLock&) = delete;
  ScopedLock& operator=(const ScopedLock&) = delete;
  ~ScopedLock();

  // True until release() or a move: the guard will release on destruction. The lock itself
  // may already be lost; checkStillHeld says.
  bool owns() const { return client_ != nullptr; }
  // The handle, for the calls that take one (copies of it see the guard's release).
  const LockHandle& handle() const { return handle_; }
  const std::string& lock() const { return handle_.lock(); }
  uint64_t token() const { return handle_.token(); }
  // Client::checkStillHeld, beginIrreversibleStep and remaining for this lock. On a guard that
  // owns nothing they behave as for an empty handle.
  void checkStillHeld() const;
  void beginIrreversibleStep(const StepCost& step) const;
  absl::Duration remaining() const;
  // Releases now and returns the outcome (Client::release); the destructor then does nothing.
  // kFailedPrecondition on a guard that owns nothing.
  absl::Status release();

 private:
  friend class Client;
  ScopedLock(std::shared_ptr<client_internal::ClientAnchor> client, LockHandle handle)
      : client_(std::move(client)), handle_(std::move(handle)) {}
  // The client it came from, for as long as that lives; nullptr once released or moved from.
  std::shared_ptr<client_internal::ClientAnchor> client_;
  LockHandle handle_;
};

// One session with lockd. All methods are thread-safe. Blocking methods block the calling
// thread only. The Clients of a process share one I/O thread, which also runs their
// heartbeats, and per lockd replica one connection (up to 64 sessions each); a Client starts a
// thread of its own only for onLost callbacks, and one for the asynchronous calls' callbacks.
class FENCELOCK_API Client {
 public:
  // Connects, negotiates the protocol version and opens a session. Returns kInvalidArgument for
  // bad options (the message names the value), kUnavailable when lockd cannot be reached,
  // kFailedPrecondition when it speaks no common protocol version.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);

  // Closes the session (lockd releases every lock it holds and grants waiters) and stops the
  // client's own threads. Blocks for at most one request timeout. May be called from one of the
  // client's own callbacks (onLost, the asynchronous calls' `done`): the callbacks still
  // pending are then dropped (onLost) or run with kCancelled after it returns (`done`).
  virtual ~Client() = default;

  // Waits up to `wait` for `lock` and returns it with a fresh token; `ttl` zero means the
  // default lock TTL. Errors: kDeadlineExceeded when the wait ran out, kUnavailable when lockd
  // cannot be reached, kInvalidArgument for a bad name or TTL or a lock this session already
  // holds. If the grant arrives so late that less than one heartbeat period of lease would be
  // left, the lease is renewed before returning and measured from that renewal's send. If the
  // client's own deadline for the session has already passed (failed heartbeats, a stall),
  // the session is renewed before the request, or replaced if lockd no longer has it.
  absl::StatusOr<LockHandle> acquire(std::string_view lock, absl::Duration wait,
                                     absl::Duration ttl = absl::ZeroDuration()) {
    return acquire(lock, wait, AcquireOptions{.ttl = ttl});
  }
  // acquire() in `options.mode`, with its lock delay. A shared acquire waits while another
  // session holds the lock exclusive, and while anyone waits before it (FIFO: it never passes
  // a waiting writer); a lockd older than protocol version 5 refuses a shared acquire or a
  // lock delay with kFailedPrecondition, and nothing is sent.
  virtual absl::StatusOr<LockHandle> acquire(std::string_view lock, absl::Duration wait,
                                             const AcquireOptions& options) = 0;
  // acquire() in shared mode.
  absl::StatusOr<LockHandle> acquireShared(std::string_view lock, absl::Duration wait,
                                           absl::Duration ttl = absl::ZeroDuration()) {
    return acquire(lock, wait, AcquireOptions{.mode = LockMode::kShared, .ttl = ttl});
  }

  // Like acquire() without waiting: std::nullopt when the lock cannot be granted at once
  // (another session holds it in a mode that excludes this one, someone waits for it, or a
  // lock delay holds it back).
  absl::StatusOr<std::optional<LockHandle>> tryAcquire(
      std::string_view lock, absl::Duration ttl = absl::ZeroDuration()) {
    return tryAcquire(lock, AcquireOptions{.ttl = ttl});
  }
  virtual absl::StatusOr<std::optional<LockHandle>> tryAcquire(std::string_view lock,
                                                               const AcquireOptions& options) = 0;
  absl::StatusOr<std::optional<LockHandle>> tryAcquireShared(
      std::string_view lock, absl::Duration ttl = absl::ZeroDuration()) {
    return tryAcquire(lock, AcquireOptions{.mode = LockMode::kShared, .ttl = ttl});
  }

  // acquire() and tryAcquire() returning a ScopedLock, which releases the lock at the end of
  // its scope.
  absl::StatusOr<ScopedLock> acquireScoped(std::string_view lock, absl::Duration wait,
                                           absl::Duration ttl = absl::ZeroDuration()) {
    return acquireScoped(lock, wait, AcquireOptions{.ttl = ttl});
  }
  absl::StatusOr<ScopedLock> acquireScoped(std::string_view lock, absl::Duration wait,
                                           const AcquireOptions& options);
  absl::StatusOr<ScopedLock> acquireSharedScoped(std::string_view lock, absl::Duration wait,
                                                 absl::Duration ttl = absl::ZeroDuration()) {
    return acquireScoped(lock, wait, AcquireOptions{.mode = LockMode::kShared, .ttl = ttl});
  }
  absl::StatusOr<std::optional<ScopedLock>> tryAcquireScoped(
      std::string_view lock, absl::Duration ttl = absl::ZeroDuration()) {
    return tryAcquireScoped(lock, AcquireOptions{.ttl = ttl});
  }
  absl::StatusOr<std::optional<ScopedLock>> tryAcquireScoped(std::string_view lock,
                                                             const AcquireOptions& options);
  absl::StatusOr<std::optional<ScopedLock>> tryAcquireSharedScoped(
      std::string_view lock, absl::Duration ttl = absl::ZeroDuration()) {
    return tryAcquireScoped(lock, AcquireOptions{.mode = LockMode::kShared, .ttl = ttl});
  }

  // Releases the lock. The handle is lost from this call on, whatever the answer. A heartbeat
  // that already names this lock is written to the connection before the Release, so that
  // lockd never sees a renewal of a released token; release waits for that write, never for
  // the heartbeat's answer. Returns
  // kAborted (FENCED_OUT) when the token no longer held the lock, kUnavailable when lockd could
  // not be reached (the server then frees it when the lease runs out). A handle the client
  // already knows is lost (deadline passed, fenced out, session lost) gets kAborted naming the
  // reason without a stale request: after a passed deadline the lock is relinquished, which
  // neither side counts (lockd's lock_fenced_out_total, the client's
  // lock_client_fenced_out_total), so a paused worker that wakes up, sees its
  // loss and cleans up leaves the must-be-zero counter at zero.
  virtual absl::Status release(const LockHandle& handle) = 0;

  // release() for loops that make another request at once (the next acquire, say): the
  // Release is not written by this call but with this client's next request, in one write, so
  // that lockd reads and commits the two together and a lock cycle costs one round trip, not
  // two. Nothing waits for lockd's answer to it. If no request follows, the next heartbeat
  // carries it (within a heartbeat period, a third of the TTL or less); if the connection fails
  // first, lockd frees the lock when its lease runs out. The handle is lost from this call on,
  // as with release(). lockd's answer is read with the next reply this client reads; a
  // FENCED_OUT one is counted (lock_client_fenced_out_total) and logged as a warning, since
  // nobody is told otherwise. Returns what release() returns without a request (an empty
  // handle, a lock already lost), or kUnavailable when not connected; otherwise OK.
  virtual absl::Status releaseWithNextRequest(const LockHandle& handle) = 0;

  // Returns normally if the caller may still hold the lock; throws LockLostException otherwise.
  // A local comparison with the handle's deadline: no network call, no allocation, no waiting
  // on the heartbeat. A liveness narrowing, not a guarantee: the lease can lapse right after.
  virtual void checkStillHeld(const LockHandle& handle) const = 0;

  // FR-13 on demand: with Confirm::kWithServer, after the local check, asks lockd whether the
  // token still holds the lock (one Validate hop), then checks the deadline again at the end of
  // the hop. Throws LockLostException with kFencedOut (lost for good) if lockd says no, with
  // kUnconfirmed if lockd could not answer within the request timeout, with kDeadlinePassed if
  // the hop used up the lease. Confirm::kLocal is checkStillHeld(handle).
  virtual void checkStillHeld(const LockHandle& handle, Confirm confirm) const = 0;

  // D4, do not start what you cannot finish: call right before an irreversible step. Returns
  // normally if the lease left is strictly larger than step.worst_case; throws
  // StepRefusedException otherwise, and LockLostException if the lock is already lost. Either
  // way the refusal is counted (lock_steps_abandoned_total{step,reason}). No network call.
  virtual void beginIrreversibleStep(const LockHandle& handle, const StepCost& step) const = 0;

  // Lease left before the handle's deadline; zero once lost. Never blocks.
  virtual absl::Duration remaining(const LockHandle& handle) const = 0;

  // The 99th percentile of the last 128 heartbeat round trips (zero before the first).
  virtual absl::Duration heartbeatRttP99() const = 0;

  // The registry holding this client's metrics.
  virtual std::shared_ptr<metrics::Registry> metrics() const = 0;

  // Loss notification. Calls `on_lost(reason)` once when `handle`'s lock stops being held for
  // any reason but its release by this client:
  //   - kDeadlinePassed: the client's deadline for it passed. A timer on the client's clock
  //     fires at that moment, not at the next heartbeat or checkStillHeld;
  //   - kFencedOut: lockd answered that its token no longer holds the lock;
  //   - kSessionLost: lockd answered that the session is gone.
  // Never for a lock released through release() or a ScopedLock (even if the deadline passes
  // afterwards), never twice. A handle already lost gets its call at once. The call runs on the
  // client's own callback thread (the asynchronous calls' callbacks run there too), one at a
  // time: it must not block for long. It may destroy the client; callbacks still pending when
  // the client is destroyed are dropped without a call. kInvalidArgument for an empty handle or an empty callback.
  virtual absl::Status onLost(const LockHandle& handle,
                              std::function<void(LossReason)> on_lost) = 0;
  // onLost as a future: ready with the reason when the lock is lost. For a lock that is
  // released instead, or when the client is destroyed first, the future ends with
  // std::future_error (broken_promise) rather than a reason. An empty handle gives a future
  // that is ready at once with kEmptyHandle.
  virtual std::future<LossReason> whenLost(const LockHandle& handle) = 0;

  // Runs one heartbeat exchange now (renews the session and every held lock) and blocks until
  // it is answered or times out. Deadlines move only on success, measured from this send.
  virtual absl::Status renewNow() = 0;

  // The current session's id on the server (0 while there is none).
  virtual uint64_t sessionId() const = 0;

  // The asynchronous forms, for event loops; lock-client/async.h adapts them to Asio completion
  // tokens (coroutines, callbacks, futures). The blocking calls above are built on the same
  // requests, reply handling and lease arithmetic (the client core). None of these blocks the
  // calling thread: what takes several exchanges (reconnecting, renewing a session whose lease
  // ran short, renewing a grant that queued for so long that less than a heartbeat period of
  // lease is left) goes on as replies arrive on the shared I/O thread. `done` is called exactly once, on the client's callback thread, one
  // callback at a time, never from within the call that started or cancelled the operation; it
  // should not block for long. Operations still pending when the client is destroyed complete
  // with kCancelled before the destructor returns.
  //
  // acquire() without blocking: `done` gets the handle, or acquire's errors, or kCancelled
  // after PendingAcquire::cancel(). `wait` must be positive (kInvalidArgument otherwise).
  std::shared_ptr<PendingAcquire> acquireAsync(
      std::string_view lock, absl::Duration wait, absl::Duration ttl,
      std::function<void(absl::StatusOr<LockHandle>)> done) {
    return acquireAsync(lock, wait, AcquireOptions{.ttl = ttl}, std::move(done));
  }
  // acquire(lock, wait, options) without blocking.
  virtual std::shared_ptr<PendingAcquire> acquireAsync(
      std::string_view lock, absl::Duration wait, const AcquireOptions& options,
      std::function<void(absl::StatusOr<LockHandle>)> done) = 0;
  std::shared_ptr<PendingAcquire> acquireSharedAsync(
      std::string_view lock, absl::Duration wait, absl::Duration ttl,
      std::function<void(absl::StatusOr<LockHandle>)> done) {
    return acquireAsync(lock, wait, AcquireOptions{.mode = LockMode::kShared, .ttl = ttl},
                        std::move(done));
  }
  // release() without blocking: `done` gets release's outcome.
  virtual void releaseAsync(const LockHandle& handle, std::function<void(absl::Status)> done) = 0;
  // One heartbeat now, as renewNow() does, then whether `handle` is still held: OK; kAborted
  // naming why it is not (fenced out, deadline passed, released); or the heartbeat's error
  // (kUnavailable, kDeadlineExceeded) while it is held but lockd did not answer.
  // kInvalidArgument for an empty handle.
  virtual void renewAsync(const LockHandle& handle, std::function<void(absl::Status)> done) = 0;

 private:
  friend class ScopedLock;
  // A ScopedLock's release at destruction failed: tell the client's log sink.
  virtual void reportScopedReleaseFailure(const LockHandle& handle,
                                          const absl::Status& status) const = 0;
  // What a ScopedLock holds on to: this client until it is destroyed.
  virtual std::shared_ptr<client_internal::ClientAnchor> anchor() const = 0;
};

}  // namespace fencelock

#endif  // FENCELOCK_LOCK_CLIENT_CLIENT_H_
