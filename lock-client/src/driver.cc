// A Client's driver (runtime_internal.h): runs calls on its core under its mutex, carries out
// the actions the core leaves (sends, dials, completions, losses, logs) outside it, and keeps
// the core's timer.
#include "runtime_internal.h"

#include <algorithm>
#include <boost/asio/post.hpp>

#include "absl/strings/str_cat.h"

namespace fencelock::client_internal {

void DriverImpl::Subscribe() {
  std::weak_ptr<DriverImpl> weak = shared_from_this();
  subscription_ = clock_->Subscribe([weak] {
    if (auto self = weak.lock(); self != nullptr && !self->Inherited()) {
      asio::post(Runtime::Get().io(), [self] { self->Tick(); });
    }
  });
}

Completion DriverImpl::Run(const Call& call) {
  if (Inherited()) return Completion{.status = InheritedError()};
  auto waiter = std::make_shared<Waiter>();
  std::shared_ptr<Conn> lead;
  if (!Process(
          [&](ClientCore& core, MonoTime now) {
            mu_.AssertHeld();  // Process calls it under the lock (so for each one below)
            handlers_[call(core, now)] = Handler{.waiter = waiter};
          },
          &lead)) {
    return Completion{.status = absl::CancelledError("the client was destroyed")};
  }
  if (lead != nullptr) Runtime::Get().Lead(lead, *waiter);
  waiter->Wait();
  return std::move(waiter->result);
}

void DriverImpl::Start(const Call& call, Done done) {
  if (Inherited()) return done(Completion{.status = InheritedError()});
  if (!Process([&](ClientCore& core, MonoTime now) {
        mu_.AssertHeld();
        handlers_[call(core, now)] = Handler{.done = done};
      })) {
    done(Completion{.status = absl::CancelledError("the client was destroyed")});
  }
}

void DriverImpl::Do(const std::function<void(ClientCore&, MonoTime)>& call) {
  Process([&](ClientCore& core, MonoTime now) { call(core, now); });
}

void DriverImpl::Read(const std::function<void(const ClientCore&)>& read) const {
  if (Inherited()) return;  // its lock may be held by a thread the child lacks
  StdMutexLock lock(&mu_);
  read(core_);
}

void DriverImpl::Shutdown() {
  if (Inherited()) return;  // the parent's: nothing of it is this process's to close
  {
    StdMutexLock lock(&mu_);
    shut_ = true;
    lock.Wait(carried_, [&] {
      mu_.AssertHeld();
      return carrying_ == 0;
    });
  }
  clock_->Unsubscribe(subscription_);
  std::shared_ptr<Conn> conn;
  {
    StdMutexLock lock(&mu_);
    conn = std::move(attached_);
  }
  // A connection this driver was the last on closes on the I/O thread; it is waited for
  // below too, so that its TLS context is not let go of while the process exits.
  std::weak_ptr<Conn> closing;
  if (conn != nullptr && Runtime::Get().Leave(this, conn->id, false)) closing = conn;
  conn.reset();
  // The I/O thread lets go of this driver before its Client is gone: what it had queued for
  // it (a tick, an arming) runs first, and a reply it was handing over meanwhile (which holds
  // the driver for that moment) is handed over by the next pass. So the driver is destroyed
  // with its Client, on the Client's thread, never by the I/O thread, which runs on while the
  // process exits (and whose destroying a driver then raced the exit's own clean-up).
  Runtime& runtime = Runtime::Get();
  if (runtime.OnItsThread()) {
    asio::post(runtime.io(), [self = shared_from_this()] { self->timer_.cancel(); });
    return;
  }
  // Each pass runs after what the last one queued (a closed socket's cancelled reads, say);
  // bounded, for a handler that would never let go. An expired `closing` says only that the
  // connection's destruction began (on the I/O thread, freeing its TLS stream and context):
  // one more pass runs after the handler that destroys it has returned.
  bool let_go = false;
  for (int pass = 0; pass < 1000; ++pass) {
    auto passed = std::make_shared<Waiter>();
    asio::post(runtime.io(), [this, passed] {
      timer_.cancel();  // its handler holds the driver weakly
      passed->Wake();
    });
    passed->Wait();
    if (let_go) break;
    let_go = weak_from_this().use_count() <= 1 && closing.expired();  // the Client's own
  }
}

void DriverImpl::Dialed(size_t replica, const std::shared_ptr<Conn>& conn, uint32_t version) {
  auto self = shared_from_this();
  std::optional<client_core::Dial> again;
  Process([&](ClientCore& core, MonoTime now) {
    mu_.AssertHeld();
    if (!Runtime::Get().Attach(conn, self)) {
      // It closed in between (its last Client left, or lockd ended it): dial again, which
      // finds another connection or makes one, rather than fail the core's dial.
      if (last_dial_ && last_dial_->replica == replica) again = last_dial_;
      return;
    }
    core.OnDialed(now, replica, conn->id, version);
    if (core.conn() == conn->id) attached_ = conn;
  });
  if (again) {
    Runtime::Get().Dial(self, *again, TlsForDial(), options_.tls_server_name,
                        options_.client_name);
  }
}

void DriverImpl::DialFailed(size_t replica, const absl::Status& status, const std::string& leader) {
  Process([&](ClientCore& core, MonoTime now) {
    core.OnDialFailed(now, replica, status, leader);
  });
}

void DriverImpl::Disconnected(uint64_t conn) {
  Process([&](ClientCore& core, MonoTime now) {
    mu_.AssertHeld();
    if (attached_ != nullptr && attached_->id == conn) attached_ = nullptr;
    core.OnDisconnected(now, conn);
  });
}

void DriverImpl::Responses(uint64_t conn, const std::vector<wire::Response>& responses) {
  Process([&](ClientCore& core, MonoTime now) {
    for (const wire::Response& r : responses) core.OnResponse(now, conn, r);
  });
}

void DriverImpl::Tick() {
  Process([&](ClientCore& core, MonoTime now) {
    mu_.AssertHeld();
    armed_at_ = MonoTime::Max();
    core.OnTick(now);
  });
}

client_core::CoreOptions DriverImpl::WithIds(client_core::CoreOptions options) {
  options.next_request_id = [] { return Runtime::Get().NextRequestId(); };
  return options;
}

template <typename F>
bool DriverImpl::Process(F&& f, std::shared_ptr<Conn>* lead) {
  if (Inherited()) return false;
  Batch batch;
  {
    StdMutexLock lock(&mu_);
    if (shut_) return false;
    f(core_, clock_->Now());
    Collect(batch);
    ++carrying_;
  }
  Carry(batch, lead);
  {
    StdMutexLock lock(&mu_);
    if (--carrying_ == 0) carried_.notify_all();
  }
  return true;
}

void DriverImpl::Collect(Batch& batch) {
  client_core::Actions actions = core_.TakeActions();
  for (uint64_t c : actions.close) {
    const bool retire = attached_ != nullptr && attached_->id == c;
    if (retire) attached_ = nullptr;
    batch.leave.emplace_back(c, retire);
  }
  std::weak_ptr<DriverImpl> self = weak_from_this();
  for (size_t i = 0; i < actions.sends.size(); ++i) {
    const uint64_t id = actions.sends[i].conn;
    if (batch.flush.empty() || batch.flush.back().conn == nullptr ||
        batch.flush.back().conn->id != id) {
      batch.flush.push_back(Runtime::Write{
          .conn = attached_ != nullptr && attached_->id == id ? attached_
                                                              : Runtime::Get().Find(id)});
    }
    Runtime::Write& write = batch.flush.back();
    if (write.conn == nullptr) continue;
    const bool last = i + 1 == actions.sends.size() || actions.sends[i + 1].conn != id;
    (void)Runtime::Append(write, actions.sends[i].request, self, last);
  }
  for (Completion& c : actions.completions) {
    auto it = handlers_.find(c.op);
    if (it == handlers_.end()) continue;
    batch.done.emplace_back(std::move(it->second), std::move(c));
    handlers_.erase(it);
  }
  batch.dial = std::move(actions.dial);
  if (batch.dial) last_dial_ = batch.dial;
  batch.lost = std::move(actions.lost);
  batch.logs = std::move(actions.logs);
  const MonoTime wake = core_.NextWakeup();
  if (wake < armed_at_) {
    armed_at_ = wake;
    batch.rearm = true;
  }
}

void DriverImpl::Carry(Batch& batch, std::shared_ptr<Conn>* lead) {
  Runtime& runtime = Runtime::Get();
  for (Runtime::Write& write : batch.flush) runtime.Flush(write);
  for (Runtime::Write& write : batch.flush) {
    if (write.conn == nullptr) continue;
    if (lead != nullptr && batch.flush.size() == 1 && write.conn->tls_context == nullptr &&
        !runtime.OnItsThread()) {
      *lead = write.conn;
    } else {
      runtime.EnsureReader(write.conn);
    }
  }
  for (auto [conn, retire] : batch.leave) runtime.Leave(this, conn, retire);
  for (auto& [handler, completion] : batch.done) {
    if (handler.waiter != nullptr) {
      handler.waiter->result = std::move(completion);
      handler.waiter->Wake();
    } else if (handler.done) {
      handler.done(std::move(completion));
    }
  }
  if (!batch.lost.empty() && options_.on_lost) options_.on_lost(std::move(batch.lost));
  for (const auto& line : batch.logs) {
    if (options_.log) options_.log(line.level, line.message);
  }
  if (batch.rearm) {
    auto self = shared_from_this();
    asio::post(runtime.io(), [self] { self->Arm(); });
  }
  if (batch.dial) {
    runtime.Dial(shared_from_this(), *batch.dial, TlsForDial(), options_.tls_server_name,
                 options_.client_name);
  }
}

std::shared_ptr<net::TlsContext> DriverImpl::TlsForDial() {
  if (options_.tls == nullptr) return nullptr;
  std::string refused;
  std::shared_ptr<net::TlsContext> tls = options_.tls->Current(&refused);
  if (!refused.empty() && options_.log) {
    options_.log(LogLevel::kWarning,
                 absl::StrCat("the TLS files changed but do not load (", refused,
                              "); connecting with the ones loaded before"));
  }
  return tls;
}

void DriverImpl::Arm() {
  MonoTime wake;
  MonoTime now;
  {
    StdMutexLock lock(&mu_);
    if (shut_) return;
    wake = core_.NextWakeup();
    armed_at_ = wake;
    now = clock_->Now();
  }
  if (wake == MonoTime::Max()) {
    timer_.cancel();
    return;
  }
  // At most kLongestSleep at a time: the timer runs on the monotonic clock, which a suspend
  // stops while the boot-time clock of the leases runs on; after a resume a deadline that
  // passed meanwhile (and onLost with it) is noticed within that much.
  timer_.expires_after(absl::ToChronoNanoseconds(
      std::clamp(wake - now, absl::ZeroDuration(), kLongestSleep)));
  std::weak_ptr<DriverImpl> weak = weak_from_this();
  timer_.async_wait([weak](boost::system::error_code ec) {
    if (ec) return;  // re-armed or cancelled
    if (auto self = weak.lock()) {
      self->Tick();
      self->Arm();
    }
  });
}

std::shared_ptr<Driver> Driver::Create(Options options) {
  auto driver = std::make_shared<DriverImpl>(std::move(options));
  driver->Subscribe();
  return driver;
}

}  // namespace fencelock::client_internal
