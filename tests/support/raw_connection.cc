#include "raw_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "clock/clock.h"
#include "gtest/gtest.h"
#include "process/process.h"
#include "protocol/frame.h"
#include "protocol/session.h"
#include "protocol/version.h"

namespace fencelock::testing {
namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "RawConnection: %s: %s\n", what, std::strerror(errno));
  std::abort();
}

}  // namespace

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

uint64_t FloodConnects(int port, absl::Duration duration, size_t burst, absl::Duration hold) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::deque<int> open;
  uint64_t made = 0;
  const MonoTime end = Clock::Real()->Now() + duration;
  while (Clock::Real()->Now() < end) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      absl::SleepFor(absl::Milliseconds(1));
      continue;
    }
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
        errno != EINPROGRESS) {
      close(fd);
      absl::SleepFor(absl::Milliseconds(1));  // the backlog is full: a moment
      continue;
    }
    ++made;
    open.push_back(fd);
    if (open.size() >= burst) {
      absl::SleepFor(std::min(hold, end - Clock::Real()->Now()));
      for (int held : open) close(held);
      open.clear();
    }
  }
  for (int fd : open) close(fd);
  return made;
}

FloodOutcome CyclesDuringAFlood(RawConnection& worker, uint64_t session, const std::string& lock,
                                int port) {
  FloodOutcome out;
  std::thread flood([&] {
    out.connects = FloodConnects(port, absl::Seconds(3), 500, absl::Milliseconds(1200));
  });
  const MonoTime end = Clock::Real()->Now() + absl::Milliseconds(3500);
  while (Clock::Real()->Now() < end) {
    const wire::Response r = worker.Call(request::Acquire(session, lock));
    if (!r.acquire().granted()) {
      ADD_FAILURE() << "after " << out.cycles << " cycles: " << r.ShortDebugString();
      break;
    }
    const wire::Response released =
        worker.Call(request::Release(session, lock, r.acquire().token()));
    if (released.code() != wire::OK) {
      ADD_FAILURE() << "after " << out.cycles << " cycles: " << released.ShortDebugString();
      break;
    }
    ++out.cycles;
  }
  flood.join();
  return out;
}

FewerOpenFiles::FewerOpenFiles(uint64_t files) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) Die("getrlimit");
  saved_ = limit.rlim_cur;
  limit.rlim_cur = files;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) Die("setrlimit");
}

FewerOpenFiles::~FewerOpenFiles() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  limit.rlim_cur = saved_;
  (void)setrlimit(RLIMIT_NOFILE, &limit);
}

int FreeLoopbackPort() {
  auto port = process::FreeLoopbackPort();
  if (!port.ok()) Die("bind");
  return *port;
}

RawConnection RawConnection::Connect(const std::string& server,
                                     std::shared_ptr<net::TlsContext> tls) {
  // Request ids from 1001, clear of the small ids tests give their own SendRequest()s.
  auto conn = net::BlockingConnection::Connect(
      net::BlockingConnectionOptions{.server = server,
                                        .client_name = "raw-test",
                                        .hello = false,
                                        .first_request_id = 1001,
                                        .tls = std::move(tls)});
  if (!conn.ok()) {
    std::fprintf(stderr, "RawConnection: %s\n", conn.status().ToString().c_str());
    std::abort();
  }
  return RawConnection(std::move(*conn));
}

RawConnection RawConnection::Tls(int port, std::shared_ptr<net::TlsContext> tls) {
  return Connect("127.0.0.1:" + std::to_string(port), std::move(tls));
}

RawConnection RawConnection::Tcp(int port) {
  return Connect("127.0.0.1:" + std::to_string(port));
}

RawConnection RawConnection::Unix(const std::string& path) { return Connect("unix:" + path); }

bool RawConnection::SendBytes(const std::string& bytes) { return conn_->SendBytes(bytes).ok(); }

bool RawConnection::SendRequest(const wire::Request& request) {
  std::string frame;
  if (!protocol::AppendFrame(request.SerializeAsString(), &frame).ok()) return false;
  return SendBytes(frame);
}

