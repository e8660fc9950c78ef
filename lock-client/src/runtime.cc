#include <utility>  // first: Boost 1.74's Asio uses std::exchange without it (GCC 12, C++20)

#include "runtime.h"

#include <linux/futex.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <optional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "protocol/address.h"
#include "protocol/frame.h"
#include "protocol/session.h"

namespace fencelock::client_internal {
namespace {

namespace asio = boost::asio;
using Socket = asio::generic::stream_protocol::socket;
using client_core::ClientCore;
using client_core::Completion;

// A connection that lockd does not read for so long that this much waits to be written is
// given up: its requests fail, and the Clients on it dial again.
constexpr size_t kMaxUnwritten = size_t{64} << 20;

// The longest a driver's timer sleeps before it looks at the Clock again (see Arm).
constexpr absl::Duration kLongestSleep = absl::Milliseconds(500);

class DriverImpl;

struct Conn {
  explicit Conn(asio::io_context& io) : socket(io), timer(io), resolver(io) {}

  uint64_t id = 0;
  std::string key;  // what a connection must match to be shared: address, TLS, names
  std::string address;
  std::string server_name;
  std::string client_name;
  std::shared_ptr<net::TlsContext> tls_context;

  // ---- guarded by Runtime::mu_ ----
  enum class State { kDialing, kUp, kClosed };
  State state = State::kDialing;
  bool retired = false;  // a Client gave up on it: no new Client joins it
  uint32_t version = 0;
  std::vector<std::pair<std::weak_ptr<DriverImpl>, size_t>> dialers;  // with their replica
  std::vector<std::weak_ptr<DriverImpl>> attached;

  // ---- the write side and who reads, guarded by wmu ----
  std::mutex wmu;
  std::string out;       // frames not written yet
  bool writing = false;  // a thread (or the I/O thread's wait) is writing `out`
  // Plaintext: the I/O thread is handing over the replies of one read. What is appended
  // meanwhile (the next requests of the callers it wakes) waits for the end of that pass and
  // leaves in one write with the rest, instead of a send() each.
  bool delivering = false;
  bool closed = false;
  std::unordered_map<uint64_t, std::weak_ptr<DriverImpl>> routes;  // request id to its driver
  // Who reads the socket: the I/O thread, a caller waiting for its own reply (plaintext only,
  // see Runtime::Lead), or nobody (plaintext, nothing awaited). The holder owns `decoder` and
  // `in`. Over TLS the I/O thread always reads.
  enum class Reader { kNone, kIo, kCaller };
  Reader reader = Reader::kNone;
  bool close_after_lead = false;  // the socket was to close while a caller read it
  bool write_blocked = false;     // plaintext: the socket is full; the I/O thread writes on
  uint32_t events = 0;            // plaintext: what the runtime's epoll set watches it for
  // Held around send() and the socket's close, so that a send never reaches a descriptor
  // number that was closed and reused.
  std::mutex fd_mu;
  int fd = -1;  // plaintext, once connected: the runtime's (not Asio's); -1 once closed
  // Wakes the caller reading the socket when its call completed otherwise (plaintext; -1 if it
  // could not be made: then callers never read).
  int wake_fd = -1;

  ~Conn() {
    if (wake_fd >= 0) ::close(wake_fd);
    if (fd >= 0) ::close(fd);
  }

  // ---- the I/O thread's ----
  Socket socket;
  std::optional<asio::ssl::context> ssl_context;  // Asio's handle on tls_context
  std::unique_ptr<asio::ssl::stream<Socket&>> tls;
  asio::steady_timer timer;  // the dial's timeout
  asio::ip::tcp::resolver resolver;
  // ---- the reader's (see `reader`) ----
  protocol::FrameDecoder decoder;
  std::array<char, 65536> in{};
  std::string tls_chunk;  // what a TLS write is writing
  uint64_t hello_id = 0;

  size_t Load() const { return attached.size() + dialers.size(); }
};

// A blocking call's wait for its completion. Its thread sleeps on one futex (no spinning:
// libstdc++'s atomic::wait yields the processor in a loop first, a syscall each time), or, while
// it reads its connection for its own reply (Runtime::Lead), in poll() with the connection's
// wake_fd, which Wake() then writes.
struct Waiter {
  std::atomic<uint32_t> done{0};
  Completion result;
  const std::thread::id owner = std::this_thread::get_id();
  std::mutex mu;
  int polling = -1;  // guarded by mu: the wake_fd its thread polls, or -1

  void Wait() {
    while (done.load(std::memory_order_acquire) == 0) {
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&done), FUTEX_WAIT_PRIVATE, 0, nullptr,
                nullptr, 0);
    }
  }
  void Wake() {
    done.store(1, std::memory_order_release);
    if (std::this_thread::get_id() == owner) return;  // completed by its own thread, awake
    {
      std::lock_guard<std::mutex> lock(mu);
      if (polling >= 0) {
        const uint64_t one = 1;
        (void)!::write(polling, &one, sizeof(one));
        return;
      }
    }
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&done), FUTEX_WAKE_PRIVATE, 1, nullptr,
              nullptr, 0);
  }
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

class Runtime {
 public:
  // The process's runtime: made by the first Client, never destroyed (its thread waits for work
  // until the process ends). A child of fork() makes its own on first use (the parent's thread
  // is not in it); the parent's copy is left as it is.
  static Runtime& Get();

  asio::io_context& io() { return io_; }
  bool OnItsThread() const { return std::this_thread::get_id() == thread_id_; }
  uint64_t NextRequestId() { return next_request_.fetch_add(1, std::memory_order_relaxed) + 1; }

