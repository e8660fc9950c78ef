#include "lock-client/client.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "clock/monotonic_event.h"
#include "channel.h"
#include "lock-client/core/lease.h"
#include "logging/logging.h"
#include "loss_watcher.h"
#include "protocol/address.h"
#include "protocol/codes.h"
#include "protocol/version.h"
#include "task_thread.h"

namespace fencelock {

using client_internal::Channel;
using client_internal::LeaseState;
using client_internal::LossWatcher;
using client_internal::Reply;
using client_internal::TaskThread;

// What an acquire gives its completion: a handle, no grant (a try that found the lock held),
// or an error.
using AcquireResult = absl::StatusOr<std::optional<LockHandle>>;

// The public LogLevel is the logging library's Level, value for value (Log() casts one to the
// other).
static_assert(static_cast<int>(LogLevel::kDebug) == static_cast<int>(logging::Level::kDebug) &&
              static_cast<int>(LogLevel::kInfo) == static_cast<int>(logging::Level::kInfo) &&
              static_cast<int>(LogLevel::kWarning) == static_cast<int>(logging::Level::kWarning) &&
              static_cast<int>(LogLevel::kError) == static_cast<int>(logging::Level::kError));

const char* LogLevelName(LogLevel level) {
  return logging::LevelName(static_cast<logging::Level>(level));
}

namespace {
const std::string kNoLock;
uint64_t Millis(absl::Duration d) { return static_cast<uint64_t>(absl::ToInt64Milliseconds(d)); }
}  // namespace

const std::string& LockHandle::lock() const { return state_ ? state_->lock() : kNoLock; }
uint64_t LockHandle::token() const { return state_ ? state_->token() : 0; }

namespace client_internal {
// What a ScopedLock holds on to: its client, until the client is destroyed. Its mutex is held
// while a guard calls the client, so that the client is not destroyed under the call.
class ClientAnchor {
 public:
  explicit ClientAnchor(Client* client) : client_(client) {}
  // Runs fn(client) with the client alive, or fn(nullptr) once it is destroyed.
  template <typename F>
  auto With(F fn) {
    std::lock_guard<std::mutex> lock(mu_);
    return fn(client_);
  }
  void Forget() {
    std::lock_guard<std::mutex> lock(mu_);
    client_ = nullptr;
  }

 private:
  std::mutex mu_;
  Client* client_;
};
}  // namespace client_internal

namespace {
std::string GoneMessage(const LockHandle& handle) {
  return absl::StrCat("the Client that acquired lock \"", handle.lock(), "\" (token ",
                      handle.token(),
                      ") was destroyed: its session was closed, and lockd released the lock");
}
}  // namespace

ScopedLock::ScopedLock(ScopedLock&& other) noexcept
    : client_(std::move(other.client_)), handle_(std::move(other.handle_)) {
  other.client_ = nullptr;
}

ScopedLock& ScopedLock::operator=(ScopedLock&& other) noexcept {
  if (this != &other) {
    if (client_ != nullptr) (void)release();
    client_ = std::exchange(other.client_, nullptr);
    handle_ = std::move(other.handle_);
  }
  return *this;
}

ScopedLock::~ScopedLock() {
  if (client_ == nullptr) return;
  auto anchor = std::exchange(client_, nullptr);
  anchor->With([&](Client* client) {
    if (client == nullptr) return;  // gone, and the lock with its session
    if (absl::Status s = client->release(handle_); !s.ok()) {
      client->reportScopedReleaseFailure(handle_, s);
    }
  });
}

void ScopedLock::checkStillHeld() const {
  if (client_ == nullptr) {
    throw LockLostException(handle_.lock(), handle_.token(),
                            handle_.token() == 0 ? LossReason::kEmptyHandle : LossReason::kReleased,
                            "checkStillHeld on a ScopedLock that owns no lock");
  }
  client_->With([&](Client* client) {
    if (client == nullptr) {
      throw LockLostException(handle_.lock(), handle_.token(), LossReason::kReleased,
                              GoneMessage(handle_));
    }
    client->checkStillHeld(handle_);
  });
}

void ScopedLock::beginIrreversibleStep(const StepCost& step) const {
  checkStillHeld();
  client_->With([&](Client* client) {
    if (client == nullptr) {
      throw LockLostException(handle_.lock(), handle_.token(), LossReason::kReleased,
                              GoneMessage(handle_));
    }
    client->beginIrreversibleStep(handle_, step);
  });
}

absl::Duration ScopedLock::remaining() const {
  if (client_ == nullptr) return absl::ZeroDuration();
  return client_->With([&](Client* client) {
    return client == nullptr ? absl::ZeroDuration() : client->remaining(handle_);
  });
}

absl::Status ScopedLock::release() {
  if (client_ == nullptr) return absl::FailedPreconditionError("the ScopedLock owns no lock");
  auto anchor = std::exchange(client_, nullptr);
  return anchor->With([&](Client* client) {
    if (client == nullptr) return absl::FailedPreconditionError(GoneMessage(handle_));
    return client->release(handle_);
  });
}

absl::StatusOr<ScopedLock> Client::acquireScoped(std::string_view lock, absl::Duration wait,
                                                 absl::Duration ttl) {
  auto handle = acquire(lock, wait, ttl);
  if (!handle.ok()) return handle.status();
  return ScopedLock(anchor(), *std::move(handle));
}

absl::StatusOr<std::optional<ScopedLock>> Client::tryAcquireScoped(std::string_view lock,
                                                                   absl::Duration ttl) {
  auto handle = tryAcquire(lock, ttl);
  if (!handle.ok()) return handle.status();
  if (!handle->has_value()) return std::optional<ScopedLock>();
  return std::optional<ScopedLock>(ScopedLock(anchor(), **std::move(handle)));
}

// One acquire in flight. Its outcome is handed over exactly once, by whoever finishes it first:
// the reply, a failure, or cancel(). Lock order: mu, then the client's mutexes.
class ClientImpl;

class AcquireOp final : public PendingAcquire {
 public:
  AcquireOp(ClientImpl* client, std::string lock, absl::Duration wait, absl::Duration ttl,
            std::function<void(AcquireResult)> done)
      : lock_(std::move(lock)), wait_(wait), ttl_(ttl), done_(std::move(done)), client_(client) {}

  bool cancel() override;

  const std::string& lock() const { return lock_; }
  absl::Duration wait() const { return wait_; }
  absl::Duration ttl() const { return ttl_; }

