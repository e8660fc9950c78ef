// A blocking connection to lockd that speaks the wire protocol: for tools (lockctl) and tests
// that send well-formed requests one at a time. Every wait is bounded: connecting, saying Hello,
// writing a request and waiting for its reply each give up after the configured timeout, so a
// frozen or silent lockd costs a caller at most that long. Timeouts are measured on the
// boot-time clock and waited for with poll(), so a wall-clock step does not move them.
//
// Not thread-safe: one thread uses a connection at a time. Owns its socket.
#ifndef FENCELOCK_NET_BLOCKING_CONNECTION_H_
#define FENCELOCK_NET_BLOCKING_CONNECTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fencelock/wire.pb.h"
#include "net/tls.h"
#include "protocol/frame.h"

namespace fencelock::net {

struct BlockingConnectionOptions {
  // lockd's address: "host:port" (a name, an IPv4 address, or [IPv6]) or "unix:/path".
  // Default: "127.0.0.1:7420".
  std::string server = "127.0.0.1:7420";
  // The longest any one step may take: connecting, Hello, one request's reply. Default: 5 s.
  absl::Duration timeout = absl::Seconds(5);
  // Sent in Hello, for lockd's logs. Default: "fencelock".
  std::string client_name = "fencelock";
  // Send Hello as part of Connect(). Tests that must speak first without it turn it off.
  // Default: true.
  bool hello = true;
  // Largest reply frame accepted. Default: 64 MiB.
  size_t max_frame_bytes = size_t{64} << 20;
  // The request id of the first request; later ones count up from it. Default: 1.
  uint64_t first_request_id = 1;
  // TLS for a TCP address: a client context (net::TlsContext, TlsRole::kClient), and the name
  // lockd's certificate must carry (empty: the host of `server`). Default: none, plaintext.
  std::shared_ptr<net::TlsContext> tls;
  std::string tls_server_name;
};

// The payload of Connect()'s kUnavailable from a standby replica (NOT_LEADER): the serving
// replica's address as the standby knows it (may be empty).
inline constexpr char kStandbyLeaderPayload[] = "fencelock.dev/standby-leader";

class BlockingConnection {
 public:
  // Connects and (unless options.hello is false) negotiates the protocol version. Errors:
  // kInvalidArgument for an address that cannot be parsed (or a Unix path too long for a
  // socket), kUnavailable when nothing answers or the connection fails, or when a standby
  // replica answers the Hello (with kStandbyLeaderPayload), kDeadlineExceeded when a step took
  // longer than the timeout, kFailedPrecondition when lockd refuses the Hello. Over TLS, a
  // failed handshake or a certificate lockd refuses is kUnavailable, with OpenSSL's reason.
  static absl::StatusOr<std::unique_ptr<BlockingConnection>> Connect(
      const BlockingConnectionOptions& options);
  ~BlockingConnection();
  BlockingConnection(const BlockingConnection&) = delete;
  BlockingConnection& operator=(const BlockingConnection&) = delete;

  // Sends `request` with the next request id and returns the reply carrying that id (pushes
  // for other ids are skipped), or an error about the whole connection (request id 0). kDeadlineExceeded if it does not arrive within the timeout,
  // kUnavailable if the connection breaks or the reply does not parse.
  absl::StatusOr<wire::Response> Call(wire::Request request);
  // Sends `request` with the next request id, which it returns, without waiting for a reply.
  absl::StatusOr<uint64_t> Send(wire::Request request);
  // Sends the requests in one write, with the next request ids, which it returns in order.
  absl::StatusOr<std::vector<uint64_t>> SendAll(std::vector<wire::Request> requests);
  // The next reply to arrive, whatever its id; waits at most `timeout`.
  absl::StatusOr<wire::Response> Receive(absl::Duration timeout);

  // Writes `bytes` as they are (through TLS when on), for tests that send malformed frames;
  // waits at most the timeout for room.
  absl::Status SendBytes(std::string_view bytes);

  // The socket, for tests that watch it (plaintext only).
  int fd() const { return fd_; }

 private:
  BlockingConnection(int fd, const BlockingConnectionOptions& options);
  absl::Status StartTls();

  int fd_;
  ssl_st* ssl_ = nullptr;  // the TLS session over fd_, when options_.tls is set
  BlockingConnectionOptions options_;
  protocol::FrameDecoder decoder_;
  uint64_t next_id_ = 0;
};

}  // namespace fencelock::net

#endif  // FENCELOCK_NET_BLOCKING_CONNECTION_H_