  void Dial(const std::shared_ptr<DriverImpl>& driver, const client_core::Dial& dial,
            const std::shared_ptr<net::TlsContext>& tls, const std::string& server_name,
            const std::string& client_name);
  // Called under the driver's lock: `driver` is on `conn` from now on. False if it closed.
  bool Attach(const std::shared_ptr<Conn>& conn, const std::shared_ptr<DriverImpl>& driver);
  // `driver` no longer uses `conn`; with `retire`, no new driver joins it. True if it was the
  // last: the connection closes (on the I/O thread).
  bool Leave(const DriverImpl* driver, uint64_t conn, bool retire);
  std::shared_ptr<Conn> Find(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second;
  }

  // What a thread that appended to a connection does next.
  struct Write {
    std::shared_ptr<Conn> conn;
    bool claimed = false;   // it writes: nobody else was writing
    std::string chunk;      // plaintext: what it took from the buffer to write
    bool overflow = false;  // the buffer passed kMaxUnwritten: the connection is to end
  };
  // Appends `request` (framed) to the connection's buffer, routed back to `driver`. With
  // `last` (its batch's last request for this connection) it also claims the writing if no
  // thread has it, taking the buffer (plaintext). False if the connection is closed.
  static bool Append(Write& write, const wire::Request& request,
                     const std::weak_ptr<DriverImpl>& driver, bool last);
  // Carries out `write`: writes what it claimed (with what others append meanwhile).
  void Flush(Write& write);
  // After requests were appended to `conn`: if nobody reads it, the I/O thread starts to.
  void EnsureReader(const std::shared_ptr<Conn>& conn);
  // After a blocking caller's request was appended to `conn`: if nobody reads it, the caller
  // reads it itself until `waiter` is done, handing every reply it reads to its driver as the
  // I/O thread would, so that its own reply costs no hand-over between threads; then the I/O
  // thread reads on if replies are still awaited. Returns at once if another thread reads.
  // Plaintext only (TLS is the I/O thread's).
  void Lead(const std::shared_ptr<Conn>& conn, Waiter& waiter);

 private:
  Runtime() : work_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {
    thread_id_ = thread_.get_id();
    thread_.detach();
  }

  void StartDial(const std::shared_ptr<Conn>& conn, absl::Duration timeout);
  void Connected(const std::shared_ptr<Conn>& conn);
  void Deliver(const std::shared_ptr<Conn>& conn);
  void HelloAnswered(const std::shared_ptr<Conn>& conn, const wire::Response& reply);
  void WritePlain(const std::shared_ptr<Conn>& conn, std::string chunk = "");
  void WriteTls(const std::shared_ptr<Conn>& conn);
  // Ends `conn` (I/O thread or not): dialers learn `status` (and `leader`), drivers on it
  // that it is gone.
  void Fail(const std::shared_ptr<Conn>& conn, const absl::Status& status,
            const std::string& leader = "");
  // TLS: the I/O thread reads `conn` on and on.
  void Read(const std::shared_ptr<Conn>& conn);
  // Plaintext connections are read from the runtime's own epoll set, not Asio's, which would
  // wake the I/O thread for every reply that arrives, the ones callers read themselves too.
  // Each socket is in it edge-triggered, for EPOLLIN only while the I/O thread is its reader
  // and EPOLLOUT only while its writing is blocked; always for EPOLLRDHUP, so that lockd
  // closing a connection nobody reads is noticed at once. Asio waits on the set's descriptor.
  absl::Status Register(const std::shared_ptr<Conn>& conn);
  // Brings the set's watch of `conn` in line with its state (its wmu held).
  void Rearm(Conn& conn);
  void WatchSet();  // I/O thread
  void OnEvents(const std::shared_ptr<Conn>& conn, uint32_t events);  // I/O thread
  // The I/O thread reads `conn` dry (its reader), then hands the replies over.
  void ReadPlain(const std::shared_ptr<Conn>& conn);
  // Closes the socket, on the I/O thread; while a caller reads it, shuts it down instead and
  // leaves the closing to the end of that caller's reading.
  void CloseSocket(const std::shared_ptr<Conn>& conn);

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::atomic<uint64_t> next_request_{0};
  std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Conn>> conns_;  // open and dialing
  uint64_t next_conn_ = 0;
  std::thread thread_;
  std::thread::id thread_id_;
  // ---- the I/O thread's ----
  std::unique_ptr<asio::posix::stream_descriptor> set_;  // the epoll set; null until made
  std::unordered_map<uint64_t, std::weak_ptr<Conn>> registered_;  // in the set, by id
};

// ---- a driver ----

class DriverImpl final : public Driver, public std::enable_shared_from_this<DriverImpl> {
 public:
  explicit DriverImpl(Options options)
      : options_(std::move(options)),
        clock_(options_.clock),
        core_(WithIds(options_.core)),
        timer_(Runtime::Get().io()) {}

  void Subscribe() {
    std::weak_ptr<DriverImpl> weak = shared_from_this();
    subscription_ = clock_->Subscribe([weak] {
      if (auto self = weak.lock(); self != nullptr && !self->Inherited()) {
        asio::post(Runtime::Get().io(), [self] { self->Tick(); });
      }
    });
  }

  Completion Run(const Call& call) override {
    if (Inherited()) return Completion{.status = InheritedError()};
    auto waiter = std::make_shared<Waiter>();
    std::shared_ptr<Conn> lead;
    if (!Process(
            [&](ClientCore& core, MonoTime now) {
              handlers_[call(core, now)] = Handler{.waiter = waiter};
            },
            &lead)) {
      return Completion{.status = absl::CancelledError("the client was destroyed")};
    }
    if (lead != nullptr) Runtime::Get().Lead(lead, *waiter);
    waiter->Wait();
    return std::move(waiter->result);
  }