 private:
  friend class ClientImpl;
  const std::string lock_;
  const absl::Duration wait_;
  const absl::Duration ttl_;
  const std::function<void(AcquireResult)> done_;
  absl::Mutex mu_;
  ClientImpl* client_ ABSL_GUARDED_BY(mu_);  // nullptr once the client is being destroyed
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // The Acquire sent, once it is: what a withdrawal names.
  uint64_t session_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t request_id_ ABSL_GUARDED_BY(mu_) = 0;
};

class ClientImpl final : public Client {
 public:
  ClientImpl(const ClientOptions& options, Clock* clock, std::shared_ptr<net::TlsContext> tls)
      : options_(options),
        clock_(clock),
        costliest_step_(CostliestStep(options.steps)),
        metrics_(options.metrics != nullptr ? options.metrics
                                            : std::make_shared<metrics::Registry>()),
        // Not lockd's lock_fenced_out_total (which fence 1 counts): what this client was told.
        fenced_out_(metrics_->GetCounter(
            "lock_client_fenced_out_total",
            "FENCED_OUT answers this client received: a token of its that no longer held its lock")),
        heartbeat_failures_(metrics_->GetCounter(
            "lock_heartbeat_failures_total", "Heartbeats that failed or timed out (D5)")),
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
            "1 while the heartbeat RTT p99 exceeds a third of lease x margin (ADR-006 6.5)")),
        confirm_cost_(metrics_->GetHistogram(
            "lock_confirm_seconds", "Time spent confirming with lockd in checkStillHeld (FR-13)",
            metrics::LatencyBuckets())),
        channel_(Channel::Create(clock, std::move(tls), options.tls_server_name)) {
    for (LossReason r : {LossReason::kDeadlinePassed, LossReason::kFencedOut,
                         LossReason::kSessionLost}) {
      lease_lost_[static_cast<size_t>(r)] = &metrics_->GetCounter(
          "lock_lease_lost_total", "Locks the client stopped holding, by reason",
          {{"reason", LossReasonName(r)}});
    }
  }
  ~ClientImpl() override;

  absl::Status Start();

  absl::StatusOr<LockHandle> acquire(std::string_view lock, absl::Duration wait,
                                     absl::Duration ttl) override;
  absl::StatusOr<std::optional<LockHandle>> tryAcquire(std::string_view lock,
                                                       absl::Duration ttl) override;
  absl::Status release(const LockHandle& handle) override;
  void checkStillHeld(const LockHandle& handle) const override;
  void checkStillHeld(const LockHandle& handle, Confirm confirm) const override;
  void beginIrreversibleStep(const LockHandle& handle, const StepCost& step) const override;
  absl::Duration remaining(const LockHandle& handle) const override;
  absl::Duration heartbeatRttP99() const override;
  std::shared_ptr<metrics::Registry> metrics() const override { return metrics_; }
  absl::Status renewNow() override;
  absl::Status onLost(const LockHandle& handle,
                      std::function<void(LossReason)> on_lost) override;
  std::future<LossReason> whenLost(const LockHandle& handle) override;
  void reportScopedReleaseFailure(const LockHandle& handle,
                                  const absl::Status& status) const override {
    Log(LogLevel::kWarning,
        absl::StrCat("a ScopedLock could not release lock \"", handle.lock(), "\" (token ",
                      handle.token(), "): ", status.ToString()));
  }
  std::shared_ptr<client_internal::ClientAnchor> anchor() const override { return anchor_; }
  uint64_t sessionId() const override {
    absl::MutexLock lock(&mu_);
    return session_id_;
  }
  std::shared_ptr<PendingAcquire> acquireAsync(
      std::string_view lock, absl::Duration wait, absl::Duration ttl,
      std::function<void(absl::StatusOr<LockHandle>)> done) override;
  void releaseAsync(const LockHandle& handle, std::function<void(absl::Status)> done) override;
  absl::Status releaseWithNextRequest(const LockHandle& handle) override;
  void renewAsync(const LockHandle& handle, std::function<void(absl::Status)> done) override;

 private:
  friend class AcquireOp;
  struct HeldLock {
    std::shared_ptr<LeaseState> state;
    MonoTime lock_deadline;  // D1 for the lock's own lease
  };

  // Connects (again) and reopens the session if needed. Serialized by heartbeat_mu_.
  absl::Status EnsureSessionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(heartbeat_mu_);
  // The locks (name, token) one KeepAlive renews, read when it is about to be sent.
  using LockRefs = std::vector<std::pair<std::string, uint64_t>>;
  // One KeepAlive for the session and the locks `gather` returns (called under send_mu_, right
  // before the request is handed to the connection, again if it is sent again). On an OK
  // answer the session's deadline moves (measured from this send) and the reply is returned
  // for the caller to apply to the locks; an answer that the session is gone loses every held
  // lock. heartbeat_mu_ is let go while the reply is awaited: acquire and release never wait
  // for a heartbeat's answer.
  absl::StatusOr<Reply> KeepAliveLocked(const std::function<LockRefs()>& gather)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heartbeat_mu_);
  // Sends `request` with the locks of `gather` and awaits its reply without heartbeat_mu_.
  absl::StatusOr<Reply> SendAndAwaitLocked(wire::Request request,
                                           const std::function<LockRefs()>& gather,
                                           absl::Duration timeout, size_t* sent_locks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(heartbeat_mu_);
  // One heartbeat: drops lost locks, renews the session and every held lock.
  absl::Status HeartbeatLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(heartbeat_mu_);
  absl::StatusOr<std::optional<LockHandle>> AcquireImpl(std::string_view lock,
                                                        absl::Duration wait, absl::Duration ttl);
  // The acquire machinery, shared by the blocking and the asynchronous calls.
  //
  // kInvalidArgument for a bad wait or TTL.
  static absl::Status CheckAcquireArgs(absl::Duration wait, absl::Duration ttl);
  // A new acquire whose outcome goes to `done` (exactly once, with the op's mutex held: it must
  // only hand the outcome over, never block or call the client).
  std::shared_ptr<AcquireOp> NewAcquire(std::string lock, absl::Duration wait, absl::Duration ttl,
                                        std::function<void(AcquireResult)> done);
  // What must happen before an Acquire is sent: a session (reconnecting, renewing or replacing
  // it when its lease ran short) and, if this client gave the lock up earlier, lockd's word that
  // it heard. Blocks. Returns the session to acquire under.
  absl::StatusOr<uint64_t> PrepareAcquire(const std::string& lock);
  // The session to acquire `lock` under if PrepareAcquire would not need to block; nullopt
  // otherwise.
  std::optional<uint64_t> ReadyToAcquire(const std::string& lock);
  // The Acquire request for `lock` under `session`.
  wire::Request AcquireRequest(uint64_t session, const std::string& lock, absl::Duration wait,
                               absl::Duration ttl) const;
  // Sends the op's Acquire under `session` (unless it was cancelled meanwhile).
  void SendAcquire(const std::shared_ptr<AcquireOp>& op, uint64_t session);
  // The Acquire's reply (I/O thread).
  void OnAcquireReply(const std::shared_ptr<AcquireOp>& op, uint64_t session,
                      absl::StatusOr<Reply> reply);
  // A grant as its reply has it, not yet published.
  struct Grant {
    uint64_t token = 0;
    absl::Duration ttl;
    MonoTime deadline;  // the lock's usable deadline, from the Acquire's t_send (D1)
    // It queued so long that the lease left would not last until the next heartbeat (or would
    // not cover a declared step): it must be renewed before it is published.
    bool late = false;
  };
  // What an Acquire's reply means: an outcome to hand over as it is (an error, or no grant), or
  // a grant.
  std::variant<AcquireResult, Grant> ReadAcquireReply(uint64_t session,
                                                      const absl::StatusOr<Reply>& reply);
  // Renews a late grant of `lock`; its new usable deadline, or why it could not be renewed
  // (then the caller gives it back). Blocks.
  absl::StatusOr<MonoTime> RenewGrant(const std::string& lock, uint64_t token,
                                      absl::Duration granted_ttl);
  // The op's late grant, renewed before it is published (RenewGrant). Blocks.
  void RenewLateGrant(const std::shared_ptr<AcquireOp>& op, uint64_t session, uint64_t token,
                      absl::Duration granted_ttl);
  // Records the grant as held and returns its handle; an error if the session it came under
  // was lost meanwhile.
  absl::StatusOr<LockHandle> Publish(const std::string& lock, uint64_t session, uint64_t token,
                                     absl::Duration granted_ttl, MonoTime lock_deadline);
  // Makes the grant the op's outcome (op mutex held).
  void PublishGrant(AcquireOp& op, uint64_t session, uint64_t token, absl::Duration granted_ttl,
                    MonoTime lock_deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op.mu_);
  // The op's outcome (op mutex held): hands it to the op's completion, once.
  void CompleteAcquire(AcquireOp& op, AcquireResult result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op.mu_);
  // Asks lockd to withdraw the queued Acquire `request_id` of `session` (cancel()).
  void Withdraw(uint64_t session, uint64_t request_id);
  // What release() does before its request, and the request. A release settled without one
  // (an empty handle, a lock already lost) is the returned status.
  std::optional<absl::Status> PrepareRelease(const LockHandle& handle, wire::Request* request);
  // Release's outcome from its reply.
  absl::Status ReleaseOutcome(const absl::StatusOr<Reply>& reply);
  // renewAsync's outcome for `handle` after a heartbeat that returned `beat`.
  absl::Status RenewOutcome(const LockHandle& handle, const absl::Status& beat) const;
  // The session is gone on the server: every held lock is lost.
  void LoseSession(LossReason reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops held locks that are lost; releases on the server those whose deadline passed.
  void SweepLost();
  // True while a session is open whose client-side deadline has passed.
  bool SessionDeadlinePassed() const ABSL_LOCKS_EXCLUDED(mu_);
  // True while a session is open whose lease left would not cover the costliest declared
  // step (or has run out): a lock granted under it now would have its first step refused.
  bool SessionLeaseShort() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration HeartbeatInterval() const ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatThread();
  void OnUnmatchedReply(const wire::Response& response);
  // Releases a lock this client has already given up (wire Release.relinquish): no reply is
  // awaited, and a stale token is not counted as fenced out by the server. Remembered as
  // unsettled until an acquire of the same name settles it (a relinquish can be lost with its
  // connection, and lockd would then refuse the acquire: the session still holds the lock).
  void Relinquish(uint64_t session, const std::string& lock, uint64_t token)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Before acquiring `lock` on `session`: if this client relinquished it and cannot know lockd
  // heard, releases it again and waits for the answer. kUnavailable if lockd cannot be asked.
  absl::Status SettleRelinquished(uint64_t session, const std::string& lock)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The Release that gives back `lock` (token) already given up by this client.
  static wire::Request RelinquishRequest(uint64_t session, const std::string& lock,
                                         uint64_t token);
  // Counts a lease that ended for `reason` (once per lease).
  void CountLoss(LossReason reason) const;
  // Records one heartbeat round trip and applies the margin-revisit trigger.
  void RecordRtt(absl::Duration rtt) ABSL_LOCKS_EXCLUDED(mu_);
  // The 99th percentile of the recorded round trips; zero before the first.
  absl::Duration RttP99Locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One line to the injected log, or to the default one.
  void Log(LogLevel level, const std::string& message) const;
  [[noreturn]] void ThrowLost(const LeaseState& state, LossReason reason) const;
  static absl::Status ForeignHandle(const LockHandle& handle) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lock \"", handle.lock(), "\" (token ", handle.token(),
        ") was acquired through another Client: use that one (this one leaves it as it is)"));
  }

  static absl::Duration CostliestStep(const std::vector<StepCost>& steps) {
    absl::Duration costliest = absl::ZeroDuration();
    for (const StepCost& step : steps) costliest = std::max(costliest, step.worst_case);
    return costliest;
  }

  const ClientOptions options_;
  // options_.server lists several lockd replicas (see KeepAliveLocked).
  const bool replicated_ = options_.server.find(',') != std::string::npos;
  Clock* const clock_;
  const absl::Duration costliest_step_;  // of the declared steps; zero when none
  const std::shared_ptr<metrics::Registry> metrics_;
  metrics::Counter& fenced_out_;
  metrics::Counter& heartbeat_failures_;
  metrics::Histogram& heartbeat_rtt_;
  metrics::Gauge& remaining_gauge_;
  metrics::Gauge& revisit_gauge_;
  metrics::Histogram& confirm_cost_;
  std::array<metrics::Counter*, 8> lease_lost_{};
  std::unique_ptr<Channel> channel_;
  // The log when none is injected (ClientOptions::log): spdlog, on standard error.
  const std::unique_ptr<logging::Logger> default_log_ =
      options_.log ? nullptr
                   : std::make_unique<logging::Logger>(
                         "fencelock-client", static_cast<logging::Level>(options_.log_level),
                         logging::Streams::kStderr);

  // Serializes reconnection and the start of heartbeats (background and renewNow). Not held
  // while a heartbeat's reply is awaited.
  absl::Mutex heartbeat_mu_ ABSL_ACQUIRED_BEFORE(send_mu_, mu_);
  // Held from reading a heartbeat's locks until its KeepAlive is handed to the connection: a
  // release that waits for it knows that any KeepAlive naming its token is written first.
  absl::Mutex send_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  uint64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Resumes the session on a new connection (lockd binds a session to one connection).
  std::string session_secret_ ABSL_GUARDED_BY(mu_);
  absl::Duration session_ttl_ ABSL_GUARDED_BY(mu_);
  MonoTime session_deadline_ ABSL_GUARDED_BY(mu_) = MonoTime::Min();
  absl::flat_hash_map<std::string, HeldLock> held_ ABSL_GUARDED_BY(mu_);
  // Locks given up by Relinquish whose answer has not arrived, by name. At most kMaxUnsettled.
  struct Unsettled {
    uint64_t session;
    uint64_t token;
    uint64_t request_id = 0;  // of the posted relinquish; 0 if it could not be sent
  };
  static constexpr size_t kMaxUnsettled = 4096;
  absl::flat_hash_map<std::string, Unsettled> unsettled_ ABSL_GUARDED_BY(mu_);
  // releaseWithNextRequest's requests not answered yet: request id to lock.
  absl::flat_hash_map<uint64_t, std::string> unawaited_releases_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  MonotonicEvent stop_heartbeat_;  // set with stopping_
  // The last 128 heartbeat round trips, for the p99 (ring buffer).
  std::array<absl::Duration, 128> rtts_ ABSL_GUARDED_BY(mu_);
  size_t rtt_count_ ABSL_GUARDED_BY(mu_) = 0;
  bool revisit_warned_ ABSL_GUARDED_BY(mu_) = false;

  std::thread heartbeat_thread_;
  // Acquires started and not yet complete (a cancelled one is complete).
  absl::flat_hash_map<AcquireOp*, std::shared_ptr<AcquireOp>> acquires_ ABSL_GUARDED_BY(mu_);
  // The asynchronous calls' slow paths, and then their callbacks (both started on first use).
  TaskThread slow_;
  // A pointer: a callback that destroys the client leaves it to delete itself (TaskThread::
  // StopFromItsThread).
  std::unique_ptr<TaskThread> callbacks_ = std::make_unique<TaskThread>();
  // Handed to ScopedLocks; forgotten first in the destructor.
  const std::shared_ptr<client_internal::ClientAnchor> anchor_ =
      std::make_shared<client_internal::ClientAnchor>(this);
  // The leases this client grants name it, so that another client refuses them.
  const uint64_t owner_ = NextOwnerId();
  static uint64_t NextOwnerId() {
    static std::atomic<uint64_t> next{1ull << 62};  // apart from ClientCore's ids
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  // Behind onLost and whenLost; stopped first in the destructor, so that no callback runs
  // while the client is taken apart, and destroyed after the threads that Poke() it.
  std::unique_ptr<LossWatcher> watcher_ = std::make_unique<LossWatcher>(clock_);
};

