#include "asio_connection.h"

#include <chrono>
#include <optional>

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

AsioConnection::AsioConnection(ServerCore* core, Socket socket, const ConnectionBudget& budget,
                               std::function<void(AsioConnection*, CloseReason)> on_gone)
    : core_(core),
      socket_(std::move(socket)),
      linger_(socket_.get_executor()),
      resume_(socket_.get_executor()),
      budget_(budget),
      on_gone_(std::move(on_gone)) {}

void AsioConnection::Serve(std::string identity) {
  id_ = core_->Connect(this, std::move(identity));
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
  protocol::FrameDecoder decoder(budget_.max_frame_bytes);
  std::string chunk(64 * 1024, '\0');
  std::string payload;  // keeps its capacity from frame to frame
  boost::system::error_code ec;
  while (!closed_) {
    // Wait for readability, then read without blocking: unlike async_read_some, this makes no
    // speculative recv that would only return EAGAIN after every request.
    co_await socket_.async_wait(Socket::wait_read, asio::redirect_error(use_awaitable, ec));
    if (ec || closed_) break;
    const size_t n = socket_.read_some(asio::buffer(chunk), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
    if (ec) break;
    if (closing_ || id_ == 0) continue;  // drain and discard until the peer or the linger closes
    decoder.Feed(std::string_view(chunk.data(), n));
    // One frame at a time: each reply counts against the budget before the next request is
    // taken, and after a few frames the other connections get their turn.
    size_t served = 0;
    bool too_large = false;
    while (!closing_ && !closed_) {
      if (OverBudget() && !co_await AwaitBudget()) break;
      const auto result = decoder.Next(&payload);
      if (result == protocol::FrameDecoder::Result::kNeedMore) break;
      if (result == protocol::FrameDecoder::Result::kTooLarge) {
        too_large = true;
        break;
      }
      core_->Receive(id_, std::span<const std::string>(&payload, 1));
      if (++served % budget_.frames_per_turn == 0) {
        co_await asio::post(socket_.get_executor(), use_awaitable);
      }
    }
    if (too_large && !closing_ && !closed_) {
      core_->RejectStream(id_, wire::FRAME_TOO_LARGE,
                          absl::StrCat("frame announces ", decoder.announced_length(),
                                       " bytes; the maximum is ", decoder.max_frame_bytes()));
    }
  }
  Close();
}

bool AsioConnection::OverBudget() const {
  return outbox_.size() + in_write_ > budget_.max_unread_reply_bytes ||
         core_->HeldReplies(id_) >= budget_.max_requests_in_flight;
}

awaitable<bool> AsioConnection::AwaitBudget() {
  // While stopped here, nothing more is read: the peer's further requests wait in the socket
  // buffers, and once those are full, in the peer.
  paused_ = true;
  std::optional<std::chrono::steady_clock::time_point> unread_since;
  boost::system::error_code ec;
  while (!closed_ && OverBudget()) {
    const size_t unread = outbox_.size() + in_write_;
    // Replies waiting for their commit wait for the disk; only unread ones are the peer's doing.
    if (unread > budget_.max_unread_reply_bytes) {
      // (Far past the bound, Send() closes it at once.)
      if (!unread_since) unread_since = std::chrono::steady_clock::now();
      if (std::chrono::steady_clock::now() - *unread_since >=
          absl::ToChronoNanoseconds(budget_.slow_reader_timeout)) {
        CloseFor(CloseReason::kSlowReader);
        break;
      }
      resume_.expires_at(*unread_since + absl::ToChronoNanoseconds(budget_.slow_reader_timeout));
    } else {
      unread_since.reset();
      resume_.expires_at(std::chrono::steady_clock::time_point::max());
    }
    co_await resume_.async_wait(asio::redirect_error(use_awaitable, ec));
  }
  paused_ = false;
  co_return !closed_;
}

void AsioConnection::MaybeResume() {
  if (paused_ && !OverBudget()) resume_.cancel();
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
    if (sent == frames.size()) {
      MaybeResume();  // a held reply went out: one fewer request in flight
      return;
    }
    outbox_.append(frames.substr(sent));
  } else {
    outbox_ += frames;
  }
  if (outbox_.size() + in_write_ > 4 * budget_.max_unread_reply_bytes) {
    // Far past the bound (replies pushed to a peer that reads nothing): not from inside the
    // core's call.
    asio::post(socket_.get_executor(),
               [self = shared_from_this()] { self->CloseFor(CloseReason::kSlowReader); });
    return;
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
    in_write_ = batch.size();
    co_await asio::async_write(socket_, asio::buffer(batch),
                               asio::redirect_error(use_awaitable, ec));
    in_write_ = 0;
    if (ec) {
      Close();
      break;
    }
    MaybeResume();
  }
  writing_ = false;
  if (closing_ && !closed_) {
    // Tell the peer we are done; the read loop drains until it closes or the linger ends.
    socket_.shutdown(Socket::shutdown_send, ec);
  }
}

void AsioConnection::Close() { CloseFor(CloseReason::kPeer); }

void AsioConnection::CloseFor(CloseReason reason) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ec;
  linger_.cancel();
  resume_.cancel();
  socket_.close(ec);
  if (id_ != 0) core_->Disconnect(id_);
  if (on_gone_) on_gone_(this, reason);
}

}  // namespace fencelock::server
