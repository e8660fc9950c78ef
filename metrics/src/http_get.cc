#include "metrics/http_get.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fencelock::metrics {
namespace {

using SteadyClock = std::chrono::steady_clock;

// A connected socket, closed when it goes out of scope.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits for `events` on `fd` until `deadline`; false at the deadline.
bool WaitFor(int fd, short events, SteadyClock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;  // let the read or write report it
  }
}

absl::StatusOr<int> Connect(const std::string& host, int port, SteadyClock::time_point deadline,
                            const std::string& where) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", where, ": ", gai_strerror(e)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last_error = strerror(errno);
      continue;
    }
    int r = connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      if (!WaitFor(fd, POLLOUT, deadline)) {
        close(fd);
        freeaddrinfo(found);
        return absl::DeadlineExceededError(absl::StrCat("connecting to ", where, " timed out"));
      }
      int error = 0;
      socklen_t len = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
      errno = error;
      r = error == 0 ? 0 : -1;
    }
    if (r == 0) {
      freeaddrinfo(found);
      return fd;
    }
    last_error = strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("cannot connect to ", where, ": ", last_error));
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     absl::Duration timeout) {
  const std::string where = absl::StrCat("http://", host, ":", port, path);
  if (port <= 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("bad port in ", where));
  const auto deadline = SteadyClock::now() + absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration()));
  auto fd = Connect(host, port, deadline, where);
  if (!fd.ok()) return fd.status();
  Socket socket(*fd);
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host, "\r\nConnection: close\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    if (!WaitFor(socket.fd(), POLLOUT, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("sending to ", where, " timed out"));
    }
    const ssize_t n = send(socket.fd(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("sending to ", where, ": ", strerror(errno)));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  // HTTP/1.0 with Connection: close: the reply ends where the server closes, or at its
  // Content-Length.
  std::string reply;
  size_t header_end = std::string::npos;
  std::optional<size_t> content_length;
  char buf[65536];
  for (;;) {
    if (header_end != std::string::npos && content_length.has_value() &&
        reply.size() >= header_end + 4 + *content_length) {
      break;
    }
    if (!WaitFor(socket.fd(), POLLIN, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("no complete reply from ", where, " within ",
                                                      absl::FormatDuration(timeout)));
    }
    const ssize_t n = recv(socket.fd(), buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("reading from ", where, ": ", strerror(errno)));
    if (n == 0) break;
    reply.append(buf, static_cast<size_t>(n));
    if (header_end == std::string::npos && (header_end = reply.find("\r\n\r\n")) != std::string::npos) {
      for (absl::string_view line : absl::StrSplit(absl::string_view(reply).substr(0, header_end), "\r\n")) {
        const size_t colon = line.find(':');
        if (colon == absl::string_view::npos) continue;
        if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(line.substr(0, colon)), "content-length")) {
          size_t length = 0;
          if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(colon + 1)), &length)) {
            return absl::DataLossError(absl::StrCat(where, ": bad Content-Length: ", line));
          }
          content_length = length;
        }
      }
    }
  }
  if (reply.empty()) return absl::UnavailableError(absl::StrCat(where, " closed without a reply"));
  // "HTTP/1.1 200 OK"
  absl::string_view status_line = absl::string_view(reply).substr(0, reply.find("\r\n"));
  std::vector<absl::string_view> parts = absl::StrSplit(status_line, absl::MaxSplits(' ', 2));
  HttpResponse response;
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/1.") ||
      !absl::SimpleAtoi(parts[1], &response.status) || response.status < 100 ||
      response.status > 599) {
    return absl::DataLossError(absl::StrCat(where, " did not answer HTTP: \"",
                                            absl::CHexEscape(status_line.substr(0, 80)), "\""));
  }
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat(where, ": the reply ends inside its headers"));
  }
  response.body = reply.substr(header_end + 4);
  if (content_length.has_value()) {
    if (response.body.size() < *content_length) {
      return absl::DataLossError(absl::StrCat(where, ": the body ends after ", response.body.size(),
                                              " of its ", *content_length, " bytes"));
    }
    response.body.resize(*content_length);
  }
  return response;
}

absl::StatusOr<double> FindSample(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::ConsumePrefix(&line, series) || line.empty() || line[0] != ' ') continue;
    // "<series> <value>" or "<series> <value> <timestamp>"
    std::vector<absl::string_view> fields =
        absl::StrSplit(absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty());
    double value = 0;
    if (fields.empty() || !absl::SimpleAtod(fields[0], &value)) {
      return absl::DataLossError(absl::StrCat(series, " has no numeric value: \"",
                                              absl::CHexEscape(line.substr(0, 80)), "\""));
    }
    return value;
  }
  return absl::NotFoundError(absl::StrCat("no series ", series));
}

absl::StatusOr<double> ScrapeSample(const std::string& host, int port, const std::string& series,
                                    absl::Duration timeout) {
  auto page = HttpGet(host, port, "/metrics", timeout);
  if (!page.ok()) return page.status();
  if (page->status != 200) {
    return absl::UnavailableError(absl::StrCat("http://", host, ":", port, "/metrics answered ",
                                               page->status));
  }
  auto value = FindSample(page->body, series);
  if (!value.ok()) {
    return absl::Status(value.status().code(), absl::StrCat(value.status().message(), " in http://",
                                                            host, ":", port, "/metrics"));
  }
  return value;
}

}  // namespace fencelock::metrics
