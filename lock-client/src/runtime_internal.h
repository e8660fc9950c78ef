// The client runtime's parts (runtime.h), inside: a shared connection (Conn), a blocking
// caller's wait (Waiter), the process's runtime (Runtime: its I/O thread and connections,
// runtime.cc) and a Client's driver (DriverImpl: its core behind a mutex, driver.cc). Only
// those two files include this.
#ifndef FENCELOCK_LOCK_CLIENT_SRC_RUNTIME_INTERNAL_H_
#define FENCELOCK_LOCK_CLIENT_SRC_RUNTIME_INTERNAL_H_

#include <utility>  // first: Boost 1.74's Asio uses std::exchange without it (GCC 12, C++20)

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <condition_variable>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "clock/std_mutex.h"
#include "protocol/frame.h"
#include "runtime.h"

namespace fencelock::client_internal {

namespace asio = boost::asio;
using Socket = asio::generic::stream_protocol::socket;
using client_core::ClientCore;
using client_core::Completion;

// A connection that lockd does not read for so long that this much waits to be written is
// given up: its requests fail, and the Clients on it dial again.
inline constexpr size_t kMaxUnwritten = size_t{64} << 20;

// The longest a driver's timer sleeps before it looks at the Clock again (see Arm).
inline constexpr absl::Duration kLongestSleep = absl::Milliseconds(500);

class DriverImpl;  // below

struct Conn {
  explicit Conn(asio::io_context& io) : socket(io), timer(io), resolver(io) {}

  uint64_t id = 0;
  std::string key;  // what a connection must match to be shared: address, TLS, names
  std::string address;
  std::string server_name;
  std::string client_name;
  std::shared_ptr<net::TlsContext> tls_context;

  // ---- guarded by Runtime::mu_ (a lock of another object, which the analysis cannot name) ----
  enum class State { kDialing, kUp, kClosed };
  State state = State::kDialing;
  bool retired = false;  // a Client gave up on it: no new Client joins it
  uint32_t version = 0;
  std::vector<std::pair<std::weak_ptr<DriverImpl>, size_t>> dialers;  // with their replica
  std::vector<std::weak_ptr<DriverImpl>> attached;

  // ---- the write side and who reads ----
  StdMutex wmu;
  std::string out ABSL_GUARDED_BY(wmu);       // frames not written yet
  bool writing ABSL_GUARDED_BY(wmu) = false;  // a thread (or the I/O thread's wait) writes `out`
  // Plaintext: the I/O thread is handing over the replies of one read. What is appended
  // meanwhile (the next requests of the callers it wakes) waits for the end of that pass and
  // leaves in one write with the rest, instead of a send() each.
  bool delivering ABSL_GUARDED_BY(wmu) = false;
  bool closed ABSL_GUARDED_BY(wmu) = false;
  // Request id to its driver.
  std::unordered_map<uint64_t, std::weak_ptr<DriverImpl>> routes ABSL_GUARDED_BY(wmu);
  // Who reads the socket: the I/O thread, a caller waiting for its own reply (plaintext only,
  // see Runtime::Lead), or nobody (plaintext, nothing awaited). The holder owns `decoder` and
  // `in`. Over TLS the I/O thread always reads.
  enum class Reader { kNone, kIo, kCaller };
  Reader reader ABSL_GUARDED_BY(wmu) = Reader::kNone;
  // The socket was to close while a caller read it.
  bool close_after_lead ABSL_GUARDED_BY(wmu) = false;
  // Plaintext: the socket is full; the I/O thread writes on.
  bool write_blocked ABSL_GUARDED_BY(wmu) = false;
  // Plaintext: what the runtime's epoll set watches it for.
  uint32_t events ABSL_GUARDED_BY(wmu) = 0;
  // Held around send() and the socket's close, so that a send never reaches a descriptor
  // number that was closed and reused.
  StdMutex fd_mu;
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
  StdMutex mu;
  int polling ABSL_GUARDED_BY(mu) = -1;  // the wake_fd its thread polls, or -1

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
      StdMutexLock lock(&mu);
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
    StdMutexLock lock(&mu_);
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
  // Brings the set's watch of `conn` in line with its state.
  void Rearm(Conn& conn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(conn.wmu);
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
  StdMutex mu_;
  std::map<uint64_t, std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);  // open and dialing
  uint64_t next_conn_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
  std::thread::id thread_id_;
  // ---- the I/O thread's ----
  std::unique_ptr<asio::posix::stream_descriptor> set_;  // the epoll set; null until made
  std::unordered_map<uint64_t, std::weak_ptr<Conn>> registered_;  // in the set, by id
};

// A Client's driver (runtime.h's Driver): its core, the actions it leaves, its timer.
class DriverImpl final : public Driver, public std::enable_shared_from_this<DriverImpl> {
 public:
  explicit DriverImpl(Options options)
      : options_(std::move(options)),
        clock_(options_.clock),
        core_(WithIds(options_.core)),
        timer_(Runtime::Get().io()) {}

  // Follows the clock (a move of a simulated one is a tick).
  void Subscribe();
  Completion Run(const Call& call) override;
  void Start(const Call& call, Done done) override;
  void Do(const std::function<void(ClientCore&, MonoTime)>& call) override;
  void Read(const std::function<void(const ClientCore&)>& read) const override;
  void Shutdown() override;

  // ---- from the runtime ----
  void Dialed(size_t replica, const std::shared_ptr<Conn>& conn, uint32_t version);
  void DialFailed(size_t replica, const absl::Status& status, const std::string& leader);
  void Disconnected(uint64_t conn);
  void Responses(uint64_t conn, const std::vector<wire::Response>& responses);

  // The timer fired, or the clock moved (I/O thread).
  void Tick();

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
    std::vector<std::shared_ptr<LeaseState>> lost;
    std::vector<client_core::LogLine> logs;
    bool rearm = false;
  };

  static client_core::CoreOptions WithIds(client_core::CoreOptions options);

  // Runs `f` on the core under the lock with the clock's now, then carries out the actions.
  // False (nothing run) once shut down. With `lead` (a blocking call), the one plaintext
  // connection its requests went to, if so, is left for the caller to read (Runtime::Lead).
  template <typename F>
  bool Process(F&& f, std::shared_ptr<Conn>* lead = nullptr);
  void Collect(Batch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Carry(Batch& batch, std::shared_ptr<Conn>* lead);
  // Sets the timer for the core's next wakeup (I/O thread).
  void Arm();
  // The TLS context for a new connection (nullptr: plaintext): the newest files that load. A
  // change of the files that does not load is logged, and the files loaded before are used.
  std::shared_ptr<net::TlsContext> TlsForDial();

  const Options options_;
  Clock* const clock_;
  const uint64_t generation_ = ForkGeneration();
  mutable StdMutex mu_;
  std::condition_variable carried_;
  ClientCore core_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Handler> handlers_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Conn> attached_ ABSL_GUARDED_BY(mu_);  // the connection the core is on
  std::optional<client_core::Dial> last_dial_ ABSL_GUARDED_BY(mu_);  // the core's last dial
  MonoTime armed_at_ ABSL_GUARDED_BY(mu_) = MonoTime::Max();
  bool shut_ ABSL_GUARDED_BY(mu_) = false;
  int carrying_ ABSL_GUARDED_BY(mu_) = 0;  // passes carrying out actions
  uint64_t subscription_ = 0;
  asio::steady_timer timer_;  // the I/O thread's
};

}  // namespace fencelock::client_internal

#endif  // FENCELOCK_LOCK_CLIENT_SRC_RUNTIME_INTERNAL_H_
