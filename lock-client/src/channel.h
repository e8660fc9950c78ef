// One connection from the client to lockd: framing, request ids, and t_send.
//
// Call() writes a request and waits for the reply with the same request id. The time the
// client measures leases from, Reply::sent_at, is read from the injected clock by whichever
// thread writes, immediately before the bytes are handed to the socket (ADR-006 D2): never at the
// reply. Replies nobody waits for any more (their caller timed out) go to the unmatched-reply
// handler, so the client can give back a grant that arrived too late.
//
// Over a plain socket (TCP or unix), a caller writes its request itself and, while it waits,
// reads the socket itself: a blocking call costs no hand-over between threads. The channel's
// I/O thread reads only the replies no caller is reading for (SendAsync's and Post's, those of
// calls given up, and a caller's that waits behind another reader), and a plain socket is in
// its epoll set only while it waits on it, so that a reply a caller reads does not wake it too.
// Over TLS the I/O thread
// does all reading and writing.
//
// Thread-safe: every method may be used from any thread.
#ifndef FENCELOCK_LOCK_CLIENT_CHANNEL_H_
#define FENCELOCK_LOCK_CLIENT_CHANNEL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clock/clock.h"
#include "fencelock/wire.pb.h"
#include "net/tls.h"

namespace fencelock::client_internal {

struct PendingCall;  // a request sent and not yet awaited

struct Reply {
  wire::Response response;
  MonoTime sent_at;  // read just before the request was written
};

class Channel {
 public:
  // `clock` must outlive the channel. With `tls`, TCP connections run a TLS handshake after
  // connecting, presenting the client's certificate and checking that the server's names
  // `tls_server_name` (empty: the host of the address Connect() is given).
  static std::unique_ptr<Channel> Create(Clock* clock,
                                         std::shared_ptr<net::TlsContext> tls = nullptr,
                                         std::string tls_server_name = "");
  virtual ~Channel() = default;

  // (Re)connects to `address` ("host:port" or "unix:/path", or a comma-separated list of lockd
  // replicas, tried from the one that answered last, each with its share of `timeout`) and
  // exchanges Hello. Closes any
  // previous connection first; its pending calls fail with kUnavailable. Blocks up to
  // `timeout`. Errors: kInvalidArgument (bad address), kUnavailable (cannot connect or no
  // Hello reply, or the TLS handshake failed: the message says why), kFailedPrecondition (no
  // common protocol version; the message names both).
  virtual absl::Status Connect(const std::string& address, const std::string& client_name,
                               absl::Duration timeout) = 0;

  // Whether the connection is up. Nobody reads an idle connection, so this looks (without
  // blocking) whether lockd closed it since.
  virtual bool connected() = 0;

  // Sends `request` (the channel sets its request_id) and blocks until its reply arrives, the
  // connection fails (kUnavailable), or `timeout` passes (kDeadlineExceeded). A reply is
  // returned whatever its code; callers interpret the code.
  virtual absl::StatusOr<Reply> Call(wire::Request request, absl::Duration timeout) = 0;

  // Call() in two halves. Send() hands the request to the connection and returns at once: a
  // request sent later by any thread is written after it. Await() then waits for its reply as
  // Call() does; call it exactly once per sent request.
  virtual absl::StatusOr<std::shared_ptr<PendingCall>> Send(wire::Request request) = 0;
  virtual absl::StatusOr<Reply> Await(const std::shared_ptr<PendingCall>& call,
                                      absl::Duration timeout) = 0;

  // Call() without blocking: hands `request` to the connection and returns its request id;
  // `on_done` gets the reply (whatever its code), kUnavailable when the connection fails, or
  // kDeadlineExceeded once `timeout` passes, exactly once, on the I/O thread (it must not
  // block), never from within SendAsync. If SendAsync returns an error, `on_done` is not called.
  virtual absl::StatusOr<uint64_t> SendAsync(
      wire::Request request, absl::Duration timeout,
      std::function<void(absl::StatusOr<Reply>)> on_done) = 0;

  // The protocol version negotiated by the last successful Connect() (0 before).
  virtual uint32_t version() const = 0;

  // Sends `request` without waiting; its reply goes to the unmatched-reply handler when it is
  // read, with the next reply anyone reads (nothing reads for it alone).
  // Returns the request id. kUnavailable when not connected (nothing is sent). An id means
  // handed to the connection, not delivered: a connection that breaks at once may still lose it.
  virtual absl::StatusOr<uint64_t> Post(wire::Request request) = 0;
  // Post() that writes nothing yet: the request goes out in one write with the next request
  // sent (so that lockd reads, and commits, the two together). Until then it is in no
  // socket; it is lost if the connection closes first.
  virtual absl::StatusOr<uint64_t> PostWithNext(wire::Request request) = 0;

  // Called for replies no caller waits for, on whichever thread read them (a caller's, or the
  // I/O thread), with none of the channel's locks held. Must not block. Set before Connect().
  virtual void set_unmatched_reply_handler(
      std::function<void(const wire::Response&)> handler) = 0;

  // Closes the connection; pending calls fail with kUnavailable.
  virtual void Close() = 0;

  // With a list of replicas: closes the connection because its lockd stayed silent for
  // `silence` (frozen, or held up), so that pending calls fail with kUnavailable; until a
  // replica answers again, Connect() tries that one last and gives it no more than `silence`
  // to answer its Hello. With one address, the same as Close().
  virtual void Abandon(absl::Duration silence) = 0;
};

}  // namespace fencelock::client_internal

#endif  // FENCELOCK_LOCK_CLIENT_CHANNEL_H_
