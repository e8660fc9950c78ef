#include "raw_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "protocol/version.h"

namespace fencelock::testing {
namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "RawConnection: %s: %s\n", what, std::strerror(errno));
  std::abort();
}

// Waits until fd is readable or `timeout` passes; true if readable.
bool WaitReadable(int fd, absl::Duration timeout) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) > 0;
}

}  // namespace

std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[65536];
  while (WaitReadable(fd, absl::Seconds(10))) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return response;
}

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("bind");
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

RawConnection RawConnection::Tcp(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("connect");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return RawConnection(fd);
}

RawConnection RawConnection::Unix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) Die("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("connect");
  return RawConnection(fd);
}

RawConnection::~RawConnection() {
  if (fd_ >= 0) close(fd_);
}

bool RawConnection::SendBytes(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool RawConnection::SendRequest(const wire::Request& request) {
  std::string frame;
  if (!protocol::AppendFrame(request.SerializeAsString(), &frame).ok()) return false;
  return SendBytes(frame);
}

std::optional<wire::Response> RawConnection::ReadResponse(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  std::string payload;
  for (;;) {
    if (decoder_.Next(&payload) == protocol::FrameDecoder::Result::kFrame) {
      wire::Response response;
      if (!response.ParseFromString(payload)) return std::nullopt;
      return response;
    }
    const absl::Duration left = give_up - absl::Now();
    if (left <= absl::ZeroDuration() || !WaitReadable(fd_, left)) return std::nullopt;
    char buf[65536];
    ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return std::nullopt;
    decoder_.Feed(std::string_view(buf, static_cast<size_t>(n)));
  }
}

bool RawConnection::ClosedByPeer(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  for (;;) {
    const absl::Duration left = give_up - absl::Now();
    if (left <= absl::ZeroDuration() || !WaitReadable(fd_, left)) return false;
    char buf[65536];
    ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
}

wire::Response RawConnection::Call(wire::Request request) {
  const uint64_t id = ++next_id_;
  request.set_request_id(id);
  if (!SendRequest(request)) Die("send");
  for (;;) {
    auto response = ReadResponse();
    if (!response) {
      std::fprintf(stderr, "RawConnection: no reply to request %lu\n",
                   static_cast<unsigned long>(id));
      std::abort();
    }
    if (response->request_id() == id) return *response;
  }
}

wire::Response RawConnection::Hello() {
  wire::Request r;
  r.mutable_hello()->set_min_version(protocol::kMinProtocolVersion);
  r.mutable_hello()->set_max_version(protocol::kMaxProtocolVersion);
  r.mutable_hello()->set_client_name("raw-test");
  return Call(r);
}

uint64_t RawConnection::HelloAndOpenSession(absl::Duration ttl) {
  if (Hello().code() != wire::OK) {
    std::fprintf(stderr, "RawConnection: Hello refused\n");
    std::abort();
  }
  wire::Request r;
  r.mutable_open_session()->set_ttl_ms(absl::ToInt64Milliseconds(ttl));
  wire::Response reply = Call(r);
  if (reply.code() != wire::OK) {
    std::fprintf(stderr, "RawConnection: OpenSession refused: %s\n", reply.message().c_str());
    std::abort();
  }
  return reply.open_session().session_id();
}

}  // namespace fencelock::testing
