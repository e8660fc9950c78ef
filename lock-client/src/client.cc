#include "lock-client/client.h"

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clock/std_mutex.h"
#include "lock-client/core/client_core.h"
#include "lock-client/core/lease.h"
#include "logging/logging.h"
#include "loss_watcher.h"
#include "net/tls.h"
#include "protocol/address.h"
#include "runtime.h"
#include "task_thread.h"

namespace fencelock {

using client_internal::LeaseState;
using client_internal::LossWatcher;
using client_internal::TaskThread;

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
}  // namespace

const std::string& LockHandle::lock() const { return state_ ? state_->lock() : kNoLock; }
uint64_t LockHandle::token() const { return state_ ? state_->token() : 0; }
LockMode LockHandle::mode() const { return state_ ? state_->mode() : LockMode::kExclusive; }

namespace client_internal {
// What a ScopedLock holds on to: its client, until the client is destroyed. Its mutex is held
// while a guard calls the client, so that the client is not destroyed under the call.
class ClientAnchor {
 public:
  explicit ClientAnchor(Client* client) : client_(client) {}
  // Runs fn(client) with the client alive, or fn(nullptr) once it is destroyed.
  template <typename F>
  auto With(F fn) {
    StdMutexLock lock(&mu_);
    return fn(client_);
  }
  void Forget() {
    StdMutexLock lock(&mu_);
    client_ = nullptr;
  }

 private:
  StdMutex mu_;
  Client* client_ ABSL_GUARDED_BY(mu_);
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
                                                 const AcquireOptions& options) {
  auto handle = acquire(lock, wait, options);
  if (!handle.ok()) return handle.status();
  return ScopedLock(anchor(), *std::move(handle));
}

absl::StatusOr<std::optional<ScopedLock>> Client::tryAcquireScoped(
    std::string_view lock, const AcquireOptions& options) {
  auto handle = tryAcquire(lock, options);
  if (!handle.ok()) return handle.status();
  if (!handle->has_value()) return std::optional<ScopedLock>();
  return std::optional<ScopedLock>(ScopedLock(anchor(), **std::move(handle)));
}

namespace {
using client_core::ClientCore;
using client_core::Completion;
using client_internal::Driver;

absl::Duration CostliestStep(const std::vector<StepCost>& steps) {
  absl::Duration costliest = absl::ZeroDuration();
  for (const StepCost& step : steps) costliest = std::max(costliest, step.worst_case);
  return costliest;
}

// An acquire started with acquireAsync: cancel() hands the core its Cancel.
class AcquireOp final : public PendingAcquire {
 public:
  explicit AcquireOp(std::weak_ptr<Driver> driver) : driver_(std::move(driver)) {}
  void set_op(uint64_t op) { op_.store(op, std::memory_order_release); }
  bool cancel() override {
    auto driver = driver_.lock();
    const uint64_t op = op_.load(std::memory_order_acquire);
    if (driver == nullptr || op == 0) return false;
    bool cancelled = false;
    driver->Do([&](ClientCore& core, MonoTime now) { cancelled = core.Cancel(now, op); });
    return cancelled;
  }

 private:
  const std::weak_ptr<Driver> driver_;
  std::atomic<uint64_t> op_{0};
};
}  // namespace

// A Client: the client core (lock-client/core) on the process's shared runtime (runtime.h),
// plus what stays local to the caller: the D3 and D4 checks, loss notification, and the
// callbacks of the asynchronous calls.
class ClientImpl final : public Client {
 public:
  ClientImpl(const ClientOptions& options, Clock* clock,
             std::shared_ptr<net::ReloadingTlsContext> tls)
      : options_(options),
        clock_(clock),
        metrics_(options.metrics != nullptr ? options.metrics
                                            : std::make_shared<metrics::Registry>()),
        confirm_cost_(metrics_->GetHistogram(
            "lock_confirm_seconds", "Time spent confirming with lockd in checkStillHeld (FR-13)",
            metrics::LatencyBuckets())),
        driver_(Driver::Create(Driver::Options{
            .core = client_core::CoreOptions{
                .replicas = Replicas(options.server),
                .session_ttl = options.session_ttl,
                .default_lock_ttl = options.default_lock_ttl,
                .safety_margin = options.safety_margin,
                .heartbeat_interval = options.heartbeat_interval,
                .request_timeout = options.request_timeout,
                .connect_timeout = options.connect_timeout,
                .costliest_step = CostliestStep(options.steps),
                .metrics = metrics_},
            .clock = clock,
            .tls = std::move(tls),
            .tls_server_name = options.tls_server_name,
            .client_name = options.client_name,
            .on_lost =
                [this](std::vector<std::shared_ptr<LeaseState>> lost) {
                  watcher_->Poke(std::move(lost));
                },
            .log = [this](LogLevel level, const std::string& line) { Log(level, line); }})) {
    driver_->Read([&](const ClientCore& core) { owner_ = core.id(); });
  }
  ~ClientImpl() override;