bool AcquireOp::cancel() {
  absl::MutexLock l(&mu_);
  if (finished_ || client_ == nullptr) return false;
  cancelled_ = true;
  if (request_id_ != 0) client_->Withdraw(session_, request_id_);
  client_->CompleteAcquire(
      *this, absl::CancelledError(absl::StrCat("the acquire of \"", lock_, "\" was cancelled")));
  return true;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (!(options.safety_margin > 0.0 && options.safety_margin < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lock.client.safety-margin must be in (0, 1), got ", options.safety_margin));
  }
  for (auto [name, d] : {std::pair{"lock.session.ttl", options.session_ttl},
                         std::pair{"lock.default.ttl", options.default_lock_ttl},
                         std::pair{"request timeout", options.request_timeout},
                         std::pair{"connect timeout", options.connect_timeout}}) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be positive, got ", absl::FormatDuration(d)));
    }
  }
  if (options.heartbeat_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat interval must not be negative");
  }
  if (auto addresses = protocol::ParseAddressList(options.server); !addresses.ok()) {
    return addresses.status();
  }
  // Progress must be possible while everything reports healthy (ADR-006 6.3, 6.5): the usable
  // lease has to cover the costliest declared step.
  const absl::Duration lease = std::min(options.session_ttl, options.default_lock_ttl);
  const absl::Duration usable = lease * (1.0 - options.safety_margin);
  for (const StepCost& step : options.steps) {
    if (step.worst_case <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("step \"", step.name,
                                                     "\" has no positive worst-case cost"));
    }
    if (usable <= step.worst_case) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no \"", step.name, "\" step could ever start: the usable lease min(lock.session.ttl ",
          absl::FormatDuration(options.session_ttl), ", lock.default.ttl ",
          absl::FormatDuration(options.default_lock_ttl), ") x (1 - lock.client.safety-margin ",
          options.safety_margin, ") = ", absl::FormatDuration(usable),
          " is not larger than its worst-case cost ", absl::FormatDuration(step.worst_case)));
    }
  }
  std::shared_ptr<net::TlsContext> tls;
  const net::TlsFiles tls_files{.ca_file = options.tls_ca_file,
                                .cert_file = options.tls_cert_file,
                                .key_file = options.tls_key_file};
  if (tls_files.enabled()) {
    if (options.server.rfind("unix:", 0) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TLS files were given for ", options.server,
          ", a Unix socket: lockd knows its peers there by uid and serves no TLS on it"));
    }
    auto loaded = net::TlsContext::Create(tls_files, net::TlsRole::kClient, "tls_");
    if (!loaded.ok()) return loaded.status();
    tls = std::move(*loaded);
  }
  auto client = std::make_unique<ClientImpl>(
      options, options.clock != nullptr ? options.clock : Clock::Real(), std::move(tls));
  absl::Status started = client->Start();
  if (!started.ok()) return started;
  return client;
}

absl::Status ClientImpl::Start() {
  channel_->set_unmatched_reply_handler(
      [this](const wire::Response& response) { OnUnmatchedReply(response); });
  {
    absl::MutexLock lock(&heartbeat_mu_);
    absl::Status s = EnsureSessionLocked();
    if (!s.ok()) return s;
  }
  heartbeat_thread_ = std::thread([this] { HeartbeatThread(); });
  return absl::OkStatus();
}

