#include <utility>  // first: Boost 1.74's Asio uses std::exchange without it (GCC 12, C++20)

// The runtime's reading side (runtime.h): the I/O thread's reads (TLS through Asio, plaintext
// from the runtime's own epoll set), a blocking caller reading its own reply (Lead), and the
// replies handed to the drivers they answer.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "protocol/session.h"
#include "runtime_internal.h"

namespace fencelock::client_internal {

void Runtime::Read(const std::shared_ptr<Conn>& conn) {
  conn->tls->async_read_some(asio::buffer(conn->in), [this, conn](boost::system::error_code ec,
                                                                  size_t n) {
    if (ec) {
      return Fail(conn, absl::UnavailableError(absl::StrCat(
                            "the connection to lockd at ", conn->address, " ended: ",
                            ec == asio::error::eof ? "closed by lockd" : ec.message())));
    }
    conn->decoder.Feed(std::string_view(conn->in.data(), n));
    Deliver(conn);
    if (conn->socket.is_open()) Read(conn);
  });
}

absl::Status Runtime::Register(const std::shared_ptr<Conn>& conn) {
  if (set_ == nullptr) {
    // Made on the first plaintext connection (again after a failure: descriptors run out).
    const int fd = ::epoll_create1(EPOLL_CLOEXEC);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("cannot make the client's epoll set: ",
                                                 std::strerror(errno),
                                                 errno == EMFILE ? " (out of file descriptors)" : ""));
    }
    set_ = std::make_unique<asio::posix::stream_descriptor>(io_, fd);
    WatchSet();
  }
  // Asio lets go of the socket (and takes it out of its own epoll); the runtime owns it now.
  boost::system::error_code ec;
  const int fd = conn->socket.release(ec);
  if (ec) return absl::UnavailableError(ec.message());
  StdMutexLock lock(&conn->wmu);
  {
    StdMutexLock fd_lock(&conn->fd_mu);
    conn->fd = fd;
  }
  conn->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);  // -1: callers never read it
  conn->reader = Conn::Reader::kIo;                         // Hello's answer
  conn->events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  epoll_event e{.events = conn->events, .data = {.u64 = conn->id}};
  if (::epoll_ctl(set_->native_handle(), EPOLL_CTL_ADD, fd, &e) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot watch the connection: ", std::strerror(errno)));
  }
  registered_[conn->id] = conn;
  return absl::OkStatus();
}

void Runtime::Rearm(Conn& conn) {
  const uint32_t events = EPOLLRDHUP | EPOLLET |
                          (conn.reader == Conn::Reader::kIo ? EPOLLIN : 0u) |
                          (conn.write_blocked ? EPOLLOUT : 0u);
  if (events == conn.events || conn.fd < 0 || conn.closed) return;
  conn.events = events;
  // A socket already readable (or writable) gives an event at once.
  epoll_event e{.events = events, .data = {.u64 = conn.id}};
  if (::epoll_ctl(set_->native_handle(), EPOLL_CTL_MOD, conn.fd, &e) != 0) {
    asio::post(io_, [this, id = conn.id, error = errno] {
      if (std::shared_ptr<Conn> failed = Find(id)) {
        Fail(failed, absl::UnavailableError(absl::StrCat(
                         "cannot watch the connection to lockd at ", failed->address, ": ",
                         std::strerror(error))));
      }
    });
  }
}

void Runtime::WatchSet() {
  set_->async_wait(asio::posix::stream_descriptor::wait_read,
                   [this](boost::system::error_code ec) {
                     if (ec) return;
                     constexpr int kBatch = 64;
                     epoll_event events[kBatch];
                     for (;;) {
                       const int n = ::epoll_wait(set_->native_handle(), events, kBatch, 0);
                       if (n < 0 && errno == EINTR) continue;
                       for (int i = 0; i < n; ++i) {
                         auto it = registered_.find(events[i].data.u64);
                         if (it == registered_.end()) continue;
                         if (auto conn = it->second.lock()) OnEvents(conn, events[i].events);
                       }
                       if (n < kBatch) break;
                     }
                     WatchSet();
                   });
}