  absl::Status Start() {
    return driver_->Run([](ClientCore& core, MonoTime now) { return core.Start(now); }).status;
  }

  using Client::acquire;
  using Client::tryAcquire;
  using Client::acquireAsync;
  absl::StatusOr<LockHandle> acquire(std::string_view lock, absl::Duration wait,
                                     const AcquireOptions& options) override {
    if (wait <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("acquire needs a positive wait; use tryAcquire to not wait");
    }
    auto result = AcquireImpl(lock, wait, options);
    if (!result.ok()) return result.status();
    if (!result->has_value()) {
      return absl::UnavailableError("lockd answered a waiting acquire with no grant");
    }
    return std::move(**result);
  }
  absl::StatusOr<std::optional<LockHandle>> tryAcquire(std::string_view lock,
                                                       const AcquireOptions& options) override {
    return AcquireImpl(lock, absl::ZeroDuration(), options);
  }
  absl::Status release(const LockHandle& handle) override { return ReleaseImpl(handle, true); }
  absl::Status releaseWithNextRequest(const LockHandle& handle) override {
    return ReleaseImpl(handle, false);
  }
  void checkStillHeld(const LockHandle& handle) const override;
  void checkStillHeld(const LockHandle& handle, Confirm confirm) const override;
  void beginIrreversibleStep(const LockHandle& handle, const StepCost& step) const override;
  absl::Duration remaining(const LockHandle& handle) const override;
  absl::Duration heartbeatRttP99() const override {
    absl::Duration p99;
    driver_->Read([&](const ClientCore& core) { p99 = core.RttP99(); });
    return p99;
  }
  std::shared_ptr<metrics::Registry> metrics() const override { return metrics_; }
  absl::Status renewNow() override {
    return driver_->Run([](ClientCore& core, MonoTime now) { return core.Renew(now); }).status;
  }
  absl::Status onLost(const LockHandle& handle,
                      std::function<void(LossReason)> on_lost) override {
    if (handle.state_ == nullptr) return absl::InvalidArgumentError("onLost on an empty handle");
    if (!on_lost) return absl::InvalidArgumentError("onLost without a callback");
    if (Inherited()) return client_internal::InheritedError();
    watcher_->Watch(handle.state_, std::move(on_lost));
    return absl::OkStatus();
  }
  std::future<LossReason> whenLost(const LockHandle& handle) override {
    auto promise = std::make_shared<std::promise<LossReason>>();
    std::future<LossReason> future = promise->get_future();
    if (handle.state_ == nullptr) {
      promise->set_value(LossReason::kEmptyHandle);
      return future;
    }
    if (Inherited()) {
      promise->set_value(LossReason::kSessionLost);  // the parent's session, not this process's
      return future;
    }
    watcher_->Watch(handle.state_, [promise](LossReason reason) { promise->set_value(reason); });
    return future;
  }
  void reportScopedReleaseFailure(const LockHandle& handle,
                                  const absl::Status& status) const override {
    Log(LogLevel::kWarning,
        absl::StrCat("a ScopedLock could not release lock \"", handle.lock(), "\" (token ",
                     handle.token(), "): ", status.ToString()));
  }
  std::shared_ptr<client_internal::ClientAnchor> anchor() const override { return anchor_; }
  uint64_t sessionId() const override {
    uint64_t id = 0;
    driver_->Read([&](const ClientCore& core) { id = core.session_id(); });
    return id;
  }
  std::shared_ptr<PendingAcquire> acquireAsync(
      std::string_view lock, absl::Duration wait, const AcquireOptions& options,
      std::function<void(absl::StatusOr<LockHandle>)> done) override;
  void releaseAsync(const LockHandle& handle, std::function<void(absl::Status)> done) override;
  void renewAsync(const LockHandle& handle, std::function<void(absl::Status)> done) override;