  void Start(const Call& call, Done done) override {
    if (Inherited()) return done(Completion{.status = InheritedError()});
    if (!Process([&](ClientCore& core, MonoTime now) {
          handlers_[call(core, now)] = Handler{.done = done};
        })) {
      done(Completion{.status = absl::CancelledError("the client was destroyed")});
    }
  }

  void Do(const std::function<void(ClientCore&, MonoTime)>& call) override {
    Process([&](ClientCore& core, MonoTime now) { call(core, now); });
  }

  void Read(const std::function<void(const ClientCore&)>& read) const override {
    if (Inherited()) return;  // its lock may be held by a thread the child lacks
    std::lock_guard<std::mutex> lock(mu_);
    read(core_);
  }

  void Shutdown() override {
    if (Inherited()) return;  // the parent's: nothing of it is this process's to close
    {
      std::unique_lock<std::mutex> lock(mu_);
      shut_ = true;
      carried_.wait(lock, [&] { return carrying_ == 0; });
    }
    clock_->Unsubscribe(subscription_);
    std::shared_ptr<Conn> conn;
    {
      std::lock_guard<std::mutex> lock(mu_);
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

  // ---- from the runtime ----

  void Dialed(size_t replica, const std::shared_ptr<Conn>& conn, uint32_t version) {
    auto self = shared_from_this();
    std::optional<client_core::Dial> again;
    Process([&](ClientCore& core, MonoTime now) {
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
      Runtime::Get().Dial(self, *again, options_.tls, options_.tls_server_name,
                          options_.client_name);
    }
  }

  void DialFailed(size_t replica, const absl::Status& status, const std::string& leader) {
    Process([&](ClientCore& core, MonoTime now) {
      core.OnDialFailed(now, replica, status, leader);
    });
  }

  void Disconnected(uint64_t conn) {
    Process([&](ClientCore& core, MonoTime now) {
      if (attached_ != nullptr && attached_->id == conn) attached_ = nullptr;
      core.OnDisconnected(now, conn);
    });
  }

  void Responses(uint64_t conn, const std::vector<wire::Response>& responses) {
    Process([&](ClientCore& core, MonoTime now) {
      for (const wire::Response& r : responses) core.OnResponse(now, conn, r);
    });
  }

  // The timer fired, or the clock moved (I/O thread).
  void Tick() {
    Process([&](ClientCore& core, MonoTime now) {
      armed_at_ = MonoTime::Max();
      core.OnTick(now);
    });
  }

 private:
  struct Handler {
    std::shared_ptr<Waiter> waiter;
    Done done;
  };

  // Made before a fork() of this process, and used in the child (see ForkGeneration).
  bool Inherited() const { return generation_ != ForkGeneration(); }
  // What a pass over the core left to do outside its lock.
  struct Batch {
    std::optional<client_core::Dial> dial;
    std::vector<std::pair<uint64_t, bool>> leave;  // connection, retire
    std::vector<Runtime::Write> flush;
    std::vector<std::pair<Handler, Completion>> done;
    bool lost = false;
    std::vector<client_core::LogLine> logs;
    bool rearm = false;
  };

  static client_core::CoreOptions WithIds(client_core::CoreOptions options) {
    options.next_request_id = [] { return Runtime::Get().NextRequestId(); };
    return options;
  }

  // Runs `f` on the core under the lock with the clock's now, then carries out the actions.
  // False (nothing run) once shut down. With `lead` (a blocking call), the one plaintext
  // connection its requests went to, if so, is left for the caller to read (Runtime::Lead).
  template <typename F>
  bool Process(F&& f, std::shared_ptr<Conn>* lead = nullptr) {
    if (Inherited()) return false;
    Batch batch;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_) return false;
      f(core_, clock_->Now());
      Collect(batch);
      ++carrying_;
    }
    Carry(batch, lead);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--carrying_ == 0) carried_.notify_all();
    }
    return true;
  }

  // mu_ held.
  void Collect(Batch& batch) {
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
    batch.lost = !actions.lost.empty();
    batch.logs = std::move(actions.logs);
    const MonoTime wake = core_.NextWakeup();
    if (wake < armed_at_) {
      armed_at_ = wake;
      batch.rearm = true;
    }
  }

  void Carry(Batch& batch, std::shared_ptr<Conn>* lead) {
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
    if (batch.lost && options_.on_lost) options_.on_lost();
    for (const auto& line : batch.logs) {
      if (options_.log) options_.log(line.level, line.message);
    }
    if (batch.rearm) {
      auto self = shared_from_this();
      asio::post(runtime.io(), [self] { self->Arm(); });
    }
    if (batch.dial) {
      runtime.Dial(shared_from_this(), *batch.dial, options_.tls, options_.tls_server_name,
                   options_.client_name);
    }
  }

  // Sets the timer for the core's next wakeup (I/O thread).
  void Arm() {
    MonoTime wake;
    MonoTime now;
    {
      std::lock_guard<std::mutex> lock(mu_);
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

  const Options options_;
  Clock* const clock_;
  const uint64_t generation_ = ForkGeneration();
  mutable std::mutex mu_;
  std::condition_variable carried_;
  ClientCore core_;                      // guarded by mu_
  std::map<uint64_t, Handler> handlers_; // guarded by mu_
  std::shared_ptr<Conn> attached_;       // guarded by mu_: the connection the core is on
  std::optional<client_core::Dial> last_dial_;  // guarded by mu_: the core's last dial
  MonoTime armed_at_ = MonoTime::Max();  // guarded by mu_
  bool shut_ = false;                    // guarded by mu_
  int carrying_ = 0;                     // guarded by mu_: passes carrying out actions
  uint64_t subscription_ = 0;
  asio::steady_timer timer_;  // the I/O thread's
};

// ---- the runtime ----

std::string KeyOf(const std::string& address, const std::shared_ptr<net::TlsContext>& tls,
                  const std::string& server_name, const std::string& client_name) {
  return absl::StrCat(address, "\n", reinterpret_cast<uintptr_t>(tls.get()), "\n", server_name,
                      "\n", client_name);
}

void Runtime::Dial(const std::shared_ptr<DriverImpl>& driver, const client_core::Dial& dial,
                   const std::shared_ptr<net::TlsContext>& tls, const std::string& server_name,
                   const std::string& client_name) {
  const bool use_tls = tls != nullptr && dial.address.rfind("unix:", 0) != 0;
  const std::string key = KeyOf(dial.address, use_tls ? tls : nullptr, server_name, client_name);
  std::shared_ptr<Conn> up;
  uint32_t version = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, conn] : conns_) {
      if (conn->key != key || conn->retired || conn->state == Conn::State::kClosed ||
          conn->Load() >= kSessionsPerConnection) {
        continue;
      }
      if (conn->state == Conn::State::kDialing) {
        conn->dialers.emplace_back(driver, dial.replica);
        return;
      }
      up = conn;
      version = conn->version;
      break;
    }
    if (up == nullptr) {
      auto conn = std::make_shared<Conn>(io_);
      conn->id = ++next_conn_;
      conn->key = key;
      conn->address = dial.address;
      conn->server_name = server_name.empty() ? net::ServerNameOf(dial.address) : server_name;
      conn->client_name = client_name;
      if (use_tls) conn->tls_context = tls;
      conn->dialers.emplace_back(driver, dial.replica);
      conns_[conn->id] = conn;
      asio::post(io_, [this, conn, timeout = dial.timeout] { StartDial(conn, timeout); });
      return;
    }
  }
  driver->Dialed(dial.replica, up, version);
}

