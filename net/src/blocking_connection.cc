#include "net/blocking_connection.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "clock/clock.h"
#include "protocol/address.h"
#include "protocol/session.h"
#include "protocol/version.h"

namespace fencelock::net {
namespace {

// Waits for `events` on `fd` until `deadline` (boot-time clock). OK when ready;
// kDeadlineExceeded when the deadline passed first.
absl::Status WaitFor(int fd, short events, MonoTime deadline, const std::string& what) {
  for (;;) {
    const absl::Duration left = deadline - Clock::Real()->Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": no answer within the timeout"));
    }
    pollfd p{fd, events, 0};
    // Round up, so that a wait never ends just before its deadline and spins.
    const int ms = static_cast<int>(std::min<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1 << 30));
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(what, ": poll: ", std::strerror(errno)));
    }
  }
}

// Connects a non-blocking socket of `family` to `addr`, waiting until `deadline`.
absl::StatusOr<int> ConnectSocket(int family, const sockaddr* addr, socklen_t len,
                                  MonoTime deadline, const std::string& server) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  if (::connect(fd, addr, len) != 0 && errno != EINPROGRESS) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to lockd at ", server, ": ", std::strerror(err)));
  }
  if (absl::Status s = WaitFor(fd, POLLOUT, deadline, absl::StrCat("connecting to ", server));
      !s.ok()) {
    ::close(fd);
    return s;
  }
  int err = 0;
  socklen_t err_len = sizeof(err);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
  if (err != 0) {
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to lockd at ", server, ": ", std::strerror(err)));
  }
  if (family != AF_UNIX) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

absl::StatusOr<int> Dial(const std::string& server, MonoTime deadline) {
  auto parsed = protocol::ParseAddress(server);
  if (!parsed.ok()) return parsed.status();
  if (parsed->unix_socket()) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, parsed->path.data(), parsed->path.size());
    return ConnectSocket(AF_UNIX, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr),
                         deadline, server);
  }
  const std::string& host = parsed->host;
  const std::string port = std::to_string(parsed->port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad lockd address \"", server, "\": ", ::gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", server));
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    auto fd = ConnectSocket(a->ai_family, a->ai_addr, a->ai_addrlen, deadline, server);
    if (fd.ok()) {
      ::freeaddrinfo(found);
      return fd;
    }
    last = fd.status();
  }
  ::freeaddrinfo(found);
  return last;
}

// After an OpenSSL call on `ssl` returned `ret`: waits for what it wants (readable or writable)
// and returns OK to retry, or the error, with OpenSSL's reason.
absl::Status AfterTlsCall(ssl_st* ssl, int ret, int fd, MonoTime deadline,
                          const std::string& what) {
  switch (SSL_get_error(ssl, ret)) {
    case SSL_ERROR_WANT_READ:
      return WaitFor(fd, POLLIN, deadline, what);
    case SSL_ERROR_WANT_WRITE:
      return WaitFor(fd, POLLOUT, deadline, what);
    case SSL_ERROR_ZERO_RETURN:
      return absl::UnavailableError(absl::StrCat(what, ": lockd closed the connection"));
    case SSL_ERROR_SYSCALL:
      if (errno == EINTR) return absl::OkStatus();
      return absl::UnavailableError(absl::StrCat(
          what, ": ", net::TakeTlsErrors(errno != 0 ? std::strerror(errno)
                                                    : "lockd closed the connection")));
    default: {
      std::string reason = net::TakeTlsErrors("TLS error");
      const long verify = SSL_get_verify_result(ssl);
      if (verify != X509_V_OK) {
        absl::StrAppend(&reason, " (lockd's certificate: ",
                        X509_verify_cert_error_string(verify), ")");
      }
      return absl::UnavailableError(absl::StrCat(what, ": ", reason));
    }
  }
}

}  // namespace

BlockingConnection::BlockingConnection(int fd, const BlockingConnectionOptions& options)
    : fd_(fd),
      options_(options),
      decoder_(options.max_frame_bytes),
      next_id_(options.first_request_id - 1) {}

BlockingConnection::~BlockingConnection() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  ::close(fd_);
}

absl::Status BlockingConnection::StartTls() {
  ssl_ = SSL_new(options_.tls->native());
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) {
    return absl::InternalError(absl::StrCat("cannot start TLS: ", net::TakeTlsErrors("?")));
  }
  const std::string name = options_.tls_server_name.empty()
                               ? net::ServerNameOf(options_.server)
                               : options_.tls_server_name;
  if (absl::Status s = net::ExpectServerName(ssl_, name); !s.ok()) return s;
  const MonoTime deadline = Clock::Real()->Now() + options_.timeout;
  const std::string what = absl::StrCat("TLS handshake with lockd at ", options_.server);
  for (;;) {
    const int ret = SSL_connect(ssl_);
    if (ret == 1) return absl::OkStatus();
    if (absl::Status s = AfterTlsCall(ssl_, ret, fd_, deadline, what); !s.ok()) return s;
  }
}

