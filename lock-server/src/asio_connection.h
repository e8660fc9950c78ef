// One client connection on Asio: reads the byte stream, cuts it into frames for the core, and
// writes what the core sends. Lives on the server's I/O thread only.
#ifndef FENCELOCK_LOCK_SERVER_ASIO_CONNECTION_H_
#define FENCELOCK_LOCK_SERVER_ASIO_CONNECTION_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lock-server/server_core.h"
#include "net/asio.h"

namespace fencelock::server {

using Socket = asio::generic::stream_protocol::socket;

class AsioConnection final : public ConnectionSink,
                             public std::enable_shared_from_this<AsioConnection> {
 public:
  // `on_gone` runs once, when the connection closes.
  AsioConnection(ServerCore* core, Socket socket, size_t max_frame_bytes,
                 std::function<void(AsioConnection*)> on_gone);

  // Registers with the core and starts reading requests.
  void Serve();
  // Refuses the connection at admission: sends `error_frame` and closes, without ever
  // registering with the core.
  void Refuse(const std::string& error_frame);
  // Closes at once (idempotent); tells the core the peer is gone.
  void Close();

  // ConnectionSink
  void Send(std::string_view frames) override;
  void CloseAfterSend() override;

 private:
  // Both coroutines take a strong reference as a parameter: a coroutine starts after co_spawn
  // returns, when the caller's reference may be gone.
  asio::awaitable<void> ReadLoop(std::shared_ptr<AsioConnection> self);
  asio::awaitable<void> WriteLoop(std::shared_ptr<AsioConnection> self);

  ServerCore* const core_;
  Socket socket_;
  asio::steady_timer linger_;
  const size_t max_frame_bytes_;
  std::function<void(AsioConnection*)> on_gone_;
  ConnectionId id_ = 0;  // 0 until Serve() registers with the core
  std::vector<std::string> frames_;  // one read's frames; the strings keep their capacity
  std::string outbox_;
  bool writing_ = false;
  bool closing_ = false;
  bool closed_ = false;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ASIO_CONNECTION_H_