bool Runtime::Attach(const std::shared_ptr<Conn>& conn,
                     const std::shared_ptr<DriverImpl>& driver) {
  std::lock_guard<std::mutex> lock(mu_);
  if (conn->state != Conn::State::kUp) return false;
  conn->attached.push_back(driver);
  return true;
}

bool Runtime::Leave(const DriverImpl* driver, uint64_t id, bool retire) {
  std::shared_ptr<Conn> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = conns_.find(id);
    if (it == conns_.end()) return false;
    Conn& conn = *it->second;
    std::erase_if(conn.attached, [&](const std::weak_ptr<DriverImpl>& w) {
      auto d = w.lock();
      return d == nullptr || d.get() == driver;
    });
    if (retire) conn.retired = true;
    if (conn.state == Conn::State::kUp && conn.attached.empty()) {
      conn.state = Conn::State::kClosed;
      idle = it->second;
      conns_.erase(it);
    }
  }
  if (idle != nullptr) {
    {
      std::lock_guard<std::mutex> lock(idle->wmu);
      idle->closed = true;
    }
    asio::post(io_, [this, idle] { CloseSocket(idle); });
  }
  return idle != nullptr;
}

bool Runtime::Append(Write& write, const wire::Request& request,
                     const std::weak_ptr<DriverImpl>& driver, bool last) {
  Conn& conn = *write.conn;
  const size_t size = request.ByteSizeLong();
  std::lock_guard<std::mutex> lock(conn.wmu);
  if (conn.closed) return false;
  const size_t at = conn.out.size();
  conn.out.resize(at + protocol::kFrameHeaderBytes + size);
  protocol::WriteFrameHeader(static_cast<uint32_t>(size), conn.out.data() + at);
  request.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(conn.out.data() + at + protocol::kFrameHeaderBytes));
  // Hello's answer is the I/O thread's own (no driver): nobody else awaits it.
  if (!driver.expired()) conn.routes[request.request_id()] = driver;
  if (conn.out.size() > kMaxUnwritten) {
    write.overflow = true;
    conn.writing = true;  // for good: the connection ends
    return true;
  }
  if (last && !conn.writing && !conn.delivering) {
    conn.writing = true;
    write.claimed = true;
    if (conn.tls_context == nullptr) {
      write.chunk.swap(conn.out);
      conn.out.clear();
    }
  }
  return true;
}

void Runtime::Flush(Write& write) {
  const std::shared_ptr<Conn>& conn = write.conn;
  if (conn == nullptr) return;
  if (write.overflow) {
    asio::post(io_, [this, conn] {
      Fail(conn, absl::UnavailableError(absl::StrCat(
                     "lockd at ", conn->address, " stopped reading: ", kMaxUnwritten >> 20,
                     " MiB of requests wait to be written")));
    });
    return;
  }
  if (!write.claimed) return;
  if (conn->tls_context != nullptr) {
    asio::post(io_, [this, conn] { WriteTls(conn); });
    return;
  }
  WritePlain(conn, std::move(write.chunk));
}

