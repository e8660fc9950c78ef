// An epoll set of lockd's own for its plaintext connections, so that reading a request costs
// one read() and no readiness wait of its own. Asio's reactor re-registers a socket with its
// epoll (EPOLL_CTL_MOD) every time a wait starts, which is one syscall for every request read.
// Here each socket is registered once, edge-triggered; Asio waits on the set's one descriptor,
// and one pass over the set (epoll_wait, then the re-armed wait) serves every connection that
// became readable meanwhile. Lives on the server's I/O thread only.
#ifndef FENCELOCK_LOCK_SERVER_READINESS_H_
#define FENCELOCK_LOCK_SERVER_READINESS_H_

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "net/asio.h"

namespace fencelock::server {

// A one-shot wake-up a coroutine can await, fired from the same thread with no syscall.
class Waker {
 public:
  // Completes once Fire() is called (at once if it was fired since the last wait). A Waker
  // must not be destroyed while a coroutine waits on it: its owner Fire()s it when closing.
  asio::awaitable<void> Wait();
  void Fire();

 private:
  struct Pending {
    virtual ~Pending() = default;
    virtual void Complete() = 0;
  };
  template <typename Handler>
  struct PendingHandler;
  std::unique_ptr<Pending> pending_;
  bool fired_ = false;
};

class ReadinessSet {
 public:
  // Told when its socket may have bytes to read.
  class Watcher {
   public:
    virtual ~Watcher() = default;
    // The socket became readable (or hung up) since it was last read dry.
    virtual void Readable() = 0;
  };

  // kResourceExhausted when the set's descriptor cannot be made; then every connection reads
  // the old way (a readiness wait per read).
  static absl::StatusOr<std::unique_ptr<ReadinessSet>> Create(asio::io_context& io);
  ~ReadinessSet();

  // Watches `fd` for `watcher` until Remove(fd). Error: the kernel's (ENOMEM, ENOSPC for
  // max_user_watches); the caller then reads the old way.
  absl::Status Add(int fd, Watcher* watcher);
  // Stops watching `fd`; an event already taken for it is dropped. Before `fd` is closed.
  void Remove(int fd);
  // The set's own descriptor failed: it watches nothing any more, and has told every watcher
  // once (Readable()), so that each goes back to a readiness wait of its own.
  bool failed() const;

 private:
  explicit ReadinessSet(asio::io_context& io, int epoll_fd);
  struct State;
  static asio::awaitable<void> Loop(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_READINESS_H_
