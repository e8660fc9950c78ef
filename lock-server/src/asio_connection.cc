#include "asio_connection.h"

#include "absl/strings/str_cat.h"
#include "fencelock/wire.pb.h"
#include "protocol/frame.h"

namespace fencelock::server {
namespace {

using asio::awaitable;
using asio::use_awaitable;

// How long a connection that was told of a protocol error may keep sending before it is cut.
constexpr auto kErrorLinger = std::chrono::seconds(1);

}  // namespace

AsioConnection::AsioConnection(ServerCore* core, Socket socket, size_t max_frame_bytes,
                               std::function<void(AsioConnection*)> on_gone)
    : core_(core),
      socket_(std::move(socket)),
      linger_(socket_.get_executor()),
      max_frame_bytes_(max_frame_bytes),
      on_gone_(std::move(on_gone)) {}

void AsioConnection::Serve() {
  id_ = core_->Connect(this);
  asio::co_spawn(socket_.get_executor(), ReadLoop(shared_from_this()), asio::detached);
}

void AsioConnection::Refuse(const std::string& error_frame) {
  // Read (and discard) until the peer closes or the linger ends, so that the error is not
  // lost to a reset.
  asio::co_spawn(socket_.get_executor(), ReadLoop(shared_from_this()), asio::detached);
  Send(error_frame);
  CloseAfterSend();
}

awaitable<void> AsioConnection::ReadLoop(std::shared_ptr<AsioConnection> self) {
  protocol::FrameDecoder decoder(max_frame_bytes_);
  std::string chunk(64 * 1024, '\0');
  boost::system::error_code ec;
  for (;;) {
    // Wait for readability, then read without blocking: unlike async_read_some, this makes no
    // speculative recv that would only return EAGAIN after every request.
    co_await socket_.async_wait(Socket::wait_read, asio::redirect_error(use_awaitable, ec));
    if (ec) break;
    const size_t n = socket_.read_some(asio::buffer(chunk), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
    if (ec) break;
    if (closing_ || id_ == 0) continue;  // drain and discard until the peer or the linger closes
    decoder.Feed(std::string_view(chunk.data(), n));
    size_t count = 0;
    bool too_large = false;
    for (;;) {
      if (count == frames_.size()) frames_.emplace_back();
      const auto result = decoder.Next(&frames_[count]);
      if (result == protocol::FrameDecoder::Result::kNeedMore) break;
      if (result == protocol::FrameDecoder::Result::kTooLarge) {
        too_large = true;
        break;
      }
      ++count;
    }
    if (count > 0) core_->Receive(id_, std::span<const std::string>(frames_.data(), count));
    if (too_large && !closing_) {
      core_->RejectStream(id_, wire::FRAME_TOO_LARGE,
                          absl::StrCat("frame announces ", decoder.announced_length(),
                                       " bytes; the maximum is ", decoder.max_frame_bytes()));
    }
  }
  Close();
}

void AsioConnection::Send(std::string_view frames) {
  if (closed_) return;
  if (!writing_ && outbox_.empty()) {
    // Most replies fit in the socket buffer: send at once, and only hand what is left to the
    // write coroutine.
    boost::system::error_code ec;
    const size_t sent = socket_.write_some(asio::buffer(frames.data(), frames.size()), ec);
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      // Not from inside the core's call: close from the event loop.
      asio::post(socket_.get_executor(), [self = shared_from_this()] { self->Close(); });
      return;
    }
    if (sent == frames.size()) return;
    outbox_.append(frames.substr(sent));
  } else {
    outbox_ += frames;
  }
  if (!writing_) {
    writing_ = true;
    asio::co_spawn(socket_.get_executor(), WriteLoop(shared_from_this()), asio::detached);
  }
}

void AsioConnection::CloseAfterSend() {
  // A reply may still be held by the core's reply gate: the connection stays open (discarding
  // input) until the linger ends, or shuts down its side once a pending write completes.
  closing_ = true;
  linger_.expires_after(kErrorLinger);
  linger_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->Close();
  });
}

awaitable<void> AsioConnection::WriteLoop(std::shared_ptr<AsioConnection> self) {
  boost::system::error_code ec;
  while (!outbox_.empty() && !closed_) {
    std::string batch;
    batch.swap(outbox_);
    co_await asio::async_write(socket_, asio::buffer(batch),
                               asio::redirect_error(use_awaitable, ec));
    if (ec) {
      Close();
      break;
    }
  }
  writing_ = false;
  if (closing_ && !closed_) {
    // Tell the peer we are done; the read loop drains until it closes or the linger ends.
    socket_.shutdown(Socket::shutdown_send, ec);
  }
}

void AsioConnection::Close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ec;
  linger_.cancel();
  socket_.close(ec);
  if (id_ != 0) core_->Disconnect(id_);
  if (on_gone_) on_gone_(this);
}

}  // namespace fencelock::server
