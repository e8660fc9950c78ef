#include <utility>  // first: Boost 1.74's Asio uses std::exchange without it (GCC 12, C++20)

// The runtime (runtime.h): its shared connections, dialed, joined and left, written and ended.
// Their reading is in runtime_read.cc, the drivers in driver.cc.
#include "runtime.h"

#include "runtime_internal.h"

#include <linux/futex.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <optional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "protocol/address.h"
#include "protocol/frame.h"
#include "protocol/session.h"

namespace fencelock::client_internal {
namespace {

std::string KeyOf(const std::string& address, const std::shared_ptr<net::TlsContext>& tls,
                  const std::string& server_name, const std::string& client_name) {
  return absl::StrCat(address, "\n", reinterpret_cast<uintptr_t>(tls.get()), "\n", server_name,
                      "\n", client_name);
}

std::atomic<uint64_t> g_fork_generation{0};
std::atomic<Runtime*> g_runtime{nullptr};
// Taken around fork() (pthread_atfork), so that no thread the child lacks can hold it there. A
// std::mutex, not a StdMutex: the fork handlers take it in one function and let go in another,
// and it guards no field (g_runtime is atomic).
std::mutex g_runtime_mu;

}  // namespace

void Runtime::Dial(const std::shared_ptr<DriverImpl>& driver, const client_core::Dial& dial,
                   const std::shared_ptr<net::TlsContext>& tls, const std::string& server_name,
                   const std::string& client_name) {
  const bool use_tls = tls != nullptr && dial.address.rfind("unix:", 0) != 0;
  const std::string key = KeyOf(dial.address, use_tls ? tls : nullptr, server_name, client_name);
  std::shared_ptr<Conn> up;
  uint32_t version = 0;
  {
    StdMutexLock lock(&mu_);
    for (auto& [id, conn] : conns_) {
      if (conn->key != key || conn->retired || conn->state == Conn::State::kClosed ||
          conn->Load() >= kSessionsPerConnection) {
        continue;
      }
      if (conn->state == Conn::State::kDialing) {
        conn->dialers.emplace_back(driver, dial.replica);
        return;
      }
      up = conn;
      version = conn->version;
      break;
    }
    if (up == nullptr) {
      auto conn = std::make_shared<Conn>(io_);
      conn->id = ++next_conn_;
      conn->key = key;
      conn->address = dial.address;
      conn->server_name = server_name.empty() ? net::ServerNameOf(dial.address) : server_name;
      conn->client_name = client_name;
      if (use_tls) conn->tls_context = tls;
      conn->dialers.emplace_back(driver, dial.replica);
      conns_[conn->id] = conn;
      asio::post(io_, [this, conn, timeout = dial.timeout] { StartDial(conn, timeout); });
      return;
    }
  }
  driver->Dialed(dial.replica, up, version);
}

bool Runtime::Attach(const std::shared_ptr<Conn>& conn,
                     const std::shared_ptr<DriverImpl>& driver) {
  StdMutexLock lock(&mu_);
  if (conn->state != Conn::State::kUp) return false;
  conn->attached.push_back(driver);
  return true;
}

bool Runtime::Leave(const DriverImpl* driver, uint64_t id, bool retire) {
  std::shared_ptr<Conn> idle;
  {
    StdMutexLock lock(&mu_);
    auto it = conns_.find(id);
    if (it == conns_.end()) return false;
    Conn& conn = *it->second;
    std::erase_if(conn.attached, [&](const std::weak_ptr<DriverImpl>& w) {
      auto d = w.lock();
      return d == nullptr || d.get() == driver;
    });
    if (retire) conn.retired = true;
    if (conn.state == Conn::State::kUp && conn.attached.empty()) {
      conn.state = Conn::State::kClosed;
      idle = it->second;
      conns_.erase(it);
    }
  }
  if (idle != nullptr) {
    {
      StdMutexLock lock(&idle->wmu);
      idle->closed = true;
    }
    asio::post(io_, [this, idle] { CloseSocket(idle); });
  }
  return idle != nullptr;
}

bool Runtime::Append(Write& write, const wire::Request& request,
                     const std::weak_ptr<DriverImpl>& driver, bool last) {
  Conn& conn = *write.conn;
  const size_t size = request.ByteSizeLong();
  StdMutexLock lock(&conn.wmu);
  if (conn.closed) return false;
  const size_t at = conn.out.size();
  conn.out.resize(at + protocol::kFrameHeaderBytes + size);
  protocol::WriteFrameHeader(static_cast<uint32_t>(size), conn.out.data() + at);
  request.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(conn.out.data() + at + protocol::kFrameHeaderBytes));
  // Hello's answer is the I/O thread's own (no driver): nobody else awaits it.
  if (!driver.expired()) conn.routes[request.request_id()] = driver;
  if (conn.out.size() > kMaxUnwritten) {
    write.overflow = true;
    conn.writing = true;  // for good: the connection ends
    return true;
  }
  if (last && !conn.writing && !conn.delivering) {
    conn.writing = true;
    write.claimed = true;
    if (conn.tls_context == nullptr) {
      write.chunk.swap(conn.out);
      conn.out.clear();
    }
  }
  return true;
}