// Writes `chunk`, then `out` until it is empty (taking along what others append meanwhile),
// with `writing` claimed. A full socket hands the rest to the I/O thread, which waits until it
// can write.
void Runtime::WritePlain(const std::shared_ptr<Conn>& conn, std::string chunk) {
  for (;;) {
    if (chunk.empty()) {
      std::lock_guard<std::mutex> lock(conn->wmu);
      if (conn->closed || conn->out.empty()) {
        conn->writing = false;
        return;
      }
      chunk.swap(conn->out);
      conn->out.clear();
    }
    size_t sent = 0;
    int error = 0;
    {
      std::lock_guard<std::mutex> lock(conn->fd_mu);
      while (sent < chunk.size() && conn->fd >= 0) {
        // send() with MSG_NOSIGNAL: a peer that closed gives EPIPE, not a SIGPIPE.
        const ssize_t n = ::send(conn->fd, chunk.data() + sent, chunk.size() - sent,
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
          sent += static_cast<size_t>(n);
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else {
          error = n < 0 ? errno : EPIPE;
          break;
        }
      }
      if (conn->fd < 0 && sent < chunk.size()) error = EBADF;
    }
    if (sent == chunk.size()) {
      chunk.clear();
      continue;
    }
    if (error == EAGAIN || error == EWOULDBLOCK) {
      std::lock_guard<std::mutex> lock(conn->wmu);
      conn->out.insert(0, chunk, sent);
      conn->write_blocked = true;
      Rearm(*conn);
      return;  // `writing` stays claimed: the I/O thread goes on once it can write
    }
    asio::post(io_, [this, conn, error] {
      Fail(conn, absl::UnavailableError(absl::StrCat("writing to lockd at ", conn->address,
                                                     " failed: ", std::strerror(error))));
    });
    return;
  }
}

void Runtime::WriteTls(const std::shared_ptr<Conn>& conn) {
  {
    std::lock_guard<std::mutex> lock(conn->wmu);
    if (conn->closed || conn->out.empty() || conn->tls == nullptr) {
      conn->writing = false;
      return;
    }
    conn->tls_chunk.swap(conn->out);
    conn->out.clear();
  }
  asio::async_write(*conn->tls, asio::buffer(conn->tls_chunk),
                    [this, conn](boost::system::error_code ec, size_t) {
                      if (ec) {
                        return Fail(conn, absl::UnavailableError(absl::StrCat(
                                              "writing to lockd at ", conn->address,
                                              " failed: ", ec.message())));
                      }
                      WriteTls(conn);
                    });
}

void Runtime::StartDial(const std::shared_ptr<Conn>& conn, absl::Duration timeout) {
  auto failed = [this, conn](std::string why) {
    Fail(conn, absl::UnavailableError(
                   absl::StrCat("cannot connect to lockd at ", conn->address, ": ", why)));
  };
  auto parsed = protocol::ParseAddress(conn->address);
  if (!parsed.ok()) return Fail(conn, parsed.status());
  // Bounded: an absurd timeout (absl::InfiniteDuration()) would overflow the steady clock.
  conn->timer.expires_after(absl::ToChronoNanoseconds(std::min(timeout, absl::Hours(24 * 365))));
  conn->timer.async_wait([failed, timeout](boost::system::error_code ec) {
    if (!ec) failed(absl::StrCat("no answer within ", absl::FormatDuration(timeout)));
  });
  auto connect = [this, conn, failed](const asio::generic::stream_protocol::endpoint& ep) {
    // Close-on-exec from the start: a program the process execs (or a child of fork() that
    // does) must not keep lockd's connection open. Asio would open it without.
    const int fd = ::socket(ep.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC,
                            ep.protocol().protocol());
    if (fd < 0) {
      const int error = errno;
      return failed(absl::StrCat(std::strerror(error), error == EMFILE || error == ENFILE
                                                           ? " (out of file descriptors)"
                                                           : ""));
    }
    boost::system::error_code assigned;
    conn->socket.assign(ep.protocol(), fd, assigned);
    if (assigned) {
      ::close(fd);
      return failed(assigned.message());
    }
    conn->socket.async_connect(ep, [this, conn, failed](boost::system::error_code ec) {
      if (ec == asio::error::no_descriptors || ec.value() == ENFILE) {
        return failed(absl::StrCat(ec.message(), " (out of file descriptors)"));
      }
      if (ec) return failed(ec.message());
      Connected(conn);
    });
  };
  if (parsed->unix_socket()) {
    return connect(asio::local::stream_protocol::endpoint(parsed->path));
  }
  // A numeric address needs no resolver (whose thread Asio starts on first use).
  boost::system::error_code numeric;
  const asio::ip::address ip = asio::ip::make_address(parsed->host, numeric);
  if (!numeric) return connect(asio::ip::tcp::endpoint(ip, parsed->port));
  conn->resolver.async_resolve(
      parsed->host, std::to_string(parsed->port), asio::ip::tcp::resolver::numeric_service,
      [conn, failed, connect](boost::system::error_code ec,
                              asio::ip::tcp::resolver::results_type results) {
        if (ec || results.empty()) {
          return failed(absl::StrCat("cannot resolve \"", conn->address,
                                     "\": ", ec ? ec.message() : "no address"));
        }
        connect(results.begin()->endpoint());
      });
}

void Runtime::Connected(const std::shared_ptr<Conn>& conn) {
  boost::system::error_code ec;
  if (conn->socket.local_endpoint(ec).protocol().family() != AF_UNIX) {
    const int one = 1;
    ::setsockopt(conn->socket.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  auto hello = [this, conn] {
    wire::Request request = protocol::HelloRequest(conn->client_name);
    conn->hello_id = NextRequestId();
    request.set_request_id(conn->hello_id);
    Write write{.conn = conn};
    Append(write, request, {}, true);
    Flush(write);
    if (conn->tls != nullptr) Read(conn);
  };
  if (conn->tls_context == nullptr) {
    if (absl::Status s = Register(conn); !s.ok()) {
      return Fail(conn, absl::UnavailableError(absl::StrCat("cannot connect to lockd at ",
                                                            conn->address, ": ", s.message())));
    }
    return hello();
  }
  {
    std::lock_guard<std::mutex> lock(conn->wmu);
    conn->reader = Conn::Reader::kIo;
  }
  SSL_CTX_up_ref(conn->tls_context->native());  // Asio's context holds a reference of its own
  conn->ssl_context.emplace(conn->tls_context->native());
  conn->tls = std::make_unique<asio::ssl::stream<Socket&>>(conn->socket, *conn->ssl_context);
  if (absl::Status s = net::ExpectServerName(conn->tls->native_handle(), conn->server_name);
      !s.ok()) {
    return Fail(conn, absl::UnavailableError(absl::StrCat("cannot connect to lockd at ",
                                                          conn->address, ": ", s.message())));
  }
  conn->tls->async_handshake(asio::ssl::stream_base::client,
                             [this, conn, hello](boost::system::error_code ec) {
                               if (ec) {
                                 return Fail(conn, absl::UnavailableError(absl::StrCat(
                                                       "cannot connect to lockd at ",
                                                       conn->address, ": TLS handshake failed: ",
                                                       ec.message())));
                               }
                               hello();
                             });
}

void Runtime::Read(const std::shared_ptr<Conn>& conn) {
  conn->tls->async_read_some(asio::buffer(conn->in), [this, conn](boost::system::error_code ec,
                                                                  size_t n) {
    if (ec) {
      return Fail(conn, absl::UnavailableError(absl::StrCat(
                            "the connection to lockd at ", conn->address, " ended: ",
                            ec == asio::error::eof ? "closed by lockd" : ec.message())));
    }
    conn->decoder.Feed(std::string_view(conn->in.data(), n));
    Deliver(conn);
    if (conn->socket.is_open()) Read(conn);
  });
}

absl::Status Runtime::Register(const std::shared_ptr<Conn>& conn) {
  if (set_ == nullptr) {
    // Made on the first plaintext connection (again after a failure: descriptors run out).
    const int fd = ::epoll_create1(EPOLL_CLOEXEC);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("cannot make the client's epoll set: ",
                                                 std::strerror(errno),
                                                 errno == EMFILE ? " (out of file descriptors)" : ""));
    }
    set_ = std::make_unique<asio::posix::stream_descriptor>(io_, fd);
    WatchSet();
  }
  // Asio lets go of the socket (and takes it out of its own epoll); the runtime owns it now.
  boost::system::error_code ec;
  const int fd = conn->socket.release(ec);
  if (ec) return absl::UnavailableError(ec.message());
  std::lock_guard<std::mutex> lock(conn->wmu);
  {
    std::lock_guard<std::mutex> fd_lock(conn->fd_mu);
    conn->fd = fd;
  }
  conn->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);  // -1: callers never read it
  conn->reader = Conn::Reader::kIo;                         // Hello's answer
  conn->events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  epoll_event e{.events = conn->events, .data = {.u64 = conn->id}};
  if (::epoll_ctl(set_->native_handle(), EPOLL_CTL_ADD, fd, &e) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot watch the connection: ", std::strerror(errno)));
  }
  registered_[conn->id] = conn;
  return absl::OkStatus();
}

