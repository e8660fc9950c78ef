// lockd --etcd-standby, before the prefix is its: lockd's listeners, bound at once and served by
// a core of their own on an event loop and thread of their own, that answer every request
// NOT_LEADER naming the serving replica (so clients move to it). Destroyed, its connections
// closed, once the prefix is ours; the serving core then binds the same TCP port.
#ifndef FENCELOCK_LOCK_SERVER_STANDBY_FRONT_H_
#define FENCELOCK_LOCK_SERVER_STANDBY_FRONT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "lock-server/server.h"
#include "net/tls.h"

namespace fencelock::server {

class StandbyFront {
 public:
  // Binds what `options` asks for (TCP, the Unix socket) and starts answering.
  static absl::StatusOr<std::unique_ptr<StandbyFront>> Start(
      const ServerOptions& options, std::shared_ptr<net::TlsContext> tls);
  // Closes the listeners and every connection, and joins the thread.
  virtual ~StandbyFront() = default;
  // The TCP port bound (the one asked for, or the one port 0 gave).
  virtual uint16_t tcp_port() const = 0;
  // The serving replica, from its P/owner value; NOT_LEADER names it from now on. Thread-safe.
  virtual void SetOwner(const std::string& owner) = 0;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_STANDBY_FRONT_H_