absl::StatusOr<std::unique_ptr<BlockingConnection>> BlockingConnection::Connect(
    const BlockingConnectionOptions& options) {
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the timeout must be positive");
  }
  auto fd = Dial(options.server, Clock::Real()->Now() + options.timeout);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<BlockingConnection> conn(new BlockingConnection(*fd, options));
  if (options.tls) {
    if (options.server.rfind("unix:", 0) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("TLS was asked for ", options.server,
                       ", a Unix socket: lockd knows its peers there by uid and serves no TLS"));
    }
    if (absl::Status s = conn->StartTls(); !s.ok()) return s;
  }
  if (!options.hello) return conn;
  auto reply = conn->Call(protocol::HelloRequest(options.client_name));
  if (!reply.ok()) return reply.status();
  std::string leader;
  auto version = protocol::ReadHelloReply(*reply, options.server, &leader);
  if (!version.ok()) {
    absl::Status refused = version.status();
    // A standby replica: the caller may follow it (kStandbyLeaderPayload holds the address).
    if (reply->code() == wire::NOT_LEADER) {
      refused.SetPayload(kStandbyLeaderPayload, absl::Cord(leader));
    }
    return refused;
  }
  return conn;
}

absl::Status BlockingConnection::SendBytes(std::string_view bytes) {
  const MonoTime deadline = Clock::Real()->Now() + options_.timeout;
  while (!bytes.empty()) {
    if (ssl_ != nullptr) {
      size_t written = 0;
      const int ret = SSL_write_ex(ssl_, bytes.data(), bytes.size(), &written);
      if (ret == 1) {
        bytes.remove_prefix(written);
        continue;
      }
      if (absl::Status s = AfterTlsCall(ssl_, ret, fd_, deadline, "writing a request to lockd");
          !s.ok()) {
        return s;
      }
      continue;
    }
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // lockd is not reading: wait for room, but no longer than the timeout.
      if (absl::Status s = WaitFor(fd_, POLLOUT, deadline, "writing a request to lockd");
          !s.ok()) {
        return s;
      }
      continue;
    }
    return absl::UnavailableError(absl::StrCat("writing to lockd: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> BlockingConnection::Send(wire::Request request) {
  std::vector<wire::Request> one;
  one.push_back(std::move(request));
  auto ids = SendAll(std::move(one));
  if (!ids.ok()) return ids.status();
  return ids->front();
}

absl::StatusOr<std::vector<uint64_t>> BlockingConnection::SendAll(
    std::vector<wire::Request> requests) {
  std::vector<uint64_t> ids;
  std::string frames;
  for (wire::Request& request : requests) {
    request.set_request_id(++next_id_);
    ids.push_back(next_id_);
    if (absl::Status s = protocol::AppendFrame(request.SerializeAsString(), &frames); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = SendBytes(frames); !s.ok()) return s;
  return ids;
}

absl::StatusOr<wire::Response> BlockingConnection::Receive(absl::Duration timeout) {
  const MonoTime deadline = Clock::Real()->Now() + timeout;
  std::string payload;
  char buf[65536];
  for (;;) {
    switch (decoder_.Next(&payload)) {
      case protocol::FrameDecoder::Result::kFrame: {
        wire::Response response;
        if (!response.ParseFromString(payload)) {
          return absl::UnavailableError("a reply from lockd does not parse");
        }
        return response;
      }
      case protocol::FrameDecoder::Result::kTooLarge:
        return absl::UnavailableError(absl::StrCat("lockd sent a frame of ",
                                                   decoder_.announced_length(),
                                                   " bytes, more than the ",
                                                   decoder_.max_frame_bytes(), " accepted"));
      case protocol::FrameDecoder::Result::kNeedMore:
        break;
    }
    if (ssl_ != nullptr) {
      // TLS may hold decrypted bytes already: read first, wait only when it asks to.
      size_t got = 0;
      const int ret = SSL_read_ex(ssl_, buf, sizeof(buf), &got);
      if (ret == 1) {
        decoder_.Feed(std::string_view(buf, got));
        continue;
      }
      if (absl::Status s = AfterTlsCall(ssl_, ret, fd_, deadline, "waiting for lockd's reply");
          !s.ok()) {
        return s;
      }
      continue;
    }
    if (absl::Status s = WaitFor(fd_, POLLIN, deadline, "waiting for lockd's reply"); !s.ok()) {
      return s;
    }
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n == 0) return absl::UnavailableError("lockd closed the connection");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(absl::StrCat("reading from lockd: ", std::strerror(errno)));
    }
    decoder_.Feed(std::string_view(buf, static_cast<size_t>(n)));
  }
}

absl::StatusOr<wire::Response> BlockingConnection::Call(wire::Request request) {
  auto id = Send(std::move(request));
  if (!id.ok()) return id.status();
  const MonoTime deadline = Clock::Real()->Now() + options_.timeout;
  for (;;) {
    auto reply = Receive(std::max(deadline - Clock::Real()->Now(), absl::ZeroDuration()));
    if (!reply.ok()) return reply.status();
    // An error with id 0 is about the connection (refused at admission, a frame lockd could
    // not parse): it answers every request.
    if (reply->request_id() == *id || (reply->request_id() == 0 && reply->code() != wire::OK)) {
      return reply;
    }
  }
}

}  // namespace fencelock::net