ClientImpl::~ClientImpl() {
  anchor_->Forget();  // waits for a ScopedLock's call in progress; later ones find no client
  // No callback runs from here on; the heartbeat, still running until it is joined below, may
  // still Poke() the stopped watcher (a fenced-out or session-lost answer). Destroyed from an
  // onLost callback, the watcher ends its thread once that callback returns, and deletes
  // itself (its thread cannot join itself).
  const bool from_watcher = watcher_->OnItsThread();
  if (from_watcher) {
    watcher_->StopFromItsThread();
  } else {
    watcher_->Stop();
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  stop_heartbeat_.Notify();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  // Acquires still pending complete with kCancelled; a grant that arrives for one from now on
  // goes with the session, which is closed below.
  absl::flat_hash_map<AcquireOp*, std::shared_ptr<AcquireOp>> acquires;
  {
    absl::MutexLock lock(&mu_);
    acquires.swap(acquires_);
  }
  for (const auto& [ptr, op] : acquires) {
    absl::MutexLock l(&op->mu_);
    if (!op->finished_) {
      op->cancelled_ = true;
      CompleteAcquire(*op, absl::CancelledError("the client was destroyed"));
    }
    op->client_ = nullptr;
  }
  slow_.Stop();  // what it still runs sees the acquires cancelled and stopping_ set
  uint64_t session;
  {
    absl::MutexLock lock(&mu_);
    session = session_id_;
    for (auto& [name, held] : held_) held.state->MarkLost(LossReason::kReleased);
    held_.clear();
  }
  if (session != 0 && channel_->connected()) {
    wire::Request close;
    close.mutable_close_session()->set_session_id(session);
    (void)channel_->Call(std::move(close), options_.request_timeout);
  }
  // Calls still in flight fail now, while everything their completions touch exists; then the
  // callbacks they handed over run, and the I/O thread stops.
  channel_->Close();
  if (callbacks_->OnItsThread()) {
    // Destroyed from a callback: the others run after it returns, then the thread ends.
    callbacks_->StopFromItsThread();
    (void)callbacks_.release();
  } else {
    callbacks_->Stop();
  }
  channel_.reset();
  if (from_watcher) (void)watcher_.release();
}

absl::Status ClientImpl::EnsureSessionLocked() {
  if (!channel_->connected()) {
    absl::Status s =
        channel_->Connect(options_.server, options_.client_name, options_.connect_timeout);
    if (!s.ok()) return s;
    // lockd lets only the connection a session is bound to drive it: a session that may have
    // survived on the server is resumed here, with its secret, before anything else is sent.
    wire::Request resume;
    {
      absl::MutexLock lock(&mu_);
      if (session_id_ != 0) {
        resume.mutable_resume_session()->set_session_id(session_id_);
        resume.mutable_resume_session()->set_secret(session_secret_);
      }
    }
    if (resume.has_resume_session()) {
      const uint64_t resumed = resume.resume_session().session_id();
      auto reply = channel_->Call(std::move(resume), options_.request_timeout);
      if (!reply.ok()) {
        channel_->Close();  // try the resume again with the next connection
        return reply.status();
      }
      const wire::Response& r = reply->response;
      if (r.code() == wire::SESSION_NOT_FOUND || r.code() == wire::PERMISSION_DENIED) {
        // Gone (expired, or lockd lost it), or no longer ours to drive: its locks are lost, as
        // when a KeepAlive hears SESSION_NOT_FOUND; the next call opens a new session.
        LoseSession(LossReason::kSessionLost);
        return absl::NotFoundError(absl::StrCat("the session could not be resumed: ", r.message()));
      }
      if (r.code() != wire::OK) {
        channel_->Close();
        return protocol::StatusFromCode(r.code(), r.message());
      }
      Log(LogLevel::kInfo,
          absl::StrCat("session ", resumed, " resumed on a new connection to lockd"));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (session_id_ != 0) return absl::OkStatus();
  }
  wire::Request open;
  open.mutable_open_session()->set_ttl_ms(Millis(options_.session_ttl));
  auto reply = channel_->Call(std::move(open), options_.request_timeout);
  if (!reply.ok()) return reply.status();
  const wire::Response& r = reply->response;
  if (r.code() != wire::OK) return protocol::StatusFromCode(r.code(), r.message());
  {
    absl::MutexLock lock(&mu_);
    session_id_ = r.open_session().session_id();
    session_secret_ = r.open_session().secret();
    session_ttl_ = absl::Milliseconds(r.open_session().ttl_ms());
    session_deadline_ = UsableDeadline(reply->sent_at, session_ttl_, options_.safety_margin);
  }
  Log(LogLevel::kInfo, absl::StrCat("session ", r.open_session().session_id(), " opened on ",
                                    options_.server, " (TTL ",
                                    absl::FormatDuration(absl::Milliseconds(
                                        r.open_session().ttl_ms())),
                                    ")"));
  return absl::OkStatus();
}

absl::StatusOr<Reply> ClientImpl::SendAndAwaitLocked(wire::Request request,
                                                     const std::function<LockRefs()>& gather,
                                                     absl::Duration timeout, size_t* sent_locks) {
  absl::StatusOr<std::shared_ptr<client_internal::PendingCall>> sent;
  {
    absl::MutexLock send(&send_mu_);
    auto* ka = request.mutable_keep_alive();
    ka->clear_locks();
    for (const auto& [name, token] : gather()) {
      auto* ref = ka->add_locks();
      ref->set_lock(name);
      ref->set_token(token);
    }
    *sent_locks = static_cast<size_t>(ka->locks_size());
    sent = channel_->Send(std::move(request));
  }
  if (!sent.ok()) return sent.status();
  heartbeat_mu_.Unlock();
  auto reply = channel_->Await(*sent, timeout);
  heartbeat_mu_.Lock();
  return reply;
}

absl::StatusOr<Reply> ClientImpl::KeepAliveLocked(const std::function<LockRefs()>& gather) {
  absl::Status ensured = EnsureSessionLocked();
  if (!ensured.ok()) return ensured;
  wire::Request request;
  auto* ka = request.mutable_keep_alive();
  {
    absl::MutexLock lock(&mu_);
    ka->set_session_id(session_id_);
  }
  // With a list of replicas, a renewal unanswered for half a heartbeat period means its lockd
  // fell silent (frozen, cut off from its clients, or held up by its store) while another may
  // serve by now: try the others instead of waiting out the request timeout on it (it is tried
  // last, until it answers in time again). Half a period: a renewal
  // sent a period after the last answered one is then given up 1.5 periods (half a TTL) into a
  // usable lease of 0.7 TTL, leaving a fifth of the TTL to resume elsewhere. Never under 1 s:
  // a serving lockd whose commits are merely slow (its store's fsync, a busy etcd) must not be
  // mistaken for a frozen one. The deadlines still run from the last answered send (D5).
  const bool replicas = replicated_;
  const absl::Duration timeout =
      replicas ? std::min(options_.request_timeout,
                          std::max(HeartbeatInterval() / 2, absl::Seconds(1)))
               : options_.request_timeout;
  // A renewal that timed out took at least its timeout: it counts as a round trip of that
  // much (ADR-006 6.5 is about exactly that slow tail), though it extends no deadline.
  size_t sent_locks = 0;  // of the request last sent
  auto call = [&](wire::Request r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(heartbeat_mu_) {
    const MonoTime started = clock_->Now();
    auto reply = SendAndAwaitLocked(std::move(r), gather, timeout, &sent_locks);
    if (absl::IsDeadlineExceeded(reply.status())) {
      RecordRtt(std::max(timeout, clock_->Now() - started));
      if (replicas) channel_->Abandon(timeout);
    }
    return reply;
  };
  auto reply = call(request);
  if (!reply.ok() && reply.status().code() == absl::StatusCode::kUnavailable) {
    // The connection turned out to be dead (the request was never answered, so nothing
    // changed on the server for it): reconnect and send once more, as a new exchange with
    // its own t_send, naming the locks held then.
    ensured = EnsureSessionLocked();
    if (!ensured.ok()) return ensured;
    reply = call(std::move(request));
  }
  // D5: a failed or timed-out exchange changes no deadline; they keep running out.
  if (!reply.ok()) {
    heartbeat_failures_.Increment();
    return reply.status();
  }
  RecordRtt(clock_->Now() - reply->sent_at);
  const wire::Response& r = reply->response;
  if (r.code() == wire::SESSION_NOT_FOUND) {
    LoseSession(LossReason::kSessionLost);
    return protocol::StatusFromCode(r.code(), r.message());
  }
  if (r.code() != wire::OK) {
    heartbeat_failures_.Increment();
    return protocol::StatusFromCode(r.code(), r.message());
  }
  if (r.keep_alive().lock_codes_size() != static_cast<int>(sent_locks)) {
    return absl::UnavailableError("lockd answered KeepAlive with the wrong number of locks");
  }
  absl::MutexLock lock(&mu_);
  session_deadline_ = std::max(
      session_deadline_, UsableDeadline(reply->sent_at, session_ttl_, options_.safety_margin));
  return reply;
}

absl::Status ClientImpl::HeartbeatLocked() {
  SweepLost();
  // The locks are read right before the KeepAlive is handed to the connection (send_mu_): a
  // lock released before that is not in it, and a release after it waits until it is written.
  std::vector<std::shared_ptr<LeaseState>> sent;
  auto reply = KeepAliveLocked([&] {
    LockRefs refs;
    sent.clear();
    absl::MutexLock lock(&mu_);
    for (auto& [name, held] : held_) {
      refs.emplace_back(name, held.state->token());
      sent.push_back(held.state);
    }
    return refs;
  });
  if (!reply.ok()) return reply.status();
  const MonoTime t_send = reply->sent_at;
  const MonoTime now = clock_->Now();
  absl::Status result = absl::OkStatus();
  std::vector<std::string> lines;  // logged once mu_ is let go
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < sent.size(); ++i) {
      const std::shared_ptr<LeaseState>& state = sent[i];
      auto it = held_.find(state->lock());
      const bool still_ours = it != held_.end() && it->second.state == state;
      if (reply->response.keep_alive().lock_codes(i) != wire::OK) {
        // The server says this token no longer holds the lock: lost at once.
        fenced_out_.Increment();
        if (still_ours) CountLoss(LossReason::kFencedOut);
        state->MarkLost(LossReason::kFencedOut);
        watcher_->Poke();
        if (still_ours) held_.erase(it);
        result = absl::AbortedError(
            absl::StrCat("lock \"", state->lock(), "\" token ", state->token(), " was fenced out"));
        lines.push_back(absl::StrCat(result.message(), " (lockd answered its renewal FENCED_OUT)"));
        continue;
      }
      if (!still_ours) continue;
      HeldLock& held = it->second;
      held.lock_deadline = std::max(held.lock_deadline,
                                    UsableDeadline(t_send, state->ttl(), options_.safety_margin));
      state->Extend(std::min(held.lock_deadline, session_deadline_), now);
    }
    absl::Duration least = absl::InfiniteDuration();
    for (const auto& [name, held] : held_) least = std::min(least, held.state->deadline() - now);
    remaining_gauge_.Set(
        held_.empty() ? 0.0 : absl::ToDoubleSeconds(std::max(least, absl::ZeroDuration())));
  }
  for (const std::string& line : lines) Log(LogLevel::kWarning, line);
  return result;
}

void ClientImpl::RecordRtt(absl::Duration rtt) {
  heartbeat_rtt_.Observe(absl::ToDoubleSeconds(rtt));
  absl::Duration p99;
  absl::Duration threshold;
  bool warn = false;
  {
    absl::MutexLock lock(&mu_);
    rtts_[rtt_count_ % rtts_.size()] = rtt;
    ++rtt_count_;
    p99 = RttP99Locked();
    // ADR-006 6.5: revisit the margin once the p99 exceeds a third of lease x margin.
    const absl::Duration lease =
        std::min(session_id_ != 0 ? session_ttl_ : options_.session_ttl, options_.default_lock_ttl);
    threshold = lease * options_.safety_margin / 3;
    if (p99 > threshold && !revisit_warned_) {
      revisit_warned_ = true;
      warn = true;
    }
  }
  revisit_gauge_.Set(p99 > threshold ? 1.0 : 0.0);
  if (warn) {
    Log(LogLevel::kWarning,
        absl::StrCat("heartbeat RTT p99 ", absl::FormatDuration(p99),
                      " exceeds a third of lease x margin (", absl::FormatDuration(threshold),
                      "): the safety margin ", options_.safety_margin,
                      " no longer covers observed jitter; raise it or shorten the heartbeat "
                      "period (ADR-006 6.5)"));
  }
}

absl::Duration ClientImpl::heartbeatRttP99() const {
  absl::MutexLock lock(&mu_);
  return RttP99Locked();
}

absl::Duration ClientImpl::RttP99Locked() const {
  const size_t n = std::min(rtt_count_, rtts_.size());
  if (n == 0) return absl::ZeroDuration();
  std::array<absl::Duration, 128> sorted = rtts_;
  const size_t k = std::min(n - 1, static_cast<size_t>(0.99 * static_cast<double>(n)));
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(k),
                   sorted.begin() + static_cast<long>(n));
  return sorted[k];
}