 private:
  static std::vector<std::string> Replicas(const std::string& server) {
    std::vector<std::string> replicas;
    absl::StatusOr<std::vector<protocol::Address>> list = protocol::ParseAddressList(server);
    if (!list.ok()) return {server};  // Create() refused it already
    for (const protocol::Address& address : *list) replicas.push_back(address.text);
    return replicas;
  }
  static absl::Status CheckAcquireArgs(absl::Duration wait, const AcquireOptions& options) {
    if (wait < absl::ZeroDuration()) return absl::InvalidArgumentError("wait must not be negative");
    if (options.ttl < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("ttl must not be negative");
    }
    if (options.lock_delay.has_value() && *options.lock_delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("lock_delay must not be negative");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<LockHandle>> AcquireImpl(std::string_view lock,
                                                        absl::Duration wait,
                                                        const AcquireOptions& options) {
    if (absl::Status s = CheckAcquireArgs(wait, options); !s.ok()) return s;
    const std::string name(lock);
    Completion c = driver_->Run([&](ClientCore& core, MonoTime now) {
      return core.Acquire(now, name, wait, options.ttl, options.mode, options.lock_delay);
    });
    if (!c.status.ok()) return c.status;
    if (c.lease == nullptr) return std::optional<LockHandle>();
    return std::optional<LockHandle>(LockHandle(std::move(c.lease)));
  }
  absl::Status ReleaseImpl(const LockHandle& handle, bool await) {
    if (handle.state_ != nullptr && handle.state_->owner() != owner_) return ForeignHandle(handle);
    absl::Status status =
        driver_->Run([&](ClientCore& core, MonoTime now) {
                 return core.Release(now, handle.state_, await);
               }).status;
    if (!Inherited()) watcher_->Poke({handle.state_});  // its watches end without a call
    return status;
  }
  // renewAsync's outcome for `handle` after a heartbeat that returned `beat`.
  absl::Status RenewOutcome(const LockHandle& handle, const absl::Status& beat) const;
  // Counts a refused step (lock_steps_abandoned_total).
  void CountAbandoned(const StepCost& step, LossReason reason) const {
    metrics_
        ->GetCounter("lock_steps_abandoned_total",
                     "Irreversible steps refused before they started (D4), by step and reason",
                     {{"step", step.name}, {"reason", LossReasonName(reason)}})
        .Increment();
  }
  // One line to the injected log, or to the default one.
  void Log(LogLevel level, const std::string& message) const {
    if (options_.log) return options_.log(level, message);
    default_log_->Log(static_cast<logging::Level>(level), message);
  }
  [[noreturn]] void ThrowLost(const LeaseState& state, LossReason reason) const;
  static absl::Status ForeignHandle(const LockHandle& handle) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lock \"", handle.lock(), "\" (token ", handle.token(),
        ") was acquired through another Client: use that one (this one leaves it as it is)"));
  }
  // The outcome of an asynchronous call, to its callback on the callback thread.
  template <typename T>
  std::function<void(T)> OnCallbackThread(std::function<void(T)> done) {
    return [this, done = std::move(done)](T result) {
      Callbacks().Post([done, result = std::move(result)]() mutable { done(std::move(result)); });
    };
  }
  // Made before fork() and used in the child (client_internal::ForkGeneration): the parent's
  // threads are not here, so nothing may wait for them.
  bool Inherited() const { return generation_ != client_internal::ForkGeneration(); }
  [[noreturn]] void ThrowInherited(const LeaseState& state) const {
    throw LockLostException(state.lock(), state.token(), LossReason::kSessionLost,
                            absl::StrCat("lock \"", state.lock(), "\" (token ", state.token(),
                                         ") is not held by this process: ",
                                         client_internal::InheritedError().message()));
  }
  // The callback thread: in a child of fork(), one of the child's own (the parent's is not
  // there), made on first use, so that an inherited Client's refusals reach their callbacks.
  TaskThread& Callbacks() {
    if (!Inherited()) return *callbacks_;
    StdMutexLock lock(&child_mu_);  // never taken in the parent
    if (child_callbacks_ == nullptr) child_callbacks_ = std::make_unique<TaskThread>();
    return *child_callbacks_;
  }