void Runtime::OnEvents(const std::shared_ptr<Conn>& conn, uint32_t events) {
  if ((events & EPOLLOUT) != 0) {
    bool write = false;
    {
      StdMutexLock lock(&conn->wmu);
      write = std::exchange(conn->write_blocked, false);
      Rearm(*conn);
    }
    if (write) WritePlain(conn, "");
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) return;
  {
    StdMutexLock lock(&conn->wmu);
    // A caller reading it sees for itself; nobody reading it: lockd closed it (or wrote what
    // nobody awaits), which the read finds out.
    if (conn->closed || conn->reader == Conn::Reader::kCaller) return;
    conn->reader = Conn::Reader::kIo;
  }
  ReadPlain(conn);
}

void Runtime::ReadPlain(const std::shared_ptr<Conn>& conn) {
  int fd = -1;
  {
    StdMutexLock lock(&conn->wmu);
    if (conn->closed) return;
    fd = conn->fd;
  }
  // Edge-triggered: until a read finds less than it asked for (then nothing is left).
  for (;;) {
    const ssize_t n = ::recv(fd, conn->in.data(), conn->in.size(), MSG_DONTWAIT);
    if (n > 0) {
      conn->decoder.Feed(std::string_view(conn->in.data(), static_cast<size_t>(n)));
      if (static_cast<size_t>(n) < conn->in.size()) break;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      Deliver(conn);  // what came before the end
      return Fail(conn, absl::UnavailableError(absl::StrCat(
                            "the connection to lockd at ", conn->address, " ended: ",
                            n == 0 ? "closed by lockd" : std::strerror(errno))));
    }
  }
  {
    StdMutexLock lock(&conn->wmu);
    conn->delivering = !conn->closed;
  }
  Deliver(conn);
  std::string chunk;
  {
    // Reads on while a reply is awaited; else nobody reads until a request is sent again, so
    // that its caller may read its reply itself.
    StdMutexLock lock(&conn->wmu);
    conn->delivering = false;
    if (conn->closed) return;
    if (!conn->writing && !conn->out.empty()) {
      conn->writing = true;
      chunk.swap(conn->out);
    }
    if (conn->reader == Conn::Reader::kIo) {
      if (conn->hello_id == 0 && conn->routes.empty()) conn->reader = Conn::Reader::kNone;
      Rearm(*conn);
    }
  }
  // What the woken callers appended meanwhile.
  if (!chunk.empty()) WritePlain(conn, std::move(chunk));
}

void Runtime::Deliver(const std::shared_ptr<Conn>& conn) {
  std::vector<wire::Response> responses;
  std::string payload;
  for (;;) {
    const protocol::FrameDecoder::Result next = conn->decoder.Next(&payload);
    if (next == protocol::FrameDecoder::Result::kNeedMore) break;
    if (next == protocol::FrameDecoder::Result::kTooLarge) {
      return Fail(conn, absl::UnavailableError(absl::StrCat(
                            "lockd at ", conn->address, " sent a frame of ",
                            conn->decoder.announced_length(), " bytes, more than the most")));
    }
    wire::Response response;
    if (!response.ParseFromString(payload)) {
      return Fail(conn, absl::UnavailableError(
                            absl::StrCat("lockd at ", conn->address, " sent an unreadable reply")));
    }
    // Before Hello is answered, an answer with no request id is lockd refusing the connection
    // (admission, plaintext on its TLS port): Hello's answer too.
    if (conn->hello_id != 0 &&
        (response.request_id() == conn->hello_id || response.request_id() == 0)) {
      conn->hello_id = 0;
      HelloAnswered(conn, response);
      StdMutexLock lock(&conn->wmu);
      if (conn->closed) return;
      continue;
    }
    responses.push_back(std::move(response));
  }
  if (responses.empty()) return;
  // Each reply to the driver whose request it answers, all of one driver's in one pass; the
  // routes are looked up under one lock for the whole read.
  std::vector<std::pair<std::shared_ptr<DriverImpl>, std::vector<wire::Response>>> batches;
  std::vector<std::weak_ptr<DriverImpl>> owners(responses.size());
  {
    StdMutexLock lock(&conn->wmu);
    for (size_t i = 0; i < responses.size(); ++i) {
      auto it = conn->routes.find(responses[i].request_id());
      if (it == conn->routes.end()) continue;
      owners[i] = std::move(it->second);
      conn->routes.erase(it);
    }
  }
  for (size_t i = 0; i < responses.size(); ++i) {
    std::shared_ptr<DriverImpl> driver = owners[i].lock();
    if (driver == nullptr) continue;
    auto batch = std::find_if(batches.begin(), batches.end(),
                              [&](const auto& b) { return b.first == driver; });
    if (batch == batches.end()) {
      batches.emplace_back(driver, std::vector<wire::Response>{});
      batch = batches.end() - 1;
    }
    batch->second.push_back(std::move(responses[i]));
  }
  for (auto& [driver, mine] : batches) driver->Responses(conn->id, mine);
}