void ClientImpl::Log(LogLevel level, const std::string& message) const {
  if (options_.log) return options_.log(level, message);
  if (default_log_ != nullptr) default_log_->Log(static_cast<logging::Level>(level), message);
}

void ClientImpl::CountLoss(LossReason reason) const {
  metrics::Counter* c = lease_lost_[static_cast<size_t>(reason)];
  if (c != nullptr) c->Increment();
}

void ClientImpl::LoseSession(LossReason reason) {
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    if (session_id_ != 0) {
      line = absl::StrCat("session ", session_id_, " is gone on lockd (", LossReasonName(reason),
                          "): ", held_.size(), " held lock(s) lost with it");
    }
    for (auto& [name, held] : held_) {
      if (held.state->Check(clock_->Now()) == LossReason::kNone) CountLoss(reason);
      held.state->MarkLost(reason);
    }
    held_.clear();
    unsettled_.clear();  // the session's locks went with it
    session_id_ = 0;
    session_secret_.clear();
    session_deadline_ = MonoTime::Min();
    watcher_->Poke();
  }
  if (!line.empty()) Log(LogLevel::kWarning, line);
}

bool ClientImpl::SessionDeadlinePassed() const {
  absl::MutexLock lock(&mu_);
  return session_id_ != 0 && session_deadline_ <= clock_->Now();
}

bool ClientImpl::SessionLeaseShort() const {
  absl::MutexLock lock(&mu_);
  return session_id_ != 0 && session_deadline_ - clock_->Now() <= costliest_step_;
}

void ClientImpl::SweepLost() {
  const MonoTime now = clock_->Now();
  std::vector<std::shared_ptr<LeaseState>> expired;
  uint64_t session;
  {
    absl::MutexLock lock(&mu_);
    session = session_id_;
    for (auto it = held_.begin(); it != held_.end();) {
      const LossReason reason = it->second.state->Check(now);
      if (reason == LossReason::kNone) {
        ++it;
        continue;
      }
      it->second.state->MarkLost(reason);
      if (reason == LossReason::kDeadlinePassed) {
        CountLoss(reason);
        expired.push_back(it->second.state);
      }
      held_.erase(it++);
    }
  }
  // The client gave these up at its deadline; tell the server so waiters need not wait for the
  // server's own expiry. A stale answer is expected and harmless, and not counted.
  for (const auto& state : expired) {
    Log(LogLevel::kWarning, absl::StrCat("lock \"", state->lock(), "\" (token ", state->token(),
                                         ") lost: the client's deadline for it passed"));
    Relinquish(session, state->lock(), state->token());
  }
}

absl::Duration ClientImpl::HeartbeatInterval() const {
  if (options_.heartbeat_interval > absl::ZeroDuration()) return options_.heartbeat_interval;
  absl::MutexLock lock(&mu_);
  absl::Duration shortest = session_id_ != 0 ? session_ttl_ : options_.session_ttl;
  for (const auto& [name, held] : held_) shortest = std::min(shortest, held.state->ttl());
  absl::Duration interval = shortest / 3;
  // Right before a heartbeat a lease has usable − interval left. Keep that above the costliest
  // declared step, with room for one more interval, so that D4 does not refuse a step on a
  // healthy client merely because the next renewal is due.
  const absl::Duration slack = shortest * (1.0 - options_.safety_margin) - costliest_step_;
  if (slack > absl::ZeroDuration()) interval = std::min(interval, slack / 2);
  return std::max(interval, absl::Milliseconds(10));
}

