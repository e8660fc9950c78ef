// lockd's listeners and admission: binds the TCP address and the optional Unix socket, accepts
// connections, checks each peer (its uid on the Unix socket, the connection limit) and hands the
// admitted ones to the core as AsioConnections. A refused peer gets one error frame and is
// closed; nobody else notices. On the server's I/O thread only.
#ifndef FENCELOCK_LOCK_SERVER_LISTENER_H_
#define FENCELOCK_LOCK_SERVER_LISTENER_H_

#include <sys/socket.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "asio_connection.h"
#include "clock/time_source.h"
#include "log_limiter.h"
#include "readiness.h"
#include "lock-server/server.h"
#include "lock-server/server_core.h"
#include "net/asio.h"
#include "net/asio_ssl.h"
#include "net/tls.h"

namespace fencelock::server {

class Listener {
 public:
  // `time` is the server's time source (for the log limiter); both outlive the listener. With
  // `tls`, every TCP connection is TLS (ServerOptions::tls).
  Listener(asio::io_context& io, ServerCore* core, TimeSource* time, const ServerOptions& options,
           std::shared_ptr<net::TlsContext> tls);
  ~Listener();

  // Binds and listens. kInvalidArgument for an address that may not be used, kUnavailable for
  // one that cannot be bound.
  absl::Status Bind();
  uint16_t tcp_port() const { return tcp_port_; }
  // Starts accepting.
  void Start();
  // Closes the listeners; open connections stay until Stop().
  void StopAccepting();
  // Closes the listeners and every open connection.
  void Stop();
  // Certificate rotation (lockd's SIGHUP): TLS connections accepted from now on handshake with
  // `tls`; those already open keep the context they were made with. Nothing on a plaintext
  // listener. On the io thread.
  void SetTls(std::shared_ptr<net::TlsContext> tls);

 private:
  template <typename Acceptor>
  asio::awaitable<void> AcceptLoop(Acceptor& acceptor);
  absl::Status BindUnixSocket();
  // The Unix-socket peer's credentials (SO_PEERCRED), if they can be read.
  static std::optional<ucred> PeerCredentials(int fd);
  // Who a TCP peer is, for the per-peer budget: for a loopback peer the user id that owns its
  // socket, asked of the kernel (peer_uid.h); otherwise, or if the kernel cannot tell, its
  // address.
  static std::string TcpPeerIdentity(const asio::ip::tcp::endpoint& local,
                                     const asio::ip::tcp::endpoint& peer);
  // OK if the Unix-socket `peer` is allowed (ServerOptions::allowed_uids).
  absl::Status CheckAllowed(const std::optional<ucred>& peer) const;
  // OK if one more connection of `peer` fits max_connections and max_connections_per_peer.
  absl::Status CheckConnectionLimits(const std::string& peer) const;
  // Counts, logs and tells the refused `connection` why.
  void Refuse(AsioConnection& connection, uint64_t id, const absl::Status& why);
  // accept() failed for want of descriptors or memory: refuses the peers waiting in the
  // backlog with an error (through the spare descriptor) so that they do not hang.
  void RefuseBacklog(int listen_fd);
  void Log(const std::string& kind, const std::string& line) { log_.Log(kind, line); }

  asio::io_context& io_;
  ServerCore* const core_;
  const ServerOptions& options_;
  const ConnectionBudget budget_;
  LogLimiter log_;
  std::shared_ptr<net::TlsContext> tls_;
  std::optional<asio::ssl::context> tls_context_;  // Asio's view of tls_
  asio::ip::tcp::acceptor tcp_acceptor_;
  asio::local::stream_protocol::acceptor unix_acceptor_;
  uint16_t tcp_port_ = 0;
  bool stopping_ = false;
  uint64_t last_id_ = 0;
  size_t admitted_ = 0;  // open connections that count against max_connections
  size_t refusing_ = 0;  // refused connections still being told why (at most the share)
  std::map<std::string, size_t> per_peer_;  // admitted connections by PeerIdentity()
  std::map<uint64_t, std::weak_ptr<AsioConnection>> open_;
  int spare_fd_ = -1;  // held open to be given up when accept() runs out of descriptors
  // Plaintext connections wait for their reads here (each holds it too); null if it could not
  // be made (then each waits on its own socket).
  std::shared_ptr<ReadinessSet> readiness_;
};

// Descriptors lockd needs besides its connections: listeners, the log's files, the event
// loop's own, the metrics endpoint's, the spare one.
inline constexpr uint64_t kReservedDescriptors = 64;
// Refused connections being told why at once (an error frame, after a TLS handshake over TLS,
// and a linger of up to a second each). Past that, a refused connection is closed at once.
inline constexpr uint64_t kMaxRefusingConnections = 64;

// Makes sure the process may open what `max_connections` needs: raises the soft limit on open
// files up to the hard one if it must. kInvalidArgument, naming the limit and the flag, if
// even the hard limit is too low. `raised` gets a line for the log when the limit was raised.
absl::Status EnsureDescriptorBudget(uint64_t max_connections, std::string* raised);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_LISTENER_H_