  const ClientOptions options_;
  Clock* const clock_;
  const std::shared_ptr<metrics::Registry> metrics_;
  metrics::Histogram& confirm_cost_;
  // The log when none is injected (ClientOptions::log): spdlog, on standard error.
  const std::unique_ptr<logging::Logger> default_log_ =
      options_.log ? nullptr
                   : std::make_unique<logging::Logger>(
                         "fencelock-client", static_cast<logging::Level>(options_.log_level),
                         logging::Streams::kStderr);
  // The thread of every callback: the asynchronous calls' and onLost's (started on first
  // use). A pointer: a callback that destroys the client leaves it to delete itself
  // (TaskThread::StopFromItsThread).
  std::unique_ptr<TaskThread> callbacks_ = std::make_unique<TaskThread>();
  const uint64_t generation_ = client_internal::ForkGeneration();
  StdMutex child_mu_;
  std::unique_ptr<TaskThread> child_callbacks_ ABSL_GUARDED_BY(child_mu_);
  // Behind onLost and whenLost; stopped first in the destructor, so that no callback runs
  // while the client is taken apart. Made before the driver, which pokes it.
  std::unique_ptr<LossWatcher> watcher_ = std::make_unique<LossWatcher>(clock_, callbacks_.get());
  const std::shared_ptr<Driver> driver_;
  // The core's id: what the leases this client grants name as their owner.
  uint64_t owner_ = 0;
  // Handed to ScopedLocks; forgotten first in the destructor.
  const std::shared_ptr<client_internal::ClientAnchor> anchor_ =
      std::make_shared<client_internal::ClientAnchor>(this);
};

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
  std::shared_ptr<net::ReloadingTlsContext> tls;
  const net::TlsFiles tls_files{.ca_file = options.tls_ca_file,
                                .cert_file = options.tls_cert_file,
                                .key_file = options.tls_key_file};
  if (tls_files.enabled()) {
    if (options.server.rfind("unix:", 0) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TLS files were given for ", options.server,
          ", a Unix socket: lockd knows its peers there by uid and serves no TLS on it"));
    }
    auto loaded = net::ReloadingTlsContext::Create(tls_files, net::TlsRole::kClient, "tls_");
    if (!loaded.ok()) return loaded.status();
    tls = std::move(*loaded);
  }
  auto client = std::make_unique<ClientImpl>(
      options, options.clock != nullptr ? options.clock : Clock::Real(), std::move(tls));
  absl::Status started = client->Start();
  if (!started.ok()) return started;
  return client;
}

ClientImpl::~ClientImpl() {
  anchor_->Forget();  // waits for a ScopedLock's call in progress; later ones find no client
  if (Inherited()) {
    // A child of fork() destroys its copy of the parent's Client: the session, the
    // connection and the threads are the parent's, so nothing is closed, stopped or joined
    // (joining a thread the child lacks would never return); what they own is let go of.
    (void)watcher_.release();
    (void)callbacks_.release();
    (void)new std::shared_ptr<Driver>(driver_);
    if (child_callbacks_ != nullptr && child_callbacks_->OnItsThread()) {
      child_callbacks_->StopFromItsThread();
      (void)child_callbacks_.release();
    } else if (child_callbacks_ != nullptr) {
      child_callbacks_->Stop();
    }
    return;
  }
  // No onLost callback starts from here on, and none is running unless this is one.
  watcher_->Stop();
  // Closes the session: lockd releases every lock it holds; operations still pending complete
  // with kCancelled (their callbacks are posted to the callback thread).
  // The core gives up after the request timeout on the client's clock; the wait is bounded on
  // the monotonic clock too, for a clock that a test does not move.
  auto closed = std::make_shared<std::promise<void>>();
  std::future<void> close = closed->get_future();
  driver_->Start([](ClientCore& core, MonoTime now) { return core.Close(now); },
                 [closed](Completion) { closed->set_value(); });
  (void)close.wait_for(
      absl::ToChronoNanoseconds(std::min(options_.request_timeout, absl::Hours(24 * 365))));
  driver_->Shutdown();
  if (callbacks_->OnItsThread()) {
    // Destroyed from a callback: the others run after it returns, then the thread ends.
    callbacks_->StopFromItsThread();
    (void)callbacks_.release();
  } else {
    callbacks_->Stop();
  }
}