void ClientImpl::HeartbeatThread() {
  // After a failed exchange (lockd stopped, restarting, unreachable) the next try comes sooner,
  // from kRetryFirst doubling up to the regular interval, so that leases are renewed as soon as
  // lockd answers again rather than up to an interval later, when workers' steps would already
  // have been refused for want of lease.
  constexpr absl::Duration kRetryFirst = absl::Milliseconds(20);
  absl::Duration retry = kRetryFirst;
  bool failed = false;
  uint64_t failures = 0;  // in a row
  for (;;) {
    const absl::Duration interval = HeartbeatInterval();
    absl::Duration wait = interval;
    if (failed) {
      wait = std::min(retry, interval);
      retry = std::min(retry * 2, interval);
    }
    {
      // Waits on the monotonic clock: a wall-clock step must neither stop nor flood the
      // heartbeat (Debian Abseil's AwaitWithTimeout waits until a wall-clock time).
      stop_heartbeat_.WaitFor(wait);
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    absl::MutexLock lock(&heartbeat_mu_);
    const absl::Status beat = HeartbeatLocked();
    // A fenced-out lock is an answer; only an exchange that got none is a failure.
    const bool was_failing = failed;
    failed = !beat.ok() && !absl::IsAborted(beat) && !absl::IsNotFound(beat);
    if (failed) ++failures;
    if (failed && !was_failing) {
      Log(LogLevel::kWarning, absl::StrCat("heartbeat failed (", beat.ToString(),
                                           "); retrying from 20 ms, doubling up to the period"));
    }
    if (!failed && was_failing) {
      Log(LogLevel::kInfo, absl::StrCat("heartbeat answered again after ", failures,
                                        " failed exchange(s)"));
    }
    if (!failed) {
      retry = kRetryFirst;
      failures = 0;
    }
  }
}

absl::Status ClientImpl::renewNow() {
  absl::MutexLock lock(&heartbeat_mu_);
  return HeartbeatLocked();
}

absl::Status ClientImpl::onLost(const LockHandle& handle,
                                std::function<void(LossReason)> on_lost) {
  if (handle.state_ == nullptr) return absl::InvalidArgumentError("onLost on an empty handle");
  if (!on_lost) return absl::InvalidArgumentError("onLost without a callback");
  watcher_->Watch(handle.state_, std::move(on_lost));
  return absl::OkStatus();
}

std::future<LossReason> ClientImpl::whenLost(const LockHandle& handle) {
  auto promise = std::make_shared<std::promise<LossReason>>();
  std::future<LossReason> future = promise->get_future();
  if (handle.state_ == nullptr) {
    promise->set_value(LossReason::kEmptyHandle);
    return future;
  }
  watcher_->Watch(handle.state_, [promise](LossReason reason) { promise->set_value(reason); });
  return future;
}

absl::Status ClientImpl::CheckAcquireArgs(absl::Duration wait, absl::Duration ttl) {
  if (wait < absl::ZeroDuration()) return absl::InvalidArgumentError("wait must not be negative");
  if (ttl < absl::ZeroDuration()) return absl::InvalidArgumentError("ttl must not be negative");
  return absl::OkStatus();
}

std::shared_ptr<AcquireOp> ClientImpl::NewAcquire(std::string lock, absl::Duration wait,
                                                  absl::Duration ttl,
                                                  std::function<void(AcquireResult)> done) {
  auto op = std::make_shared<AcquireOp>(this, std::move(lock), wait, ttl, std::move(done));
  absl::MutexLock l(&mu_);
  acquires_[op.get()] = op;
  return op;
}

absl::StatusOr<uint64_t> ClientImpl::PrepareAcquire(const std::string& lock) {
  uint64_t session;
  {
    absl::MutexLock hb(&heartbeat_mu_);
    absl::Status s = EnsureSessionLocked();
    if (absl::IsNotFound(s)) s = EnsureSessionLocked();  // the old session is gone: a new one
    if (!s.ok()) return s;
    if (SessionLeaseShort()) {
      // Our deadline for the session ran out, or so nearly that it would not cover a declared
      // step (heartbeats failed, or lockd or this process stalled), while lockd may still hold
      // it: a grant now would be lost, or refused its first step, the moment it arrived. Renew
      // first, measured from this send; if lockd says the session is gone, open a new one.
      absl::Status renewed = HeartbeatLocked();
      if (absl::IsNotFound(renewed)) s = EnsureSessionLocked();
      if (!s.ok()) return s;
      if (SessionDeadlinePassed()) {
        return absl::UnavailableError(absl::StrCat(
            "the session's lease ran out and could not be renewed: ", renewed.message()));
      }
    }
    absl::MutexLock l(&mu_);
    session = session_id_;
  }
  if (absl::Status settled = SettleRelinquished(session, lock); !settled.ok()) return settled;
  return session;
}

std::optional<uint64_t> ClientImpl::ReadyToAcquire(const std::string& lock) {
  if (!channel_->connected()) return std::nullopt;
  absl::MutexLock l(&mu_);
  if (session_id_ == 0 || session_deadline_ - clock_->Now() <= costliest_step_ ||
      unsettled_.contains(lock)) {
    return std::nullopt;
  }
  return session_id_;
}

wire::Request ClientImpl::AcquireRequest(uint64_t session, const std::string& lock,
                                         absl::Duration wait, absl::Duration ttl) const {
  wire::Request request;
  auto* a = request.mutable_acquire();
  a->set_session_id(session);
  a->set_lock(lock);
  a->set_ttl_ms(Millis(ttl == absl::ZeroDuration() ? options_.default_lock_ttl : ttl));
  a->set_wait_timeout_ms(Millis(wait));
  return request;
}

void ClientImpl::SendAcquire(const std::shared_ptr<AcquireOp>& op, uint64_t session) {
  wire::Request request = AcquireRequest(session, op->lock(), op->wait(), op->ttl());
  // Held while sending, so that a cancel() knows the request id to withdraw. The reply cannot
  // be handled before: its handler takes the same mutex.
  absl::MutexLock l(&op->mu_);
  if (op->finished_) return;  // cancelled while its session was prepared
  auto id = channel_->SendAsync(
      std::move(request), op->wait() + options_.request_timeout,
      [this, op, session](absl::StatusOr<Reply> reply) {
        OnAcquireReply(op, session, std::move(reply));
      });
  if (!id.ok()) return CompleteAcquire(*op, id.status());
  op->session_ = session;
  op->request_id_ = *id;
}

std::variant<AcquireResult, ClientImpl::Grant> ClientImpl::ReadAcquireReply(
    uint64_t session, const absl::StatusOr<Reply>& reply) {
  if (!reply.ok()) return AcquireResult(reply.status());
  const wire::Response& r = reply->response;
  if (r.code() == wire::SESSION_NOT_FOUND) {
    LoseSession(LossReason::kSessionLost);
    return AcquireResult(absl::UnavailableError(absl::StrCat(
        "session ", session, " expired on lockd: ", r.message(), "; retry to open a new one")));
  }
  if (r.code() != wire::OK) return AcquireResult(protocol::StatusFromCode(r.code(), r.message()));
  if (!r.acquire().granted()) return AcquireResult(std::optional<LockHandle>());

  // D1: the lease is measured from when the Acquire was written, however long it queued.
  Grant grant{.token = r.acquire().token(), .ttl = absl::Milliseconds(r.acquire().ttl_ms())};
  grant.deadline = UsableDeadline(reply->sent_at, grant.ttl, options_.safety_margin);
  MonoTime session_deadline;
  {
    absl::MutexLock m(&mu_);
    session_deadline = session_deadline_;
  }
  // The grant queued (or lockd stalled) so long that the lease left would run out before the
  // next regular heartbeat, or would not cover a declared step (or already has run out, by the
  // client's arithmetic).
  grant.late = std::min(grant.deadline, session_deadline) - clock_->Now() <=
               std::max(HeartbeatInterval(), costliest_step_);
  return grant;
}

void ClientImpl::OnAcquireReply(const std::shared_ptr<AcquireOp>& op, uint64_t session,
                                absl::StatusOr<Reply> reply) {
  absl::MutexLock l(&op->mu_);
  if (op->cancelled_) {
    // Nobody waits for it: a grant that crossed the cancellation is given back at once.
    if (reply.ok() && reply->response.code() == wire::OK && reply->response.acquire().granted()) {
      Relinquish(session, op->lock(), reply->response.acquire().token());
    }
    return;
  }
  if (op->finished_) return;
  auto read = ReadAcquireReply(session, reply);
  if (auto* outcome = std::get_if<AcquireResult>(&read)) {
    return CompleteAcquire(*op, std::move(*outcome));
  }
  const Grant& grant = std::get<Grant>(read);
  if (grant.late) {
    // Not published yet: renewed first, off the I/O thread that must carry the renewal's reply.
    slow_.Post([this, op, session, token = grant.token, ttl = grant.ttl] {
      RenewLateGrant(op, session, token, ttl);
    });
    return;
  }
  PublishGrant(*op, session, grant.token, grant.ttl, grant.deadline);
}

absl::StatusOr<MonoTime> ClientImpl::RenewGrant(const std::string& lock, uint64_t token,
                                                absl::Duration granted_ttl) {
  absl::StatusOr<Reply> renewal;
  {
    absl::MutexLock hb(&heartbeat_mu_);
    renewal = KeepAliveLocked([&] { return LockRefs{{lock, token}}; });
  }
  if (!renewal.ok() || renewal->response.keep_alive().lock_codes(0) != wire::OK) {
    return absl::UnavailableError(absl::StrCat(
        "lock \"", lock, "\" was granted after a long wait and its lease could not be renewed",
        renewal.ok() ? ": fenced out" : ": ", renewal.ok() ? "" : renewal.status().message()));
  }
  return UsableDeadline(renewal->sent_at, granted_ttl, options_.safety_margin);
}

void ClientImpl::RenewLateGrant(const std::shared_ptr<AcquireOp>& op, uint64_t session,
                                uint64_t token, absl::Duration granted_ttl) {
  {
    absl::MutexLock l(&op->mu_);
    if (op->cancelled_) return Relinquish(session, op->lock(), token);
  }
  absl::StatusOr<MonoTime> renewed = RenewGrant(op->lock(), token, granted_ttl);
  absl::MutexLock l(&op->mu_);
  if (op->cancelled_ || !renewed.ok()) {
    Relinquish(session, op->lock(), token);
    if (op->cancelled_) return;
    return CompleteAcquire(*op, renewed.status());
  }
  PublishGrant(*op, session, token, granted_ttl, *renewed);
}

absl::StatusOr<LockHandle> ClientImpl::Publish(const std::string& lock, uint64_t session,
                                               uint64_t token, absl::Duration granted_ttl,
                                               MonoTime lock_deadline) {
  absl::MutexLock l(&mu_);
  if (session_id_ != session) {
    return absl::UnavailableError("session was lost while the acquire was in flight");
  }
  auto state = std::make_shared<LeaseState>(lock, token, granted_ttl,
                                            std::min(lock_deadline, session_deadline_), owner_);
  held_[lock] = HeldLock{state, lock_deadline};
  return LockHandle(std::move(state));
}

void ClientImpl::PublishGrant(AcquireOp& op, uint64_t session, uint64_t token,
                              absl::Duration granted_ttl, MonoTime lock_deadline) {
  absl::StatusOr<LockHandle> handle = Publish(op.lock(), session, token, granted_ttl, lock_deadline);
  if (!handle.ok()) return CompleteAcquire(op, handle.status());
  CompleteAcquire(op, std::optional<LockHandle>(*std::move(handle)));
}

void ClientImpl::CompleteAcquire(AcquireOp& op, AcquireResult result) {
  if (op.finished_) return;
  op.finished_ = true;
  op.done_(std::move(result));
  // Last, so that a destructor that no longer finds the op knows its completion was handed over.
  absl::MutexLock l(&mu_);
  acquires_.erase(&op);
}

void ClientImpl::Withdraw(uint64_t session, uint64_t request_id) {
  // An older lockd does not know the request (it would close the connection): its waiter stays
  // until its wait runs out, and a grant that comes is relinquished (OnAcquireReply).
  if (channel_->version() < protocol::kWithdrawProtocolVersion) return;
  wire::Request withdraw;
  withdraw.mutable_withdraw_acquire()->set_session_id(session);
  withdraw.mutable_withdraw_acquire()->set_acquire_request_id(request_id);
  (void)channel_->Post(std::move(withdraw));  // its reply is unmatched, and ignored
}

absl::StatusOr<std::optional<LockHandle>> ClientImpl::AcquireImpl(std::string_view lock,
                                                                 absl::Duration wait,
                                                                 absl::Duration ttl) {
  if (absl::Status s = CheckAcquireArgs(wait, ttl); !s.ok()) return s;
  const std::string name(lock);
  auto session = PrepareAcquire(name);
  if (!session.ok()) return session.status();
  // On the caller's thread from request to handle: the channel writes and reads for it. A
  // grant that arrives after the wait ran out goes to the unmatched-reply handler, which gives
  // it back.
  auto reply = channel_->Call(AcquireRequest(*session, name, wait, ttl),
                              wait + options_.request_timeout);
  auto read = ReadAcquireReply(*session, reply);
  if (auto* outcome = std::get_if<AcquireResult>(&read)) return std::move(*outcome);
  Grant grant = std::get<Grant>(read);
  if (grant.late) {
    absl::StatusOr<MonoTime> renewed = RenewGrant(name, grant.token, grant.ttl);
    if (!renewed.ok()) {
      Relinquish(*session, name, grant.token);
      return renewed.status();
    }
    grant.deadline = *renewed;
  }
  absl::StatusOr<LockHandle> handle = Publish(name, *session, grant.token, grant.ttl, grant.deadline);
  if (!handle.ok()) return handle.status();
  return std::optional<LockHandle>(*std::move(handle));
}

absl::StatusOr<LockHandle> ClientImpl::acquire(std::string_view lock, absl::Duration wait,
                                               absl::Duration ttl) {
  if (wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("acquire needs a positive wait; use tryAcquire to not wait");
  }
  auto result = AcquireImpl(lock, wait, ttl);
  if (!result.ok()) return result.status();
  if (!result->has_value()) {
    return absl::UnavailableError("lockd answered a waiting acquire with no grant");
  }
  return std::move(**result);
}

absl::StatusOr<std::optional<LockHandle>> ClientImpl::tryAcquire(std::string_view lock,
                                                                 absl::Duration ttl) {
  return AcquireImpl(lock, absl::ZeroDuration(), ttl);
}

std::shared_ptr<PendingAcquire> ClientImpl::acquireAsync(
    std::string_view lock, absl::Duration wait, absl::Duration ttl,
    std::function<void(absl::StatusOr<LockHandle>)> done) {
  auto deliver = [this, done = std::move(done)](AcquireResult result) {
    absl::StatusOr<LockHandle> outcome =
        !result.ok()           ? absl::StatusOr<LockHandle>(result.status())
        : result->has_value()  ? absl::StatusOr<LockHandle>(**std::move(result))
                               : absl::UnavailableError("lockd answered a waiting acquire with no grant");
    callbacks_->Post([done, outcome = std::move(outcome)]() mutable { done(std::move(outcome)); });
  };
  absl::Status args = CheckAcquireArgs(wait, ttl);
  if (args.ok() && wait == absl::ZeroDuration()) {
    args = absl::InvalidArgumentError("acquireAsync needs a positive wait");
  }
  auto op = NewAcquire(std::string(lock), wait, ttl, std::move(deliver));
  if (!args.ok()) {
    absl::MutexLock l(&op->mu_);
    CompleteAcquire(*op, args);
    return op;
  }
  if (std::optional<uint64_t> session = ReadyToAcquire(op->lock()); session.has_value()) {
    SendAcquire(op, *session);
    return op;
  }
  slow_.Post([this, op] {
    {
      absl::MutexLock l(&op->mu_);
      if (op->finished_) return;
    }
    auto session = PrepareAcquire(op->lock());
    if (!session.ok()) {
      absl::MutexLock l(&op->mu_);
      return CompleteAcquire(*op, session.status());
    }
    SendAcquire(op, *session);
  });
  return op;
}

std::optional<absl::Status> ClientImpl::PrepareRelease(const LockHandle& handle,
                                                       wire::Request* request) {
  if (handle.state_ == nullptr) return absl::InvalidArgumentError("empty lock handle");
  if (handle.state_->owner() != owner_) return ForeignHandle(handle);
  LeaseState& state = *handle.state_;
  uint64_t session;
  bool was_held = false;
  {
    absl::MutexLock lock(&mu_);
    session = session_id_;
    auto it = held_.find(state.lock());
    if (it != held_.end() && it->second.state == handle.state_) {
      held_.erase(it);
      was_held = true;
    }
  }
  if (was_held) {
    // A heartbeat may already carry this lock's token. Its KeepAlive must reach lockd before
    // the Release (or Relinquish) does: arriving after, it would present a released token and
    // be counted as fenced out. Heartbeats from now on no longer include the lock, and one
    // that read it is handed to the connection before send_mu_ is let go; requests are written
    // in the order they are handed over. So this waits for no reply, only for that hand-over.
    absl::MutexLock barrier(&send_mu_);
  }
  if (const LossReason lost = state.Check(clock_->Now()); lost != LossReason::kNone) {
    // Already lost: nothing may be done under this token any more, so this is a clean-up, not
    // a stale request. If only the client's (conservative) deadline passed, the server may
    // still hold it for us: give it back so waiters need not wait for the server's expiry.
    if (lost == LossReason::kDeadlinePassed) {
      state.MarkLost(LossReason::kDeadlinePassed);
      if (was_held) CountLoss(lost);  // the heartbeat's sweep has not seen it
      Relinquish(session, state.lock(), state.token());
    }
    return absl::AbortedError(absl::StrCat("lock \"", state.lock(), "\" (token ", state.token(),
                                           ") was already lost before release: ",
                                           LossReasonName(lost)));
  }
  state.MarkLost(LossReason::kReleased);
  watcher_->Poke();  // its watches end without a call
  request->mutable_release()->set_session_id(session);
  request->mutable_release()->set_lock(state.lock());
  request->mutable_release()->set_token(state.token());
  return std::nullopt;
}

absl::Status ClientImpl::ReleaseOutcome(const absl::StatusOr<Reply>& reply) {
  if (!reply.ok()) return reply.status();
  if (reply->response.code() == wire::FENCED_OUT) fenced_out_.Increment();
  return protocol::StatusFromCode(reply->response.code(), reply->response.message());
}

absl::Status ClientImpl::release(const LockHandle& handle) {
  wire::Request request;
  if (std::optional<absl::Status> settled = PrepareRelease(handle, &request)) return *settled;
  return ReleaseOutcome(channel_->Call(std::move(request), options_.request_timeout));
}

absl::Status ClientImpl::releaseWithNextRequest(const LockHandle& handle) {
  wire::Request request;
  if (std::optional<absl::Status> settled = PrepareRelease(handle, &request)) return *settled;
  const std::string lock = request.release().lock();
  auto id = channel_->PostWithNext(std::move(request));
  if (!id.ok()) return id.status();
  absl::MutexLock l(&mu_);
  // Bounded: an answer lost with its connection leaves its id behind until the next one.
  if (unawaited_releases_.size() >= kMaxUnsettled) unawaited_releases_.clear();
  unawaited_releases_[*id] = lock;
  return absl::OkStatus();
}

void ClientImpl::releaseAsync(const LockHandle& handle, std::function<void(absl::Status)> done) {
  auto deliver = [this, done = std::move(done)](absl::Status status) {
    callbacks_->Post([done, status = std::move(status)] { done(status); });
  };
  wire::Request request;
  if (std::optional<absl::Status> settled = PrepareRelease(handle, &request)) {
    return deliver(*settled);
  }
  auto sent = channel_->SendAsync(std::move(request), options_.request_timeout,
                                  [this, deliver](absl::StatusOr<Reply> reply) {
                                    deliver(ReleaseOutcome(reply));
                                  });
  if (!sent.ok()) deliver(sent.status());
}

absl::Status ClientImpl::RenewOutcome(const LockHandle& handle, const absl::Status& beat) const {
  const LeaseState* state = handle.state_.get();
  const LossReason lost = state->Check(clock_->Now());
  if (lost != LossReason::kNone) {
    return absl::AbortedError(absl::StrCat("lock \"", state->lock(), "\" (token ", state->token(),
                                           ") is no longer held: ", LossReasonName(lost)));
  }
  // Held: a heartbeat that failed for another lock (fenced out) still renewed this one.
  if (!beat.ok() && !absl::IsAborted(beat)) return beat;
  return absl::OkStatus();
}

void ClientImpl::renewAsync(const LockHandle& handle, std::function<void(absl::Status)> done) {
  auto deliver = [this, done = std::move(done)](absl::Status status) {
    callbacks_->Post([done, status = std::move(status)] { done(status); });
  };
  if (handle.state_ == nullptr) {
    return deliver(absl::InvalidArgumentError("renewAsync on an empty handle"));
  }
  if (handle.state_->owner() != owner_) return deliver(ForeignHandle(handle));
  slow_.Post([this, handle, deliver] {
    bool stopping;
    {
      absl::MutexLock l(&mu_);
      stopping = stopping_;
    }
    if (stopping) return deliver(absl::CancelledError("the client was destroyed"));
    deliver(RenewOutcome(handle, renewNow()));
  });
}

void ClientImpl::ThrowLost(const LeaseState& state, LossReason reason) const {
  std::string message = absl::StrCat("lock \"", state.lock(), "\" (token ", state.token(),
                                     ") is no longer held: ", LossReasonName(reason));
  throw LockLostException(state.lock(), state.token(), reason, message);
}

void ClientImpl::checkStillHeld(const LockHandle& handle) const {
  if (options_.confirm_with_server) return checkStillHeld(handle, Confirm::kWithServer);
  const LeaseState* state = handle.state_.get();
  if (state == nullptr) {
    throw LockLostException("", 0, LossReason::kEmptyHandle, "checkStillHeld on an empty handle");
  }
  // D3: two atomic loads and a clock read; nothing here allocates unless it throws.
  const LossReason reason = state->Check(clock_->Now());
  if (reason != LossReason::kNone) ThrowLost(*state, reason);
}

void ClientImpl::checkStillHeld(const LockHandle& handle, Confirm confirm) const {
  LeaseState* state = handle.state_.get();
  if (state == nullptr) {
    throw LockLostException("", 0, LossReason::kEmptyHandle, "checkStillHeld on an empty handle");
  }
  LossReason reason = state->Check(clock_->Now());
  if (reason != LossReason::kNone) ThrowLost(*state, reason);
  if (confirm == Confirm::kLocal) return;
  if (state->owner() != owner_) {
    // lockd would answer for this client's session, which does not hold it.
    throw LockLostException(state->lock(), state->token(), LossReason::kUnconfirmed,
                            std::string(ForeignHandle(handle).message()));
  }
  // FR-13: one Validate hop. Its measured time counts against the lease like any other hop:
  // the deadline is checked again when the answer is in.
  const MonoTime start = clock_->Now();
  wire::Request request;
  request.mutable_validate()->set_lock(state->lock());
  request.mutable_validate()->set_token(state->token());
  {
    // As its holder: lockd also checks that this connection's session holds the lock (a lock
    // of an earlier session was already lost above, with that session).
    absl::MutexLock lock(&mu_);
    request.mutable_validate()->set_session_id(session_id_);
  }
  auto reply = channel_->Call(std::move(request), options_.request_timeout);
  const MonoTime end = clock_->Now();
  confirm_cost_.Observe(absl::ToDoubleSeconds(end - start));
  if (!reply.ok() || (reply->response.code() != wire::OK &&
                      reply->response.code() != wire::FENCED_OUT)) {
    const std::string why = reply.ok() ? reply->response.message()
                                       : std::string(reply.status().message());
    throw LockLostException(state->lock(), state->token(), LossReason::kUnconfirmed,
                            absl::StrCat("lock \"", state->lock(), "\" (token ", state->token(),
                                         ") could not be confirmed with lockd: ", why));
  }
  if (reply->response.code() == wire::FENCED_OUT) {
    fenced_out_.Increment();
    if (state->Check(end) == LossReason::kNone) CountLoss(LossReason::kFencedOut);
    state->MarkLost(LossReason::kFencedOut);
    watcher_->Poke();
    ThrowLost(*state, LossReason::kFencedOut);
  }
  reason = state->Check(end);
  if (reason != LossReason::kNone) ThrowLost(*state, reason);
}

void ClientImpl::beginIrreversibleStep(const LockHandle& handle, const StepCost& step) const {
  const LeaseState* state = handle.state_.get();
  if (state == nullptr) {
    throw LockLostException("", 0, LossReason::kEmptyHandle,
                            absl::StrCat("step \"", step.name, "\" on an empty handle"));
  }
  const MonoTime now = clock_->Now();
  const LossReason reason = state->Check(now);
  if (reason != LossReason::kNone) {
    metrics_
        ->GetCounter("lock_steps_abandoned_total",
                     "Irreversible steps refused before they started (D4), by step and reason",
                     {{"step", step.name}, {"reason", LossReasonName(reason)}})
        .Increment();
    ThrowLost(*state, reason);
  }
  const absl::Duration left = state->deadline() - now;
  if (left > step.worst_case) return;
  metrics_
      ->GetCounter("lock_steps_abandoned_total",
                   "Irreversible steps refused before they started (D4), by step and reason",
                   {{"step", step.name}, {"reason", LossReasonName(LossReason::kInsufficientLease)}})
      .Increment();
  throw StepRefusedException(
      state->lock(), state->token(),
      absl::StrCat("step \"", step.name, "\" refused before it started: lock \"", state->lock(),
                   "\" (token ", state->token(), ") has ", absl::FormatDuration(left),
                   " of lease left, not more than the step's worst case ",
                   absl::FormatDuration(step.worst_case)),
      step.name, left, step.worst_case);
}

absl::Duration ClientImpl::remaining(const LockHandle& handle) const {
  const LeaseState* state = handle.state_.get();
  if (state == nullptr) return absl::ZeroDuration();
  const MonoTime now = clock_->Now();
  if (state->Check(now) != LossReason::kNone) return absl::ZeroDuration();
  return state->deadline() - now;
}

void ClientImpl::OnUnmatchedReply(const wire::Response& response) {
  if (response.has_release()) {
    std::optional<std::string> unawaited;
    {
      absl::MutexLock l(&mu_);
      if (auto it = unawaited_releases_.find(response.request_id());
          it != unawaited_releases_.end()) {
        unawaited = std::move(it->second);
        unawaited_releases_.erase(it);
      }
    }
    if (unawaited.has_value()) {
      // A releaseWithNextRequest's answer: only a token that no longer held its lock is news.
      if (response.code() == wire::FENCED_OUT) {
        fenced_out_.Increment();
        Log(LogLevel::kWarning, absl::StrCat("the release of \"", *unawaited,
                                             "\" (not waited for) was fenced out: ",
                                             response.message()));
      }
      return;
    }
    absl::MutexLock l(&mu_);
    // lockd answered a relinquish (released, or no longer held by that token): settled.
    for (auto it = unsettled_.begin(); it != unsettled_.end(); ++it) {
      if (it->second.request_id == response.request_id()) {
        unsettled_.erase(it);
        break;
      }
    }
    return;
  }
  // A grant whose caller stopped waiting: nobody will use it, so give it back at once rather
  // than leaving the lock stuck until its lease runs out.
  if (response.code() != wire::OK || !response.has_acquire() || !response.acquire().granted()) {
    return;
  }
  uint64_t session;
  {
    absl::MutexLock lock(&mu_);
    session = session_id_;
  }
  Relinquish(session, response.acquire().lock(), response.acquire().token());
}

wire::Request ClientImpl::RelinquishRequest(uint64_t session, const std::string& lock,
                                           uint64_t token) {
  wire::Request release;
  release.mutable_release()->set_session_id(session);
  release.mutable_release()->set_lock(lock);
  release.mutable_release()->set_token(token);
  release.mutable_release()->set_relinquish(true);
  return release;
}

void ClientImpl::Relinquish(uint64_t session, const std::string& lock, uint64_t token) {
  {
    absl::MutexLock l(&mu_);
    // Bounded: past kMaxUnsettled a lost relinquish is left to lockd's own expiry.
    if (unsettled_.size() < kMaxUnsettled || unsettled_.contains(lock)) {
      unsettled_.insert_or_assign(lock, Unsettled{session, token});
    }
  }
  // lockd's answer settles it (OnUnmatchedReply); if it never comes, SettleRelinquished
  // releases again before this name is acquired.
  auto id = channel_->Post(RelinquishRequest(session, lock, token));
  if (!id.ok()) return;
  absl::MutexLock l(&mu_);
  if (auto it = unsettled_.find(lock); it != unsettled_.end() && it->second.token == token) {
    it->second.request_id = *id;
  }
}

absl::Status ClientImpl::SettleRelinquished(uint64_t session, const std::string& lock) {
  uint64_t token = 0;
  {
    absl::MutexLock l(&mu_);
    auto it = unsettled_.find(lock);
    if (it == unsettled_.end()) return absl::OkStatus();
    if (it->second.session != session) {  // that session is gone, and its locks with it
      unsettled_.erase(it);
      return absl::OkStatus();
    }
    token = it->second.token;
  }
  auto reply = channel_->Call(RelinquishRequest(session, lock, token), options_.request_timeout);
  if (!reply.ok()) {
    return absl::UnavailableError(absl::StrCat("lock \"", lock, "\" was given up earlier (token ",
                                               token, ") and lockd could not be told: ",
                                               reply.status().message()));
  }
  // Any answer settles it: released now, or no longer held by that token anyway.
  absl::MutexLock l(&mu_);
  if (auto it = unsettled_.find(lock); it != unsettled_.end() && it->second.token == token) {
    unsettled_.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace fencelock
