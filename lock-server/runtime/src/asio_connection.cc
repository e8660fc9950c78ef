#include "asio_connection.h"

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "fencelock/wire.pb.h"
#include "net/tls.h"
#include "protocol/frame.h"

namespace fencelock::server {
namespace {

using asio::awaitable;
using asio::use_awaitable;

// How long a connection that was told of a protocol error may keep sending before it is cut.
constexpr auto kErrorLinger = std::chrono::seconds(1);

}  // namespace

ConnectionBudget ConnectionBudget::For(const ConnectionOptions& options) {
  return ConnectionBudget{
      .max_frame_bytes = options.max_frame_bytes,
      .max_requests_in_flight = options.max_requests_in_flight,
      .max_unread_reply_bytes = std::max<size_t>(size_t{2} << 20, 2 * options.max_frame_bytes),
      .slow_reader_timeout = options.slow_reader_timeout};
}

AsioConnection::AsioConnection(ServerCore* core, Socket socket, const ConnectionBudget& budget,
                               std::function<void(AsioConnection*, CloseReason)> on_gone,
                               std::shared_ptr<ReadinessSet> readiness)
    : core_(core),
      socket_(std::move(socket)),
      linger_(socket_.get_executor()),
      resume_(socket_.get_executor()),
      budget_(budget),
      on_gone_(std::move(on_gone)),
      readiness_(std::move(readiness)) {}

void AsioConnection::Handshake(asio::ssl::context& context, absl::Duration timeout,
                               HandshakeDone done) {
  tls_ = std::make_unique<TlsStream>(socket_, context);
  asio::co_spawn(socket_.get_executor(),
                 HandshakeLoop(shared_from_this(), timeout, std::move(done)), asio::detached);
}

awaitable<void> AsioConnection::HandshakeLoop(std::shared_ptr<AsioConnection> self,
                                              absl::Duration timeout, HandshakeDone done) {
  // A peer that connects and says nothing must not hold its descriptor for longer.
  handshaking_ = true;
  linger_.expires_after(absl::ToChronoNanoseconds(timeout));
  linger_.async_wait([this, self](boost::system::error_code ec) {
    if (ec || !handshaking_) return;
    handshake_timed_out_ = true;
    socket_.cancel(ec);
  });
  boost::system::error_code ec;
  // A TLS connection opens with a handshake record (content type 22); anything else is a
  // plaintext client on the TLS port, which is told so in plaintext.
  co_await socket_.async_wait(Socket::wait_read, asio::redirect_error(use_awaitable, ec));
  unsigned char first = 0;
  if (!ec && !closed_ && !handshake_timed_out_ &&
      ::recv(socket_.native_handle(), &first, 1, MSG_PEEK) == 1 && first != 22) {
    handshaking_ = false;
    linger_.cancel();
    tls_.reset();
    done(*this, absl::FailedPreconditionError(
                    "lockd serves TLS on this port: connect with a CA, a certificate and a key "
                    "(--tls-ca, --tls-cert, --tls-key; docs/security.md)"));
    co_return;
  }
  if (!ec) {
    co_await tls_->async_handshake(asio::ssl::stream_base::server,
                                   asio::redirect_error(use_awaitable, ec));
  }
  handshaking_ = false;
  linger_.cancel();
  if (closed_) co_return;
  if (handshake_timed_out_) {
    done(*this, absl::DeadlineExceededError(absl::StrCat(
                    "no TLS handshake within ", absl::FormatDuration(timeout))));
  } else if (ec) {
    std::string why = absl::StrCat("TLS handshake failed: ", ec.message());
    const long verify = SSL_get_verify_result(tls_->native_handle());
    if (verify != X509_V_OK) {
      absl::StrAppend(&why, " (the client's certificate: ", X509_verify_cert_error_string(verify),
                      ")");
    }
    done(*this, absl::UnauthenticatedError(why));
  } else {
    done(*this, net::PeerIdentity(tls_->native_handle()));
  }
}

void AsioConnection::Serve(std::string identity) {
  id_ = core_->Connect(this, std::move(identity));
  // Registered once: no readiness wait per read. If the set cannot take it, it reads the old way.
  if (readiness_ != nullptr && !tls_ && !readiness_->failed()) {
    watched_ = readiness_->Add(socket_.native_handle(), this).ok();
  }
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
  bool maybe_more = false;  // the last read filled the chunk: the socket may hold more
  while (!closed_) {
    size_t n = 0;
    if (watched_ && readiness_->failed()) watched_ = false;
    if (watched_) {
      // Edge-triggered: a read that did not fill the chunk took all there was, and whatever
      // arrives later is a new event. So a read needs no wait of its own, and an EAGAIN is
      // rare (an event for bytes an earlier read already took).
      if (!maybe_more) co_await readable_.Wait();
      if (closed_) break;
      n = socket_.read_some(asio::buffer(chunk), ec);
      maybe_more = false;
      if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
      if (ec) break;
      maybe_more = n == chunk.size();
    } else if (tls_) {
      // TLS may hold decrypted bytes of its own: always ask it.
      n = co_await tls_->async_read_some(asio::buffer(chunk),
                                         asio::redirect_error(use_awaitable, ec));
      if (ec || closed_) break;
    } else {
      // Wait for readability, then read without blocking: unlike async_read_some, this makes
      // no speculative recv that would only return EAGAIN after every request.
      co_await socket_.async_wait(Socket::wait_read, asio::redirect_error(use_awaitable, ec));
      if (ec || closed_) break;
      n = socket_.read_some(asio::buffer(chunk), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
      if (ec) break;
    }
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
  outbox_ += frames;
  if (outbox_.size() + in_write_ > 4 * budget_.max_unread_reply_bytes) {
    // Far past the bound (replies pushed to a peer that reads nothing): not from inside the
    // core's call.
    asio::post(socket_.get_executor(),
               [self = shared_from_this()] { self->CloseFor(CloseReason::kSlowReader); });
    return;
  }
  if (tls_ != nullptr) {
    // Over TLS every write goes through the coroutine: a record cannot be left half-written.
    if (!writing_) {
      writing_ = true;
      asio::co_spawn(socket_.get_executor(), WriteLoop(shared_from_this()), asio::detached);
    }
  } else if (!writing_ && !flush_posted_) {
    // The replies of one pass of the event loop (the requests of one read, the grants one
    // commit released) leave together, in one write once the pass ends: on a connection that
    // many sessions share, a send a reply cost lockd most of its time, and on loopback each
    // send also runs the peer's receive path.
    flush_posted_ = true;
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->Flush(); });
  }
  // A held reply left the core's gate, so one fewer request is in flight, whether or not the
  // socket had room for it: reading may go on if only the held replies stopped it. (Waiting
  // for the write instead deadlocked a peer that reads nothing until it has sent everything.)
  MaybeResume();
}

void AsioConnection::Flush() {
  flush_posted_ = false;
  if (closed_ || writing_ || outbox_.empty()) return;
  // Most batches fit in the socket buffer: write at once, and only hand what is left to the
  // write coroutine.
  boost::system::error_code ec;
  const size_t sent = socket_.write_some(asio::buffer(outbox_), ec);
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
    Close();
    return;
  }
  outbox_.erase(0, sent);
  if (!outbox_.empty()) {
    writing_ = true;
    asio::co_spawn(socket_.get_executor(), WriteLoop(shared_from_this()), asio::detached);
  }
  MaybeResume();
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
    if (tls_) {
      co_await asio::async_write(*tls_, asio::buffer(batch),
                                 asio::redirect_error(use_awaitable, ec));
    } else {
      co_await asio::async_write(socket_, asio::buffer(batch),
                                 asio::redirect_error(use_awaitable, ec));
    }
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
  boost::system::error_code ec;
  // Replies queued for the flush still go out if the socket takes them (lockd stopping).
  if (tls_ == nullptr && !writing_ && !outbox_.empty() && socket_.is_open()) {
    (void)socket_.write_some(asio::buffer(outbox_), ec);
  }
  closed_ = true;
  linger_.cancel();
  resume_.cancel();
  if (watched_) readiness_->Remove(socket_.native_handle());
  readable_.Fire();  // the read loop sees closed_ and ends
  socket_.close(ec);
  if (id_ != 0) core_->Disconnect(id_);
  if (on_gone_) on_gone_(this, reason);
}

}  // namespace fencelock::server