void Runtime::Rearm(Conn& conn) {
  const uint32_t events = EPOLLRDHUP | EPOLLET |
                          (conn.reader == Conn::Reader::kIo ? EPOLLIN : 0u) |
                          (conn.write_blocked ? EPOLLOUT : 0u);
  if (events == conn.events || conn.fd < 0 || conn.closed) return;
  conn.events = events;
  // A socket already readable (or writable) gives an event at once.
  epoll_event e{.events = events, .data = {.u64 = conn.id}};
  if (::epoll_ctl(set_->native_handle(), EPOLL_CTL_MOD, conn.fd, &e) != 0) {
    asio::post(io_, [this, id = conn.id, error = errno] {
      if (std::shared_ptr<Conn> failed = Find(id)) {
        Fail(failed, absl::UnavailableError(absl::StrCat(
                         "cannot watch the connection to lockd at ", failed->address, ": ",
                         std::strerror(error))));
      }
    });
  }
}

void Runtime::WatchSet() {
  set_->async_wait(asio::posix::stream_descriptor::wait_read,
                   [this](boost::system::error_code ec) {
                     if (ec) return;
                     constexpr int kBatch = 64;
                     epoll_event events[kBatch];
                     for (;;) {
                       const int n = ::epoll_wait(set_->native_handle(), events, kBatch, 0);
                       if (n < 0 && errno == EINTR) continue;
                       for (int i = 0; i < n; ++i) {
                         auto it = registered_.find(events[i].data.u64);
                         if (it == registered_.end()) continue;
                         if (auto conn = it->second.lock()) OnEvents(conn, events[i].events);
                       }
                       if (n < kBatch) break;
                     }
                     WatchSet();
                   });
}

void Runtime::OnEvents(const std::shared_ptr<Conn>& conn, uint32_t events) {
  if ((events & EPOLLOUT) != 0) {
    bool write = false;
    {
      std::lock_guard<std::mutex> lock(conn->wmu);
      write = std::exchange(conn->write_blocked, false);
      Rearm(*conn);
    }
    if (write) WritePlain(conn, "");
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) return;
  {
    std::lock_guard<std::mutex> lock(conn->wmu);
    // A caller reading it sees for itself; nobody reading it: lockd closed it (or wrote what
    // nobody awaits), which the read finds out.
    if (conn->closed || conn->reader == Conn::Reader::kCaller) return;
    conn->reader = Conn::Reader::kIo;
  }
  ReadPlain(conn);
}