void Runtime::Flush(Write& write) {
  const std::shared_ptr<Conn>& conn = write.conn;
  if (conn == nullptr) return;
  if (write.overflow) {
    asio::post(io_, [this, conn] {
      Fail(conn, absl::UnavailableError(absl::StrCat(
                     "lockd at ", conn->address, " stopped reading: ", kMaxUnwritten >> 20,
                     " MiB of requests wait to be written")));
    });
    return;
  }
  if (!write.claimed) return;
  if (conn->tls_context != nullptr) {
    asio::post(io_, [this, conn] { WriteTls(conn); });
    return;
  }
  WritePlain(conn, std::move(write.chunk));
}

// Writes `chunk`, then `out` until it is empty (taking along what others append meanwhile),
// with `writing` claimed. A full socket hands the rest to the I/O thread, which waits until it
// can write.
void Runtime::WritePlain(const std::shared_ptr<Conn>& conn, std::string chunk) {
  for (;;) {
    if (chunk.empty()) {
      StdMutexLock lock(&conn->wmu);
      if (conn->closed || conn->out.empty()) {
        conn->writing = false;
        return;
      }
      chunk.swap(conn->out);
      conn->out.clear();
    }
    size_t sent = 0;
    int error = 0;
    {
      StdMutexLock lock(&conn->fd_mu);
      while (sent < chunk.size() && conn->fd >= 0) {
        // send() with MSG_NOSIGNAL: a peer that closed gives EPIPE, not a SIGPIPE.
        const ssize_t n = ::send(conn->fd, chunk.data() + sent, chunk.size() - sent,
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
          sent += static_cast<size_t>(n);
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else {
          error = n < 0 ? errno : EPIPE;
          break;
        }
      }
      if (conn->fd < 0 && sent < chunk.size()) error = EBADF;
    }
    if (sent == chunk.size()) {
      chunk.clear();
      continue;
    }
    if (error == EAGAIN || error == EWOULDBLOCK) {
      StdMutexLock lock(&conn->wmu);
      conn->out.insert(0, chunk, sent);
      conn->write_blocked = true;
      Rearm(*conn);
      return;  // `writing` stays claimed: the I/O thread goes on once it can write
    }
    asio::post(io_, [this, conn, error] {
      Fail(conn, absl::UnavailableError(absl::StrCat("writing to lockd at ", conn->address,
                                                     " failed: ", std::strerror(error))));
    });
    return;
  }
}

void Runtime::WriteTls(const std::shared_ptr<Conn>& conn) {
  {
    StdMutexLock lock(&conn->wmu);
    if (conn->closed || conn->out.empty() || conn->tls == nullptr) {
      conn->writing = false;
      return;
    }
    conn->tls_chunk.swap(conn->out);
    conn->out.clear();
  }
  asio::async_write(*conn->tls, asio::buffer(conn->tls_chunk),
                    [this, conn](boost::system::error_code ec, size_t) {
                      if (ec) {
                        return Fail(conn, absl::UnavailableError(absl::StrCat(
                                              "writing to lockd at ", conn->address,
                                              " failed: ", ec.message())));
                      }
                      WriteTls(conn);
                    });
}

void Runtime::StartDial(const std::shared_ptr<Conn>& conn, absl::Duration timeout) {
  auto failed = [this, conn](std::string why) {
    Fail(conn, absl::UnavailableError(
                   absl::StrCat("cannot connect to lockd at ", conn->address, ": ", why)));
  };
  auto parsed = protocol::ParseAddress(conn->address);
  if (!parsed.ok()) return Fail(conn, parsed.status());
  // Bounded: an absurd timeout (absl::InfiniteDuration()) would overflow the steady clock.
  conn->timer.expires_after(absl::ToChronoNanoseconds(std::min(timeout, absl::Hours(24 * 365))));
  conn->timer.async_wait([failed, timeout](boost::system::error_code ec) {
    if (!ec) failed(absl::StrCat("no answer within ", absl::FormatDuration(timeout)));
  });
  auto connect = [this, conn, failed](const asio::generic::stream_protocol::endpoint& ep) {
    // Close-on-exec from the start: a program the process execs (or a child of fork() that
    // does) must not keep lockd's connection open. Asio would open it without.
    const int fd = ::socket(ep.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC,
                            ep.protocol().protocol());
    if (fd < 0) {
      const int error = errno;
      return failed(absl::StrCat(std::strerror(error), error == EMFILE || error == ENFILE
                                                           ? " (out of file descriptors)"
                                                           : ""));
    }
    boost::system::error_code assigned;
    conn->socket.assign(ep.protocol(), fd, assigned);
    if (assigned) {
      ::close(fd);
      return failed(assigned.message());
    }
    conn->socket.async_connect(ep, [this, conn, failed](boost::system::error_code ec) {
      if (ec == asio::error::no_descriptors || ec.value() == ENFILE) {
        return failed(absl::StrCat(ec.message(), " (out of file descriptors)"));
      }
      if (ec) return failed(ec.message());
      Connected(conn);
    });
  };
  if (parsed->unix_socket()) {
    return connect(asio::local::stream_protocol::endpoint(parsed->path));
  }
  // A numeric address needs no resolver (whose thread Asio starts on first use).
  boost::system::error_code numeric;
  const asio::ip::address ip = asio::ip::make_address(parsed->host, numeric);
  if (!numeric) return connect(asio::ip::tcp::endpoint(ip, parsed->port));
  conn->resolver.async_resolve(
      parsed->host, std::to_string(parsed->port), asio::ip::tcp::resolver::numeric_service,
      [conn, failed, connect](boost::system::error_code ec,
                              asio::ip::tcp::resolver::results_type results) {
        if (ec || results.empty()) {
          return failed(absl::StrCat("cannot resolve \"", conn->address,
                                     "\": ", ec ? ec.message() : "no address"));
        }
        connect(results.begin()->endpoint());
      });
}

void Runtime::Connected(const std::shared_ptr<Conn>& conn) {
  boost::system::error_code ec;
  if (conn->socket.local_endpoint(ec).protocol().family() != AF_UNIX) {
    const int one = 1;
    ::setsockopt(conn->socket.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  auto hello = [this, conn] {
    wire::Request request = protocol::HelloRequest(conn->client_name);
    conn->hello_id = NextRequestId();
    request.set_request_id(conn->hello_id);
    Write write{.conn = conn};
    Append(write, request, {}, true);
    Flush(write);
    if (conn->tls != nullptr) Read(conn);
  };
  if (conn->tls_context == nullptr) {
    if (absl::Status s = Register(conn); !s.ok()) {
      return Fail(conn, absl::UnavailableError(absl::StrCat("cannot connect to lockd at ",
                                                            conn->address, ": ", s.message())));
    }
    return hello();
  }
  {
    StdMutexLock lock(&conn->wmu);
    conn->reader = Conn::Reader::kIo;
  }
  SSL_CTX_up_ref(conn->tls_context->native());  // Asio's context holds a reference of its own
  conn->ssl_context.emplace(conn->tls_context->native());
  conn->tls = std::make_unique<asio::ssl::stream<Socket&>>(conn->socket, *conn->ssl_context);
  if (absl::Status s = net::ExpectServerName(conn->tls->native_handle(), conn->server_name);
      !s.ok()) {
    return Fail(conn, absl::UnavailableError(absl::StrCat("cannot connect to lockd at ",
                                                          conn->address, ": ", s.message())));
  }
  conn->tls->async_handshake(asio::ssl::stream_base::client,
                             [this, conn, hello](boost::system::error_code ec) {
                               if (ec) {
                                 return Fail(conn, absl::UnavailableError(absl::StrCat(
                                                       "cannot connect to lockd at ",
                                                       conn->address, ": TLS handshake failed: ",
                                                       ec.message())));
                               }
                               hello();
                             });
}

void Runtime::Fail(const std::shared_ptr<Conn>& conn, const absl::Status& status,
                   const std::string& leader) {
  std::vector<std::pair<std::weak_ptr<DriverImpl>, size_t>> dialers;
  std::vector<std::weak_ptr<DriverImpl>> attached;
  {
    StdMutexLock lock(&mu_);
    if (conn->state != Conn::State::kClosed) {
      conn->state = Conn::State::kClosed;
      conns_.erase(conn->id);
    }
    dialers.swap(conn->dialers);
    attached.swap(conn->attached);
  }
  {
    StdMutexLock lock(&conn->wmu);
    conn->closed = true;
    conn->out.clear();
    conn->routes.clear();
  }
  CloseSocket(conn);
  for (auto& [weak, replica] : dialers) {
    if (auto driver = weak.lock()) driver->DialFailed(replica, status, leader);
  }
  for (auto& weak : attached) {
    if (auto driver = weak.lock()) driver->Disconnected(conn->id);
  }
}

void Runtime::CloseSocket(const std::shared_ptr<Conn>& conn) {
  if (!OnItsThread()) {
    asio::post(io_, [this, conn] { CloseSocket(conn); });
    return;
  }
  boost::system::error_code ec;
  conn->timer.cancel();
  conn->resolver.cancel();
  StdMutexLock lock(&conn->wmu);
  StdMutexLock fd_lock(&conn->fd_mu);
  if (conn->reader == Conn::Reader::kCaller) {
    // Its poll() wakes; the descriptor stays its until it stops reading (see Lead).
    conn->close_after_lead = true;
    if (conn->fd >= 0) ::shutdown(conn->fd, SHUT_RDWR);
    return;
  }
  if (conn->fd >= 0) {
    ::epoll_ctl(set_->native_handle(), EPOLL_CTL_DEL, conn->fd, nullptr);
    ::close(conn->fd);
    conn->fd = -1;
    registered_.erase(conn->id);
  }
  conn->socket.close(ec);  // a socket still Asio's (dialing, or TLS)
}

Runtime& Runtime::Get() {
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) return *runtime;
  std::lock_guard<std::mutex> lock(g_runtime_mu);
  if (Runtime* runtime = g_runtime.load(std::memory_order_acquire)) return *runtime;
  static const bool registered = [] {
    // In the child only its own thread runs: the parent's runtime (its I/O thread, its
    // sockets, its locks) is left behind, never touched, and the next Client makes another.
    ::pthread_atfork([] { g_runtime_mu.lock(); }, [] { g_runtime_mu.unlock(); },
                     [] {
                       g_runtime.store(nullptr, std::memory_order_release);
                       g_fork_generation.fetch_add(1, std::memory_order_release);
                       g_runtime_mu.unlock();
                     });
    return true;
  }();
  (void)registered;
  auto* runtime = new Runtime();
  g_runtime.store(runtime, std::memory_order_release);
  return *runtime;
}

uint64_t ForkGeneration() { return g_fork_generation.load(std::memory_order_acquire); }

absl::Status InheritedError() {
  return absl::FailedPreconditionError(
      "this Client was made before fork(), in the parent process: its session, locks and "
      "connection are the parent's; make a new Client in this process");
}

}  // namespace fencelock::client_internal
