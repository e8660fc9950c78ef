// One client connection on Asio: reads the byte stream, cuts it into frames for the core, and
// writes what the core sends. Lives on the server's I/O thread only.
#ifndef FENCELOCK_LOCK_SERVER_ASIO_CONNECTION_H_
#define FENCELOCK_LOCK_SERVER_ASIO_CONNECTION_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lock-server/server_core.h"
#include "readiness.h"
#include "net/asio.h"
#include "net/asio_ssl.h"

namespace fencelock::server {

using Socket = asio::generic::stream_protocol::socket;
using TlsStream = asio::ssl::stream<Socket&>;

// How much of lockd one connection may hold, so that a peer that pipelines without reading,
// or sends costly requests back to back, cannot take memory or the event loop from the others.
struct ConnectionBudget {
  // lockd's options as one connection's budget: the frame bound, the slow-reader timeout,
  // and unread replies up to 2 MiB or two frames, whichever is more.
  static ConnectionBudget For(const ConnectionOptions& options);

  size_t max_frame_bytes = 0;
  // Requests whose replies wait for their commit, and reply bytes the peer has not read yet:
  // above either, lockd stops reading from the connection until they drain (back pressure).
  size_t max_requests_in_flight = 0;
  size_t max_unread_reply_bytes = 0;
  // A connection whose unread replies stay above the bound this long is closed as a slow
  // reader; so is one whose unread replies reach four times the bound.
  absl::Duration slow_reader_timeout;
  // Frames served from one connection before the others get a turn.
  size_t frames_per_turn = 32;
};

// What the transport tells its owner about a connection it closed on its own.
enum class CloseReason { kPeer, kSlowReader };

class AsioConnection final : public ConnectionSink,
                             public ReadinessSet::Watcher,
                             public std::enable_shared_from_this<AsioConnection> {
 public:
  // `on_gone` runs once, when the connection closes, with why. With `readiness`, a plaintext
  // connection's reads wait on that set, not on the socket.
  AsioConnection(ServerCore* core, Socket socket, const ConnectionBudget& budget,
                 std::function<void(AsioConnection*, CloseReason)> on_gone,
                 std::shared_ptr<ReadinessSet> readiness = nullptr);

  // Runs the server side of a TLS handshake on the connection, within `timeout`; from then on
  // every byte goes through TLS. Then calls `done` with the peer's identity from its verified
  // certificate (net::PeerIdentity), or with why the handshake failed; the caller goes on with
  // Serve() or Refuse(), or closes. A peer that opens with anything but a TLS record gets
  // kFailedPrecondition, and the connection is left plaintext, so that Refuse() reaches it.
  using HandshakeDone = std::function<void(AsioConnection&, absl::StatusOr<std::string>)>;
  void Handshake(asio::ssl::context& context, absl::Duration timeout, HandshakeDone done);
  // Registers with the core, as a peer authenticated as `identity` (empty: none), and starts
  // reading requests.
  void Serve(std::string identity);
  // Refuses the connection at admission: sends `error_frame` and closes, without ever
  // registering with the core.
  void Refuse(const std::string& error_frame);
  // Closes at once (idempotent); tells the core the peer is gone.
  void Close();

  // ConnectionSink
  void Send(std::string_view frames) override;
  void CloseAfterSend() override;

  // ReadinessSet::Watcher
  void Readable() override { readable_.Fire(); }

 private:
  // Both coroutines take a strong reference as a parameter: a coroutine starts after co_spawn
  // returns, when the caller's reference may be gone.
  asio::awaitable<void> ReadLoop(std::shared_ptr<AsioConnection> self);
  asio::awaitable<void> WriteLoop(std::shared_ptr<AsioConnection> self);
  asio::awaitable<void> HandshakeLoop(std::shared_ptr<AsioConnection> self, absl::Duration timeout,
                                      HandshakeDone done);
  // Waits until the connection is no longer over its budget; false if it was closed (as a
  // slow reader, or by anything else) meanwhile.
  asio::awaitable<bool> AwaitBudget();
  bool OverBudget() const;
  // Plaintext: writes what the handlers that ran since the last flush queued, in one write;
  // hands what the socket does not take to WriteLoop.
  void Flush();
  // Wakes AwaitBudget() once the connection is back within its budget.
  void MaybeResume();
  void CloseFor(CloseReason reason);

  ServerCore* const core_;
  Socket socket_;
  std::unique_ptr<TlsStream> tls_;  // set by Handshake(): then all bytes go through it
  asio::steady_timer linger_;
  asio::steady_timer resume_;  // AwaitBudget() waits on it; cancelled to wake it
  const ConnectionBudget budget_;
  std::function<void(AsioConnection*, CloseReason)> on_gone_;
  const std::shared_ptr<ReadinessSet> readiness_;
  bool watched_ = false;  // in readiness_: the read loop waits on readable_
  Waker readable_;
  bool paused_ = false;
  bool handshaking_ = false;
  bool handshake_timed_out_ = false;
  ConnectionId id_ = 0;  // 0 until Serve() registers with the core
  std::string outbox_;
  size_t in_write_ = 0;  // bytes of the write in progress (taken out of outbox_)
  bool writing_ = false;
  bool flush_posted_ = false;  // plaintext: a Flush() is queued on the event loop
  bool closing_ = false;
  bool closed_ = false;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ASIO_CONNECTION_H_