void Runtime::ReadPlain(const std::shared_ptr<Conn>& conn) {
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(conn->wmu);
    if (conn->closed) return;
    fd = conn->fd;
  }
  // Edge-triggered: until a read finds less than it asked for (then nothing is left).
  for (;;) {
    const ssize_t n = ::recv(fd, conn->in.data(), conn->in.size(), MSG_DONTWAIT);
    if (n > 0) {
      conn->decoder.Feed(std::string_view(conn->in.data(), static_cast<size_t>(n)));
      if (static_cast<size_t>(n) < conn->in.size()) break;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      Deliver(conn);  // what came before the end
      return Fail(conn, absl::UnavailableError(absl::StrCat(
                            "the connection to lockd at ", conn->address, " ended: ",
                            n == 0 ? "closed by lockd" : std::strerror(errno))));
    }
  }
  {
    std::lock_guard<std::mutex> lock(conn->wmu);
    conn->delivering = !conn->closed;
  }
  Deliver(conn);
  std::string chunk;
  {
    // Reads on while a reply is awaited; else nobody reads until a request is sent again, so
    // that its caller may read its reply itself.
    std::lock_guard<std::mutex> lock(conn->wmu);
    conn->delivering = false;
    if (conn->closed) return;
    if (!conn->writing && !conn->out.empty()) {
      conn->writing = true;
      chunk.swap(conn->out);
    }
    if (conn->reader == Conn::Reader::kIo) {
      if (conn->hello_id == 0 && conn->routes.empty()) conn->reader = Conn::Reader::kNone;
      Rearm(*conn);
    }
  }
  // What the woken callers appended meanwhile.
  if (!chunk.empty()) WritePlain(conn, std::move(chunk));
}

void Runtime::Deliver(const std::shared_ptr<Conn>& conn) {
  std::vector<wire::Response> responses;
  std::string payload;
  for (;;) {
    const protocol::FrameDecoder::Result next = conn->decoder.Next(&payload);
    if (next == protocol::FrameDecoder::Result::kNeedMore) break;
    if (next == protocol::FrameDecoder::Result::kTooLarge) {
      return Fail(conn, absl::UnavailableError(absl::StrCat(
                            "lockd at ", conn->address, " sent a frame of ",
                            conn->decoder.announced_length(), " bytes, more than the most")));
    }
    wire::Response response;
    if (!response.ParseFromString(payload)) {
      return Fail(conn, absl::UnavailableError(
                            absl::StrCat("lockd at ", conn->address, " sent an unreadable reply")));
    }
    // Before Hello is answered, an answer with no request id is lockd refusing the connection
    // (admission, plaintext on its TLS port): Hello's answer too.
    if (conn->hello_id != 0 &&
        (response.request_id() == conn->hello_id || response.request_id() == 0)) {
      conn->hello_id = 0;
      HelloAnswered(conn, response);
      std::lock_guard<std::mutex> lock(conn->wmu);
      if (conn->closed) return;
      continue;
    }
    responses.push_back(std::move(response));
  }
  if (responses.empty()) return;
  // Each reply to the driver whose request it answers, all of one driver's in one pass; the
  // routes are looked up under one lock for the whole read.
  std::vector<std::pair<std::shared_ptr<DriverImpl>, std::vector<wire::Response>>> batches;
  std::vector<std::weak_ptr<DriverImpl>> owners(responses.size());
  {
    std::lock_guard<std::mutex> lock(conn->wmu);
    for (size_t i = 0; i < responses.size(); ++i) {
      auto it = conn->routes.find(responses[i].request_id());
      if (it == conn->routes.end()) continue;
      owners[i] = std::move(it->second);
      conn->routes.erase(it);
    }
  }
  for (size_t i = 0; i < responses.size(); ++i) {
    std::shared_ptr<DriverImpl> driver = owners[i].lock();
    if (driver == nullptr) continue;
    auto batch = std::find_if(batches.begin(), batches.end(),
                              [&](const auto& b) { return b.first == driver; });
    if (batch == batches.end()) {
      batches.emplace_back(driver, std::vector<wire::Response>{});
      batch = batches.end() - 1;
    }
    batch->second.push_back(std::move(responses[i]));
  }
  for (auto& [driver, mine] : batches) driver->Responses(conn->id, mine);
}

void Runtime::HelloAnswered(const std::shared_ptr<Conn>& conn, const wire::Response& reply) {
  std::string leader;
  absl::StatusOr<uint32_t> version = protocol::ReadHelloReply(reply, conn->address, &leader);
  if (!version.ok()) return Fail(conn, version.status(), leader);
  conn->timer.cancel();
  std::vector<std::pair<std::weak_ptr<DriverImpl>, size_t>> dialers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn->state != Conn::State::kDialing) return;
    conn->state = Conn::State::kUp;
    conn->version = *version;
    dialers.swap(conn->dialers);
  }
  for (auto& [weak, replica] : dialers) {
    if (auto driver = weak.lock()) driver->Dialed(replica, conn, *version);
  }
  // Nobody stayed: the connection is idle.
  bool idle = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn->state == Conn::State::kUp && conn->attached.empty()) {
      conn->state = Conn::State::kClosed;
      conns_.erase(conn->id);
      idle = true;
    }
  }
  if (idle) {
    {
      std::lock_guard<std::mutex> lock(conn->wmu);
      conn->closed = true;
    }
    CloseSocket(conn);
  }
}

void Runtime::Fail(const std::shared_ptr<Conn>& conn, const absl::Status& status,
                   const std::string& leader) {
  std::vector<std::pair<std::weak_ptr<DriverImpl>, size_t>> dialers;
  std::vector<std::weak_ptr<DriverImpl>> attached;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn->state != Conn::State::kClosed) {
      conn->state = Conn::State::kClosed;
      conns_.erase(conn->id);
    }
    dialers.swap(conn->dialers);
    attached.swap(conn->attached);
  }
  {
    std::lock_guard<std::mutex> lock(conn->wmu);
    conn->closed = true;
    conn->out.clear();
    conn->routes.clear();
  }
  CloseSocket(conn);
  for (auto& [weak, replica] : dialers) {
    if (auto driver = weak.lock()) driver->DialFailed(replica, status, leader);
  }
  for (auto& weak : attached) {
    if (auto driver = weak.lock()) driver->Disconnected(conn->id);
  }
}

