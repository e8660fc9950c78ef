#include "metrics/exposer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fencelock::metrics {

namespace {

// The HTTP server's limits. Each connection sends one request and gets one response, then is
// closed: that is all a scrape needs.
constexpr size_t kMaxConnections = 64;          // open at once; the oldest goes first
constexpr int64_t kRequestTimeoutMs = 2000;     // from accept to the end of the headers
constexpr int64_t kResponseTimeoutMs = 5000;    // to send the response
constexpr size_t kMaxRequestBytes = 16 * 1024;  // request line and headers

int64_t NowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

std::string Response(int status, absl::string_view reason, absl::string_view content_type,
                     const std::string& body, bool head) {
  std::string out = absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Type: ",
                                 content_type, "\r\nContent-Length: ", body.size(),
                                 "\r\nConnection: close\r\n\r\n");
  if (!head) out += body;
  return out;
}

// One GET /metrics at a time on a thread of its own, with poll(): a connection costs a
// descriptor and a buffer, never a thread, so connections that send nothing cannot hold up a
// scrape. At most kMaxConnections are open; a new one beyond that closes the oldest that has
// not sent its request yet (a scrape sends it at once), never one being answered.
// Each has kRequestTimeoutMs to send its request and kResponseTimeoutMs to take the response.
class PollExposer final : public Exposer {
 public:
  PollExposer(int listener, int wake, int port, std::shared_ptr<Registry> registry)
      : listener_(listener), wake_(wake), port_(port), registry_(std::move(registry)),
        thread_([this] { Loop(); }) {}
  ~PollExposer() override {
    const uint64_t one = 1;
    (void)!write(wake_, &one, sizeof(one));
    thread_.join();
    for (const Conn& c : conns_) close(c.fd);
    close(listener_);
    close(wake_);
  }
  int port() const override { return port_; }

 private:
  struct Conn {
    int fd;
    int64_t deadline_ms;
    std::string in;
    std::string out;  // the response once the request is read
    size_t sent = 0;
  };

  void Loop() {
    std::vector<pollfd> fds;
    for (;;) {
      const int64_t now = NowMs();
      for (auto it = conns_.begin(); it != conns_.end();) {
        if (now >= it->deadline_ms) {
          close(it->fd);
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
      int64_t wait = -1;
      for (const Conn& c : conns_) {
        wait = wait < 0 ? c.deadline_ms - now : std::min(wait, c.deadline_ms - now);
      }
      fds.assign({{listener_, POLLIN, 0}, {wake_, POLLIN, 0}});
      for (const Conn& c : conns_) {
        fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
      }
      const int n = poll(fds.data(), fds.size(), static_cast<int>(wait));
      if (n < 0) {
        if (errno == EINTR) continue;
        return;  // only a broken descriptor set gets here; nothing would serve again
      }
      if (fds[1].revents != 0) return;
      // Connections first (their positions in fds match conns_ before any is added).
      size_t i = 2;
      for (auto it = conns_.begin(); it != conns_.end(); ++i) {
        if (fds[i].revents == 0 || Step(*it)) {
          ++it;
        } else {
          close(it->fd);
          it = conns_.erase(it);
        }
      }
      if (fds[0].revents & POLLIN) Accept();
    }
  }

  // Takes what the backlog holds (up to a round's worth), so that a scrape queued behind a
  // burst of connects is reached at once rather than after the kernel retries its SYN.
  void Accept() {
    for (int round = 0; round < 1024; ++round) {
      const int fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of descriptors: the backlog waits
      if (conns_.size() >= kMaxConnections) {
        // The oldest that has not sent its request goes; one being answered (a scrape) is
        // never cut off by a flood. If every one is being answered, the newcomer waits its turn
        // by being closed.
        auto idle = std::find_if(conns_.begin(), conns_.end(),
                                 [](const Conn& c) { return c.out.empty(); });
        if (idle == conns_.end()) {
          close(fd);
          continue;
        }
        close(idle->fd);
        conns_.erase(idle);
      }
      conns_.push_back(Conn{fd, NowMs() + kRequestTimeoutMs, {}, {}, 0});
    }
  }

  // Reads or writes what the connection is ready for; false when it is done with.
  bool Step(Conn& c) {
    if (c.out.empty()) {
      char buf[4096];
      const ssize_t got = recv(c.fd, buf, sizeof(buf), 0);
      if (got == 0) return false;
      if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.in.append(buf, static_cast<size_t>(got));
      const size_t end = c.in.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (c.in.size() <= kMaxRequestBytes) return true;
        c.out = Response(431, "Request Header Fields Too Large", "text/plain", "", false);
      } else {
        c.out = Answer(c.in.substr(0, c.in.find("\r\n")));
      }
      c.deadline_ms = NowMs() + kResponseTimeoutMs;
    }
    while (c.sent < c.out.size()) {
      const ssize_t put = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (put < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.sent += static_cast<size_t>(put);
    }
    shutdown(c.fd, SHUT_WR);
    return false;
  }

  std::string Answer(absl::string_view request_line) {
    const bool get = absl::StartsWith(request_line, "GET ");
    const bool head = absl::StartsWith(request_line, "HEAD ");
    if (!get && !head) {
      return Response(405, "Method Not Allowed", "text/plain", "GET /metrics only\n", false);
    }
    absl::string_view target = request_line.substr(get ? 4 : 5);
    target = target.substr(0, target.find(' '));
    target = target.substr(0, target.find('?'));
    if (target != "/metrics") {
      return Response(404, "Not Found", "text/plain", "not found; metrics are at /metrics\n", head);
    }
    return Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                    registry_->TextExposition(), head);
  }

  const int listener_;
  const int wake_;
  const int port_;
  const std::shared_ptr<Registry> registry_;
  std::deque<Conn> conns_;  // the loop thread's, oldest first
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Exposer>> Exposer::Start(const std::string& host, int port,
                                                        std::shared_ptr<Registry> registry) {
  in_addr parsed{};
  if (inet_pton(AF_INET, host.c_str(), &parsed) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot serve metrics on \"", host, "\": the metrics endpoint needs an IPv4 address"));
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is not 0 to 65535"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics: socket: ", strerror(errno)));
  }
  const int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr = parsed;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1024) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", host, ":", port, ": ", strerror(err)));
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot serve metrics: eventfd: ", strerror(err)));
  }
  return std::unique_ptr<Exposer>(
      std::make_unique<PollExposer>(fd, wake, ntohs(addr.sin_port), std::move(registry)));
}

}  // namespace fencelock::metrics
