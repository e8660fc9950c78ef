// lockd's listeners and admission: binds the TCP address and the optional Unix socket, accepts
// connections, checks each peer (its uid on the Unix socket, the connection limit) and hands the
// admitted ones to the core as AsioConnections. A refused peer gets one error frame and is
// closed; nobody else notices. On the server's I/O thread only.
#ifndef FENCELOCK_LOCK_SERVER_LISTENER_H_
#define FENCELOCK_LOCK_SERVER_LISTENER_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "asio_connection.h"
#include "lock-server/server.h"
#include "lock-server/server_core.h"
#include "net/asio.h"

namespace fencelock::server {

class Listener {
 public:
  Listener(asio::io_context& io, ServerCore* core, const ServerOptions& options)
      : io_(io), core_(core), options_(options), tcp_acceptor_(io), unix_acceptor_(io) {}

  // Binds and listens. kInvalidArgument for an address that may not be used, kUnavailable for
  // one that cannot be bound.
  absl::Status Bind();
  uint16_t tcp_port() const { return tcp_port_; }
  // Starts accepting.
  void Start();
  // Closes the listeners and every open connection.
  void Stop();

 private:
  template <typename Acceptor>
  asio::awaitable<void> AcceptLoop(Acceptor& acceptor);
  absl::Status BindUnixSocket();
  // OK if the Unix-socket peer on `fd` is allowed (ServerOptions::allowed_uids).
  absl::Status CheckPeer(int fd) const;

  asio::io_context& io_;
  ServerCore* const core_;
  const ServerOptions& options_;
  asio::ip::tcp::acceptor tcp_acceptor_;
  asio::local::stream_protocol::acceptor unix_acceptor_;
  uint16_t tcp_port_ = 0;
  bool stopping_ = false;
  uint64_t last_id_ = 0;
  size_t admitted_ = 0;  // open connections that count against max_connections
  std::map<uint64_t, std::weak_ptr<AsioConnection>> open_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_LISTENER_H_