void Runtime::CloseSocket(const std::shared_ptr<Conn>& conn) {
  if (!OnItsThread()) {
    asio::post(io_, [this, conn] { CloseSocket(conn); });
    return;
  }
  boost::system::error_code ec;
  conn->timer.cancel();
  conn->resolver.cancel();
  std::lock_guard<std::mutex> lock(conn->wmu);
  std::lock_guard<std::mutex> fd_lock(conn->fd_mu);
  if (conn->reader == Conn::Reader::kCaller) {
    // Its poll() wakes; the descriptor stays its until it stops reading (see Lead).
    conn->close_after_lead = true;
    if (conn->fd >= 0) ::shutdown(conn->fd, SHUT_RDWR);
    return;
  }
  if (conn->fd >= 0) {
    ::epoll_ctl(set_->native_handle(), EPOLL_CTL_DEL, conn->fd, nullptr);
    ::close(conn->fd);
    conn->fd = -1;
    registered_.erase(conn->id);
  }
  conn->socket.close(ec);  // a socket still Asio's (dialing, or TLS)
}

void Runtime::EnsureReader(const std::shared_ptr<Conn>& conn) {
  std::lock_guard<std::mutex> lock(conn->wmu);
  if (conn->closed || conn->reader != Conn::Reader::kNone || conn->routes.empty()) return;
  conn->reader = Conn::Reader::kIo;
  Rearm(*conn);
}

void Runtime::Lead(const std::shared_ptr<Conn>& conn, Waiter& waiter) {
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(conn->wmu);
    if (conn->closed || conn->reader != Conn::Reader::kNone) return;
    if (waiter.done.load(std::memory_order_acquire) != 0 || conn->wake_fd < 0) {
      if (!conn->routes.empty()) {
        conn->reader = Conn::Reader::kIo;
        Rearm(*conn);
      }
      return;
    }
    conn->reader = Conn::Reader::kCaller;
    std::lock_guard<std::mutex> fd_lock(conn->fd_mu);
    fd = conn->fd;
  }
  {
    std::lock_guard<std::mutex> lock(waiter.mu);
    waiter.polling = conn->wake_fd;
  }
  while (fd >= 0 && waiter.done.load(std::memory_order_acquire) == 0) {
    {
      std::lock_guard<std::mutex> lock(conn->wmu);
      if (conn->closed) break;
    }
    pollfd fds[2] = {{.fd = fd, .events = POLLIN, .revents = 0},
                     {.fd = conn->wake_fd, .events = POLLIN, .revents = 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;  // the I/O thread reads on
    }
    if (fds[1].revents != 0) {
      uint64_t count;
      (void)!::read(conn->wake_fd, &count, sizeof(count));
    }
    if (fds[0].revents == 0) continue;
    const ssize_t n = ::recv(fd, conn->in.data(), conn->in.size(), MSG_DONTWAIT);
    if (n > 0) {
      conn->decoder.Feed(std::string_view(conn->in.data(), static_cast<size_t>(n)));
      Deliver(conn);
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      Fail(conn, absl::UnavailableError(absl::StrCat(
                     "the connection to lockd at ", conn->address, " ended: ",
                     n == 0 ? "closed by lockd" : std::strerror(errno))));
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(waiter.mu);
    waiter.polling = -1;
  }
  bool close = false;
  {
    std::lock_guard<std::mutex> lock(conn->wmu);
    close = std::exchange(conn->close_after_lead, false);
    conn->reader = !close && !conn->closed && !conn->routes.empty() ? Conn::Reader::kIo
                                                                     : Conn::Reader::kNone;
    Rearm(*conn);
  }
  if (close) CloseSocket(conn);
}


std::atomic<uint64_t> g_fork_generation{0};
std::atomic<Runtime*> g_runtime{nullptr};
// Taken around fork() (pthread_atfork), so that no thread the child lacks can hold it there.
std::mutex g_runtime_mu;

Runtime& Runtime::Get() {
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) return *runtime;
  std::lock_guard<std::mutex> lock(g_runtime_mu);
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) return *runtime;
  static const bool registered = [] {
    // In the child only its own thread runs: the parent's runtime (its I/O thread, its
    // sockets, its locks) is left behind, never touched, and the next Client makes another.
    ::pthread_atfork([] { g_runtime_mu.lock(); }, [] { g_runtime_mu.unlock(); },
                     [] {
                       g_runtime.store(nullptr, std::memory_order_release);
                       g_fork_generation.fetch_add(1, std::memory_order_release);
                       g_runtime_mu.unlock();
                     });
    return true;
  }();
  (void)registered;
  auto* runtime = new Runtime();
  g_runtime.store(runtime, std::memory_order_release);
  return *runtime;
}

}  // namespace

uint64_t ForkGeneration() { return g_fork_generation.load(std::memory_order_acquire); }

absl::Status InheritedError() {
  return absl::FailedPreconditionError(
      "this Client was made before fork(), in the parent process: its session, locks and "
      "connection are the parent's; make a new Client in this process");
}

std::shared_ptr<Driver> Driver::Create(Options options) {
  auto driver = std::make_shared<DriverImpl>(std::move(options));
  driver->Subscribe();
  return driver;
}

}  // namespace fencelock::client_internal