std::shared_ptr<PendingAcquire> ClientImpl::acquireAsync(
    std::string_view lock, absl::Duration wait, const AcquireOptions& options,
    std::function<void(absl::StatusOr<LockHandle>)> done) {
  auto deliver = OnCallbackThread<absl::StatusOr<LockHandle>>(std::move(done));
  auto op = std::make_shared<AcquireOp>(driver_);
  absl::Status args = CheckAcquireArgs(wait, options);
  if (args.ok() && wait == absl::ZeroDuration()) {
    args = absl::InvalidArgumentError("acquireAsync needs a positive wait");
  }
  if (!args.ok()) {
    deliver(args);
    return op;
  }
  const std::string name(lock);
  driver_->Start(
      [&](ClientCore& core, MonoTime now) {
        const uint64_t id =
            core.Acquire(now, name, wait, options.ttl, options.mode, options.lock_delay);
        op->set_op(id);
        return id;
      },
      // Holds the operation until it completes: AsyncClient keeps only weak references.
      [deliver, op](Completion c) {
        if (!c.status.ok()) return deliver(c.status);
        if (c.lease == nullptr) {
          return deliver(absl::UnavailableError("lockd answered a waiting acquire with no grant"));
        }
        deliver(LockHandle(std::move(c.lease)));
      });
  return op;
}

void ClientImpl::releaseAsync(const LockHandle& handle, std::function<void(absl::Status)> done) {
  auto deliver = OnCallbackThread<absl::Status>(std::move(done));
  if (handle.state_ != nullptr && handle.state_->owner() != owner_) {
    return deliver(ForeignHandle(handle));
  }
  driver_->Start(
      [&](ClientCore& core, MonoTime now) { return core.Release(now, handle.state_, true); },
      [deliver](Completion c) { deliver(c.status); });
  if (!Inherited()) watcher_->Poke({handle.state_});
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
  auto deliver = OnCallbackThread<absl::Status>(std::move(done));
  if (handle.state_ == nullptr) {
    return deliver(absl::InvalidArgumentError("renewAsync on an empty handle"));
  }
  if (handle.state_->owner() != owner_) return deliver(ForeignHandle(handle));
  driver_->Start([](ClientCore& core, MonoTime now) { return core.Renew(now); },
                 [this, handle, deliver](Completion c) {
                   deliver(absl::IsCancelled(c.status) ? c.status : RenewOutcome(handle, c.status));
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
  if (Inherited()) ThrowInherited(*state);
}

void ClientImpl::checkStillHeld(const LockHandle& handle, Confirm confirm) const {
  LeaseState* state = handle.state_.get();
  if (state == nullptr) {
    throw LockLostException("", 0, LossReason::kEmptyHandle, "checkStillHeld on an empty handle");
  }
  LossReason reason = state->Check(clock_->Now());
  if (reason != LossReason::kNone) ThrowLost(*state, reason);
  if (Inherited()) ThrowInherited(*state);
  if (confirm == Confirm::kLocal) return;
  if (state->owner() != owner_) {
    // lockd would answer for this client's session, which does not hold it.
    throw LockLostException(state->lock(), state->token(), LossReason::kUnconfirmed,
                            std::string(ForeignHandle(handle).message()));
  }
  // FR-13: one Validate hop. Its measured time counts against the lease like any other hop:
  // the deadline is checked again when the answer is in.
  const MonoTime start = clock_->Now();
  const absl::Status answer =
      driver_->Run([&](ClientCore& core, MonoTime now) { return core.Validate(now, handle.state_); })
          .status;
  const MonoTime end = clock_->Now();
  confirm_cost_.Observe(absl::ToDoubleSeconds(end - start));
  // Lost for certain (fenced out, or the hop outlasted the lease) before unconfirmed.
  reason = state->Check(end);
  if (reason != LossReason::kNone || absl::IsAborted(answer)) {
    watcher_->Poke({handle.state_});
    ThrowLost(*state, reason != LossReason::kNone ? reason : LossReason::kFencedOut);
  }
  if (!answer.ok()) {
    throw LockLostException(state->lock(), state->token(), LossReason::kUnconfirmed,
                            absl::StrCat("lock \"", state->lock(), "\" (token ", state->token(),
                                         ") could not be confirmed with lockd: ",
                                         answer.message()));
  }
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
    CountAbandoned(step, reason);
    ThrowLost(*state, reason);
  }
  if (Inherited()) {
    CountAbandoned(step, LossReason::kSessionLost);
    ThrowInherited(*state);
  }
  const absl::Duration left = state->deadline() - now;
  if (left > step.worst_case) return;
  CountAbandoned(step, LossReason::kInsufficientLease);
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
  if (state->Check(now) != LossReason::kNone || Inherited()) return absl::ZeroDuration();
  return state->deadline() - now;
}

}  // namespace fencelock