void Runtime::HelloAnswered(const std::shared_ptr<Conn>& conn, const wire::Response& reply) {
  std::string leader;
  absl::StatusOr<uint32_t> version = protocol::ReadHelloReply(reply, conn->address, &leader);
  if (!version.ok()) return Fail(conn, version.status(), leader);
  conn->timer.cancel();
  std::vector<std::pair<std::weak_ptr<DriverImpl>, size_t>> dialers;
  {
    StdMutexLock lock(&mu_);
    if (conn->state != Conn::State::kDialing) return;
    conn->state = Conn::State::kUp;
    conn->version = *version;
    dialers.swap(conn->dialers);
  }
  for (auto& [weak, replica] : dialers) {
    if (auto driver = weak.lock()) driver->Dialed(replica, conn, *version);
  }
  // Nobody stayed: the connection is idle.
  bool idle = false;
  {
    StdMutexLock lock(&mu_);
    if (conn->state == Conn::State::kUp && conn->attached.empty()) {
      conn->state = Conn::State::kClosed;
      conns_.erase(conn->id);
      idle = true;
    }
  }
  if (idle) {
    {
      StdMutexLock lock(&conn->wmu);
      conn->closed = true;
    }
    CloseSocket(conn);
  }
}

void Runtime::EnsureReader(const std::shared_ptr<Conn>& conn) {
  StdMutexLock lock(&conn->wmu);
  if (conn->closed || conn->reader != Conn::Reader::kNone || conn->routes.empty()) return;
  conn->reader = Conn::Reader::kIo;
  Rearm(*conn);
}

void Runtime::Lead(const std::shared_ptr<Conn>& conn, Waiter& waiter) {
  int fd = -1;
  {
    StdMutexLock lock(&conn->wmu);
    if (conn->closed || conn->reader != Conn::Reader::kNone) return;
    if (waiter.done.load(std::memory_order_acquire) != 0 || conn->wake_fd < 0) {
      if (!conn->routes.empty()) {
        conn->reader = Conn::Reader::kIo;
        Rearm(*conn);
      }
      return;
    }
    conn->reader = Conn::Reader::kCaller;
    StdMutexLock fd_lock(&conn->fd_mu);
    fd = conn->fd;
  }
  {
    StdMutexLock lock(&waiter.mu);
    waiter.polling = conn->wake_fd;
  }
  while (fd >= 0 && waiter.done.load(std::memory_order_acquire) == 0) {
    {
      StdMutexLock lock(&conn->wmu);
      if (conn->closed) break;
    }
    pollfd fds[2] = {{.fd = fd, .events = POLLIN, .revents = 0},
                     {.fd = conn->wake_fd, .events = POLLIN, .revents = 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;  // the I/O thread reads on
    }
    if (fds[1].revents != 0) {
      uint64_t count;
      (void)!::read(conn->wake_fd, &count, sizeof(count));
    }
    if (fds[0].revents == 0) continue;
    const ssize_t n = ::recv(fd, conn->in.data(), conn->in.size(), MSG_DONTWAIT);
    if (n > 0) {
      conn->decoder.Feed(std::string_view(conn->in.data(), static_cast<size_t>(n)));
      Deliver(conn);
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      Fail(conn, absl::UnavailableError(absl::StrCat(
                     "the connection to lockd at ", conn->address, " ended: ",
                     n == 0 ? "closed by lockd" : std::strerror(errno))));
      break;
    }
  }
  {
    StdMutexLock lock(&waiter.mu);
    waiter.polling = -1;
  }
  bool close = false;
  {
    StdMutexLock lock(&conn->wmu);
    close = std::exchange(conn->close_after_lead, false);
    conn->reader = !close && !conn->closed && !conn->routes.empty() ? Conn::Reader::kIo
                                                                     : Conn::Reader::kNone;
    Rearm(*conn);
  }
  if (close) CloseSocket(conn);
}

}  // namespace fencelock::client_internal
