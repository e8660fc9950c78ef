// The client's runtime: what carries out the client core's actions (lock-client/core).
//
// Every Client of a process shares one I/O thread and, per lockd replica, one connection that
// carries the sessions of up to kSessionsPerConnection Clients (lockd binds each session to
// the connection it runs on, whichever Client's it is). A Client is one Driver: its ClientCore
// behind a mutex, called by whichever thread has something for it (the caller of a blocking
// call, the I/O thread with replies, a timer, a dial). The requests the core emits are framed
// and appended to their connection's write buffer under the Driver's mutex, so that one core's
// requests reach lockd in the order it emitted them; then the thread that appended writes the
// buffer with one send() unless another thread is writing it already, in which case that one
// takes them along: concurrent callers' requests leave in one write. While the I/O thread hands
// over the replies of one read, what the callers it wakes append waits for the end of that
// pass and leaves in one write of the I/O thread's. Replies are read by one
// reader at a time per connection: a blocking caller whose request went out while nobody read
// reads the connection itself until its own reply comes (no hand-over between threads);
// otherwise the I/O thread reads. Whoever reads hands each reply to the Driver whose request
// it answers (request ids are unique in the process) and wakes the caller waiting for it. The
// I/O thread watches plaintext sockets in an epoll set of its own, for data only while it is
// their reader (Asio's reactor would wake it for every reply), and always for lockd closing
// them. Over TLS the I/O thread does all reading and writing.
//
// Timers: each Driver keeps one timer for its core's NextWakeup(), sleeping at most 500 ms at
// a time (the monotonic clock stops in a suspend; the leases' clock does not). Timers only
// trigger a look at the Driver's Clock; on a SimulatedClock, every move of the clock does too.
// A lease's deadline is one of those wake-ups: the core reports the loss then, and onLost is
// called on the Client's callback thread.
#ifndef FENCELOCK_LOCK_CLIENT_SRC_RUNTIME_H_
#define FENCELOCK_LOCK_CLIENT_SRC_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "clock/clock.h"
#include "lock-client/core/client_core.h"
#include "net/tls.h"

namespace fencelock::client_internal {

// Sessions one shared connection carries at most (lockd's --max-sessions-per-connection is 64
// by default); more Clients open another connection to the same replica.
inline constexpr size_t kSessionsPerConnection = 64;

// fork(): a child has none of its parent's threads, and its copies of the parent's sockets are
// the parent's connections. The child's first Client gets a runtime of its own; a Driver made
// before the fork is the parent's, and in the child it refuses every call (Inherited) without
// touching anything the parent uses, and its Shutdown lets go of nothing.
// How many fork()s this process is removed from the one that made a Driver: a Driver is
// inherited when its generation is not the current one.
uint64_t ForkGeneration();
// What an inherited Client's calls answer.
absl::Status InheritedError();

class Driver {
 public:
  struct Options {
    client_core::CoreOptions core;  // next_request_id is set by the runtime
    Clock* clock = nullptr;         // never null
    // The certificates, read again when their files change (at the next connection made).
    std::shared_ptr<net::ReloadingTlsContext> tls;
    std::string tls_server_name;
    std::string client_name;
    // Leases the core reports lost, with them; called outside every lock of the driver, never
    // after Shutdown() returned.
    std::function<void(std::vector<std::shared_ptr<LeaseState>>)> on_lost;
    std::function<void(LogLevel, const std::string&)> log;
  };
  using Done = std::function<void(client_core::Completion)>;
  // What a call does to the core: starts one operation and returns its id.
  using Call = std::function<uint64_t(client_core::ClientCore&, MonoTime)>;

  static std::shared_ptr<Driver> Create(Options options);
  virtual ~Driver() = default;

  // Runs `call` and blocks until its operation completes. An inherited driver (see
  // ForkGeneration) runs nothing here and in Start, Do and Read, and completes with
  // InheritedError().
  virtual client_core::Completion Run(const Call& call) = 0;
  // Runs `call`; `done` gets the completion on whichever thread completes it (possibly this
  // one, before Start returns), without the driver's locks. It must not block.
  virtual void Start(const Call& call, Done done) = 0;
  // Runs `call` on the core (a call that starts no operation), then carries out its actions.
  // Does nothing once shut down.
  virtual void Do(const std::function<void(client_core::ClientCore&, MonoTime)>& call) = 0;
  // Reads the core under the driver's lock.
  virtual void Read(const std::function<void(const client_core::ClientCore&)>& read) const = 0;
  // Stops: no callback (on_lost, log, a pending Done) runs after this returns; the driver
  // leaves its connection, whose socket closes with its last driver. Call once, after the
  // core's Close completed.
  virtual void Shutdown() = 0;
};

}  // namespace fencelock::client_internal

#endif  // FENCELOCK_LOCK_CLIENT_SRC_RUNTIME_H_