std::optional<wire::Response> RawConnection::ReadResponse(absl::Duration timeout) {
  auto response = conn_->Receive(timeout);
  if (!response.ok()) return std::nullopt;
  return *response;
}

bool RawConnection::ClosedByPeer(absl::Duration timeout) {
  // Replies do not count: read (and discard) until EOF, reset or timeout.
  const MonoTime give_up = Clock::Real()->Now() + timeout;
  for (;;) {
    auto response =
        conn_->Receive(std::max(give_up - Clock::Real()->Now(), absl::ZeroDuration()));
    if (response.ok()) continue;
    return absl::IsUnavailable(response.status());
  }
}

wire::Response RawConnection::Call(wire::Request request) {
  auto response = conn_->Call(std::move(request));
  if (!response.ok()) {
    std::fprintf(stderr, "RawConnection: no reply: %s\n", response.status().ToString().c_str());
    std::abort();
  }
  return *response;
}

wire::Response RawConnection::Hello() { return Call(request::Hello()); }

uint64_t RawConnection::HelloAndOpenSession(absl::Duration ttl) {
  if (Hello().code() != wire::OK) {
    std::fprintf(stderr, "RawConnection: Hello refused\n");
    std::abort();
  }
  wire::Response reply = Call(request::OpenSession(ttl));
  if (reply.code() != wire::OK) {
    std::fprintf(stderr, "RawConnection: OpenSession refused: %s\n", reply.message().c_str());
    std::abort();
  }
  return reply.open_session().session_id();
}

}  // namespace fencelock::testing

namespace fencelock::testing {
namespace request {

wire::Request Hello() { return protocol::HelloRequest("raw-test"); }

}  // namespace request

std::vector<wire::Response> RawConnection::Pipeline(std::vector<wire::Request> requests) {
  std::string bytes;
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].set_request_id(i + 1);
    if (!protocol::AppendFrame(requests[i].SerializeAsString(), &bytes).ok()) {
      ADD_FAILURE() << "request " << i << " does not fit a frame";
      return {};
    }
  }
  // Bounded by the connection's timeout: a lockd that stops reading fails the test here,
  // rather than leaving it to wait for replies to requests that were never sent.
  if (absl::Status s = conn_->SendBytes(bytes); !s.ok()) {
    ADD_FAILURE() << "sending " << requests.size() << " pipelined requests (" << bytes.size()
                  << " bytes): " << s;
    return {};
  }
  std::vector<wire::Response> replies(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    // The gap between two replies, not the whole pipeline: seconds even in a sanitizer build.
    auto r = ReadResponse(absl::Seconds(15));
    if (!r) {
      ADD_FAILURE() << "no reply to pipelined request " << i;
      break;
    }
    if (r->request_id() >= 1 && r->request_id() <= requests.size()) {
      replies[r->request_id() - 1] = *r;
    }
  }
  return replies;
}

RawConnection HoldLocks(int port, size_t locks, size_t per_session, const std::string& prefix,
                        std::vector<std::pair<std::string, uint64_t>>* held) {
  RawConnection c = RawConnection::Tcp(port);
  EXPECT_EQ(c.Hello().code(), wire::OK);
  for (size_t done = 0; done < locks;) {
    const uint64_t session =
        c.Call(request::OpenSession(absl::Minutes(30))).open_session().session_id();
    std::vector<wire::Request> acquires;
    for (size_t i = 0; i < per_session && done + i < locks; ++i) {
      acquires.push_back(request::Acquire(session, prefix + std::to_string(done + i),
                                          absl::ZeroDuration(), absl::Minutes(30)));
    }
    auto replies = c.Pipeline(acquires);
    for (size_t i = 0; i < replies.size(); ++i) {
      EXPECT_TRUE(replies[i].acquire().granted()) << replies[i].ShortDebugString();
      if (held) held->emplace_back(acquires[i].acquire().lock(), replies[i].acquire().token());
    }
    done += acquires.size();
  }
  return c;
}

}  // namespace fencelock::testing
