#include "channel.h"

#include <openssl/ssl.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "clock/monotonic_event.h"
#include "net/asio.h"
#include "net/asio_ssl.h"
#include "protocol/address.h"
#include "protocol/codes.h"
#include "protocol/frame.h"
#include "protocol/session.h"
#include "protocol/version.h"

namespace fencelock::client_internal {

struct PendingCall {
  uint64_t id = 0;          // the request id, set by Submit before the call is registered
  uint64_t generation = 0;  // of the connection it was sent on, set with the id
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  Reply reply ABSL_GUARDED_BY(mu);
  // Set once `done` is: a caller that does not read the socket itself waits on it, not on `mu`,
  // so that a wall-clock step does not change how long it waits (Debian Abseil's timed waits
  // are on the wall clock).
  MonotonicEvent finished;
  // SendAsync's callback, called on the I/O thread instead of anyone waiting.
  std::function<void(absl::StatusOr<Reply>)> on_done;

  bool Done() {
    absl::MutexLock lock(&mu);
    return done;
  }
};

namespace {

using asio::awaitable;
using asio::use_awaitable;
using Socket = asio::generic::stream_protocol::socket;
using Endpoint = asio::generic::stream_protocol::endpoint;

// Who reads a connection's socket at the moment.
enum class Reader { kNone, kIo, kCaller };

// One connection: its socket, the TLS session over it when there is one (all bytes go through
// `tls` then), and what its reader and writer keep. It closes its descriptor when the last
// reference goes, never earlier: a caller may still be reading it when the connection fails,
// and a descriptor number reused by the next connection must not reach that caller.
struct Connection {
  Connection(asio::io_context& io, uint64_t generation)
      : socket(io), generation(generation), io(io) {}
  ~Connection() {
    if (owned_fd >= 0) ::close(owned_fd);
  }
  Socket socket;  // until connected; over TLS for good
  std::unique_ptr<asio::ssl::stream<Socket&>> tls;
  const uint64_t generation;
  int fd = -1;  // the socket's descriptor, once connected
  // A plain socket is taken out of Asio once connected (Detach): registered with the I/O
  // thread's epoll, every reply would wake that thread, whoever reads it.
  int owned_fd = -1;

  // I/O thread only. When the I/O thread itself must wait on a plain socket (to read for
  // nobody, or to write what did not fit), it watches a duplicate of the descriptor for as
  // long as it waits: `watchers` counts who does.
  asio::io_context& io;
  std::unique_ptr<asio::posix::stream_descriptor> watcher;
  int watchers = 0;
  int watch_errno = 0;  // why the last Watch() could not open the watcher
  // The watcher is not open when the duplicate could not be made: WatchError() says why.
  asio::posix::stream_descriptor* Watch() {
    if (watchers++ == 0) {
      const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      watch_errno = copy < 0 ? errno : 0;
      watcher = std::make_unique<asio::posix::stream_descriptor>(io);
      boost::system::error_code ec;
      if (copy >= 0) watcher->assign(copy, ec);
      if (ec) {
        ::close(copy);
        watch_errno = ec.value();
      }
    }
    return watcher.get();
  }
  absl::Status WatchError() const {
    return absl::UnavailableError(absl::StrCat(
        "cannot wait on the connection to lockd: no descriptor for its duplicate (",
        std::strerror(watch_errno),
        watch_errno == EMFILE || watch_errno == ENFILE ? "; the process is out of file descriptors)"
                                                       : ")"));
  }
  void Unwatch() {
    if (--watchers == 0) watcher.reset();
  }
  // Takes a connected plain socket out of Asio (I/O thread).
  void Detach() {
    boost::system::error_code ec;
    owned_fd = socket.release(ec);
    if (ec) owned_fd = -1;
  }
  void CancelWaits() {
    boost::system::error_code ec;
    socket.cancel(ec);
    if (watcher) watcher->cancel(ec);
  }

  // Guarded by the channel's mu_. Over a plain socket (`direct`), callers write and read it
  // themselves; over TLS only the I/O thread touches it.
  bool direct = false;
  bool failed = false;
  Reader reader = Reader::kNone;
  bool io_armed = false;  // the I/O thread waits to read it (or reads it)

  // Guarded by the channel's wr_mu_.
  std::string outbox;            // bytes for the I/O thread's write loop
  std::vector<uint64_t> outbox_ids;
  bool writing = false;          // the write loop runs: new frames queue behind it
  std::string held;              // PostWithNext's frames, written with the next one

  // The reader's: only whoever `reader` names touches them.
  protocol::FrameDecoder decoder;
  std::string chunk;

  template <typename Buffer>
  awaitable<size_t> ReadSome(const Buffer& buffer, boost::system::error_code& ec) {
    if (tls) co_return co_await tls->async_read_some(buffer, asio::redirect_error(use_awaitable, ec));
    co_return co_await socket.async_read_some(buffer, asio::redirect_error(use_awaitable, ec));
  }
  template <typename Buffer>
  awaitable<void> WriteAll(const Buffer& buffer, boost::system::error_code& ec) {
    if (tls) {
      co_await asio::async_write(*tls, buffer, asio::redirect_error(use_awaitable, ec));
      co_return;
    }
    // send() with MSG_NOSIGNAL, not the descriptor's write(): a peer that closed must give
    // EPIPE, not a SIGPIPE that ends the process.
    asio::posix::stream_descriptor* d = Watch();
    const char* data = static_cast<const char*>(buffer.data());
    size_t left = buffer.size();
    while (left > 0 && !ec) {
      const ssize_t n = ::send(fd, data, left, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        data += n;
        left -= static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!d->is_open()) {
          ec = boost::system::error_code(watch_errno, boost::system::system_category());
          break;
        }
        co_await d->async_wait(asio::posix::stream_descriptor::wait_write,
                               asio::redirect_error(use_awaitable, ec));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        ec = boost::system::error_code(n < 0 ? errno : EPIPE, boost::system::system_category());
      }
    }
    Unwatch();
  }
};

absl::StatusOr<Endpoint> ResolveAddress(asio::io_context& io, const std::string& address) {
  auto parsed = protocol::ParseAddress(address);
  if (!parsed.ok()) return parsed.status();
  if (parsed->unix_socket()) {
    return Endpoint(asio::local::stream_protocol::endpoint(parsed->path));
  }
  const std::string& host = parsed->host;
  const std::string port_text = std::to_string(parsed->port);
  boost::system::error_code rec;
  asio::ip::tcp::resolver resolver(io);
  auto results = resolver.resolve(host, port_text, asio::ip::tcp::resolver::numeric_service, rec);
  if (rec || results.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve \"", host, "\": ", rec ? rec.message() : "no address"));
  }
  return Endpoint(results.begin()->endpoint());
}

class AsioChannel final : public Channel {
 public:
  AsioChannel(Clock* clock, std::shared_ptr<net::TlsContext> tls, std::string tls_server_name)
      : clock_(clock),
        tls_(std::move(tls)),
        tls_server_name_(std::move(tls_server_name)),
        work_(asio::make_work_guard(io_)),
        thread_([this] { io_.run(); }) {
    if (tls_) {
      SSL_CTX_up_ref(tls_->native());  // Asio's context holds a reference of its own
      tls_context_.emplace(tls_->native());
    }
  }

  ~AsioChannel() override {
    Close();
    work_.reset();
    io_.stop();
    thread_.join();
  }

  absl::Status Connect(const std::string& address, const std::string& client_name,
                       absl::Duration timeout) override;
  // One endpoint of the list. A standby's refusal (NOT_LEADER) sets `leader` to the serving
  // replica it names.
  absl::Status ConnectOne(const std::string& address, const std::string& client_name,
                          absl::Duration timeout, std::string* leader = nullptr);
  bool connected() override;
  absl::StatusOr<Reply> Call(wire::Request request, absl::Duration timeout) override;
  absl::StatusOr<std::shared_ptr<PendingCall>> Send(wire::Request request) override;
  absl::StatusOr<Reply> Await(const std::shared_ptr<PendingCall>& call,
                              absl::Duration timeout) override;
  absl::StatusOr<uint64_t> SendAsync(wire::Request request, absl::Duration timeout,
                                     std::function<void(absl::StatusOr<Reply>)> on_done) override;
  uint32_t version() const override {
    absl::MutexLock lock(&mu_);
    return version_;
  }
  absl::StatusOr<uint64_t> Post(wire::Request request) override;
  absl::StatusOr<uint64_t> PostWithNext(wire::Request request) override;
  void set_unmatched_reply_handler(std::function<void(const wire::Response&)> handler) override {
    unmatched_ = std::move(handler);
  }
  void Close() override;
  void Abandon(absl::Duration silence) override {
    {
      absl::MutexLock lock(&mu_);
      if (replicas_ > 1) {
        silent_ = preferred_;
        silent_timeout_ = silence;
        preferred_ = (preferred_ + 1) % replicas_;
      }
    }
    Close();
  }

 private:
  using Conn = std::shared_ptr<Connection>;

  bool OnIoThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Registers a pending call (or, for Post, the reply expected for nobody) and writes its
  // frame, or queues it behind frames not yet written. Returns the id, or an error if not
  // connected or the request is too large; a write that fails later fails the connection.
  absl::StatusOr<uint64_t> Submit(wire::Request& request, std::shared_ptr<PendingCall> call,
                                  bool with_next = false);
  // Writes `frame` (after any frames held for the next write), or, `with_next`, holds it.
  void Write(const Conn& conn, std::string frame, uint64_t id, PendingCall* call,
             bool with_next);
  awaitable<void> WriteLoop(Conn conn);

  // Reading. Over a plain socket nobody reads while nothing is due: a caller awaiting its
  // reply reads the socket itself (the reader token, Connection::reader), and the I/O thread
  // reads only for replies no caller is reading for (SendAsync's, Post's, and those of calls
  // given up), or while a caller waits behind another reader. Over TLS the I/O thread reads
  // all the time (TlsReadLoop).
  awaitable<void> IoReadLoop(Conn conn);
  awaitable<void> TlsReadLoop(Conn conn);
  // One non-blocking read, and the replies it completes. `*drained`: nothing was there.
  absl::Status ReadOnce(Connection& conn, bool* drained);
  // Parses and delivers every whole frame `conn`'s decoder holds.
  absl::Status DeliverFrames(Connection& conn);
  // Reads as `call`'s caller until it is answered or `deadline` passes.
  void ReadFor(const Conn& conn, PendingCall& call, std::chrono::steady_clock::time_point deadline);
  // Gives back the reader token; hands the reading to the I/O thread if replies are still due.
  void ReleaseReader(const Conn& conn);
  // Starts the I/O thread reading `conn` if replies are due that no caller reads for.
  void EnsureReading(const Conn& conn);
  bool RepliesDue() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.empty() || !given_up_.empty();
  }
  // Arms the I/O thread's reading of `conn`, with mu_ held; false if it was armed already.
  bool ArmLocked(const Conn& conn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SpawnIoReader(const Conn& conn);

  void Deliver(wire::Response response);
  // Fails `conn`: every call pending on it fails with `why`. Any thread; once per connection.
  void Fail(const Conn& conn, const absl::Status& why);
  // Completes `call` with `result`: its callback (on the I/O thread), or whoever awaits it.
  void Finish(const std::shared_ptr<PendingCall>& call, absl::StatusOr<Reply> result);
  // A SendAsync call's timeout passed: fails it if it is still pending.
  void Expire(uint64_t id, absl::Duration timeout);

  Clock* const clock_;
  const std::shared_ptr<net::TlsContext> tls_;
  const std::string tls_server_name_;
  std::optional<asio::ssl::context> tls_context_;
  asio::io_context io_{1};
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::function<void(const wire::Response&)> unmatched_;

  // Taken before mu_: the order in which frames reach the socket.
  absl::Mutex wr_mu_;

  mutable absl::Mutex mu_;
  // Of the address list: the replica that answered last, how many there are, and one that fell
  // silent (Abandon), tried last until a replica answers; SIZE_MAX for none.
  size_t preferred_ ABSL_GUARDED_BY(mu_) = 0;
  size_t replicas_ ABSL_GUARDED_BY(mu_) = 1;
  size_t silent_ ABSL_GUARDED_BY(mu_) = SIZE_MAX;
  absl::Duration silent_timeout_ ABSL_GUARDED_BY(mu_);  // what it gets to answer a Hello
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  Conn conn_ ABSL_GUARDED_BY(mu_);  // the connection calls are sent on; null when there is none
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> pending_ ABSL_GUARDED_BY(mu_);
  // Calls whose caller stopped waiting, with their replies still due: they go to the
  // unmatched-reply handler (a late grant is given back), so the I/O thread reads for them.
  absl::flat_hash_set<uint64_t> given_up_ ABSL_GUARDED_BY(mu_);

  // I/O thread only: the timeouts of SendAsync calls, by request id (a fired or cancelled one
  // is erased).
  absl::flat_hash_map<uint64_t, std::unique_ptr<asio::steady_timer>> timers_;

  std::thread thread_;  // last: starts after everything above is constructed
};

absl::Status AsioChannel::Connect(const std::string& addresses, const std::string& client_name,
                                  absl::Duration timeout) {
  const std::vector<std::string> list = absl::StrSplit(addresses, ',');
  if (list.size() == 1) return ConnectOne(list[0], client_name, timeout);
  // Replicas: the one that answered last first, then the others in order. A replica that
  // does not serve (a standby, or one that is down) refuses at once; a frozen one gets its
  // share of the time.
  const MonoTime give_up = clock_->Now() + timeout;
  std::vector<std::string> failures;
  size_t first, silent;
  absl::Duration silent_share;
  {
    absl::MutexLock lock(&mu_);
    first = preferred_ < list.size() ? preferred_ : 0;
    silent = silent_;
    silent_share = silent_timeout_;
  }
  // A replica that fell silent (Abandon) comes last, with no more than the silence it was
  // abandoned for: a frozen one costs little, and one that was only slow (its commits held up
  // by an etcd election) is back once it answers in time again.
  std::vector<size_t> order;
  for (size_t n = 0; n < list.size(); ++n) {
    if ((first + n) % list.size() != silent) order.push_back((first + n) % list.size());
  }
  if (silent < list.size()) order.push_back(silent);
  for (size_t n = 0; n < order.size(); ++n) {
    const size_t i = order[n];
    absl::Duration share =
        std::max((give_up - clock_->Now()) / static_cast<int64_t>(order.size() - n),
                 absl::Milliseconds(1));
    if (i == silent) share = std::min(share, silent_share);
    std::string leader;
    absl::Status s = ConnectOne(list[i], client_name, share, &leader);
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      preferred_ = i;
      replicas_ = list.size();
      silent_ = SIZE_MAX;
      return s;
    }
    if (absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s)) return s;
    failures.push_back(std::string(s.message()));
    // A standby named the serving replica: that one next, if it is one of ours and not tried
    // yet (a redirect never leads outside the configured list).
    if (!leader.empty()) {
      auto named = std::find_if(order.begin() + n + 1, order.end(),
                                [&](size_t j) { return list[j] == leader && j != silent; });
      if (named != order.end()) std::rotate(order.begin() + n + 1, named, named + 1);
    }
  }
  return absl::UnavailableError(absl::StrCat("no lockd replica answered: ",
                                             absl::StrJoin(failures, "; ")));
}

absl::Status AsioChannel::ConnectOne(const std::string& address, const std::string& client_name,
                                     absl::Duration timeout, std::string* leader) {
  Close();
  const MonoTime give_up = clock_->Now() + timeout;
  auto endpoint = ResolveAddress(io_, address);
  if (!endpoint.ok()) return endpoint.status();

  Conn conn;
  {
    absl::MutexLock lock(&mu_);
    conn = std::make_shared<Connection>(io_, ++generation_);
  }
  const bool use_tls = tls_ != nullptr && address.rfind("unix:", 0) != 0;
  const std::string server_name = tls_server_name_.empty() ? net::ServerNameOf(address) : tls_server_name_;
  // The connect's (and the TLS handshake's) outcome: empty when connected.
  auto connected = std::make_shared<std::promise<std::string>>();
  auto result = connected->get_future();
  asio::post(io_, [this, ep = *endpoint, conn, connected, use_tls, server_name] {
    conn->socket.async_connect(ep, [this, conn, connected, use_tls, server_name](
                                       boost::system::error_code ec) {
      if (ec) return connected->set_value(ec.message());
      if (conn->socket.local_endpoint(ec).protocol().family() != AF_UNIX) {
        conn->socket.set_option(asio::ip::tcp::no_delay(true), ec);
      }
      if (!use_tls) {
        conn->fd = conn->socket.native_handle();
        conn->Detach();
        if (conn->owned_fd < 0) return connected->set_value("cannot take the socket from Asio");
        return connected->set_value("");
      }
      conn->tls = std::make_unique<asio::ssl::stream<Socket&>>(conn->socket, *tls_context_);
      if (absl::Status s = net::ExpectServerName(conn->tls->native_handle(), server_name);
          !s.ok()) {
        return connected->set_value(std::string(s.message()));
      }
      conn->tls->async_handshake(
          asio::ssl::stream_base::client, [connected](boost::system::error_code ec) {
            connected->set_value(ec ? absl::StrCat("TLS handshake failed: ", ec.message()) : "");
          });
    });
  });
  std::string error = "";
  if (result.wait_for(absl::ToChronoNanoseconds(timeout)) != std::future_status::ready) {
    error = absl::StrCat("no answer within ", absl::FormatDuration(timeout));
  } else {
    error = result.get();
  }
  if (!error.empty()) {
    // The socket is the I/O thread's until the connect completed: close it there.
    asio::post(io_, [conn] {
      boost::system::error_code ec;
      conn->socket.close(ec);
    });
    return absl::UnavailableError(absl::StrCat("cannot connect to lockd at ", address, ": ", error));
  }
  {
    absl::MutexLock lock(&mu_);
    if (generation_ != conn->generation) return absl::UnavailableError("connection replaced");
    if (use_tls) conn->fd = conn->socket.native_handle();
    conn->direct = !use_tls;
    conn_ = conn;
    connected_ = true;
    if (use_tls) conn->io_armed = true;  // for good: TlsReadLoop reads until the connection ends
  }
  if (use_tls) {
    asio::post(io_, [this, conn] { asio::co_spawn(io_, TlsReadLoop(conn), asio::detached); });
  }

  auto reply = Call(protocol::HelloRequest(client_name),
                    std::max(give_up - clock_->Now(), absl::Milliseconds(1)));
  absl::StatusOr<uint32_t> version =
      reply.ok() ? protocol::ReadHelloReply(reply->response, address, leader) : reply.status();
  if (!version.ok()) {
    Close();
    return version.status();
  }
  absl::MutexLock lock(&mu_);
  version_ = *version;
  return absl::OkStatus();
}

bool AsioChannel::connected() {
  Conn conn;
  {
    absl::MutexLock lock(&mu_);
    if (!connected_) return false;
    // Someone reads it: they would have seen it end.
    if (!conn_->direct || conn_->reader != Reader::kNone || conn_->io_armed) return true;
    conn = conn_;
    conn->reader = Reader::kCaller;
  }
  // Nobody reads an idle connection: look whether lockd closed it (restarted, or failed over)
  // before a request is sent on it that could only fail.
  absl::Status s;
  for (;;) {
    pollfd p{.fd = conn->fd, .events = POLLIN | POLLRDHUP, .revents = 0};
    if (::poll(&p, 1, 0) <= 0) break;
    bool drained = false;
    s = ReadOnce(*conn, &drained);
    if (!s.ok() || drained) break;
  }
  if (!s.ok()) Fail(conn, s);
  ReleaseReader(conn);
  absl::MutexLock lock(&mu_);
  return connected_;
}

absl::StatusOr<uint64_t> AsioChannel::Submit(wire::Request& request,
                                             std::shared_ptr<PendingCall> call, bool with_next) {
  uint64_t id;
  Conn conn;
  {
    absl::MutexLock lock(&mu_);
    if (!connected_) return absl::UnavailableError("not connected to lockd");
    id = ++next_request_id_;
    conn = conn_;
    request.set_request_id(id);
    if (call != nullptr) {
      // Before the call is published: a reader may finish it at once.
      call->id = id;
      call->generation = conn->generation;
      pending_[id] = call;
    }
  }
  std::string frame;
  absl::Status framed = protocol::AppendFrame(request.SerializeAsString(), &frame);
  if (!framed.ok()) {
    absl::MutexLock lock(&mu_);
    pending_.erase(id);
    return framed;
  }
  // A Post's reply is read with whatever is read next (the next call's reply, a heartbeat's):
  // nothing reads for it alone.
  Write(conn, std::move(frame), id, call.get(), with_next);
  return id;
}

void AsioChannel::Write(const Conn& conn, std::string frame, uint64_t id, PendingCall* call,
                        bool with_next) {
  absl::Status failed;
  {
    absl::MutexLock lock(&wr_mu_);
    // `direct` and `fd` were set before the connection was published under mu_, which Submit
    // took to find it, and never change after.
    const bool direct = conn->direct;
    if (with_next) {
      conn->held.append(frame);
      return;
    }
    if (!conn->held.empty()) {
      frame.insert(0, conn->held);
      conn->held.clear();
    }
    size_t sent = 0;
    if (direct && !conn->writing) {
      // Written by the caller: no hand-over to the I/O thread. D2: t_send is read here,
      // immediately before the bytes go to the socket.
      const MonoTime t_send = clock_->Now();
      if (call != nullptr) {
        absl::MutexLock call_lock(&call->mu);
        call->reply.sent_at = t_send;
      }
      while (sent < frame.size()) {
        const ssize_t n = ::send(conn->fd, frame.data() + sent, frame.size() - sent,
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
          sent += static_cast<size_t>(n);
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          break;  // the socket buffer is full: the rest goes to the write loop
        } else {
          failed = absl::UnavailableError(
              absl::StrCat("write to lockd failed: ", std::strerror(n < 0 ? errno : EPIPE)));
          break;
        }
      }
      if (failed.ok() && sent < frame.size()) {
        conn->outbox.append(frame, sent);  // its t_send is already set
      }
    } else {
      conn->outbox.append(frame);
      conn->outbox_ids.push_back(id);
    }
    if (failed.ok() && !conn->outbox.empty() && !conn->writing) {
      conn->writing = true;
      asio::post(io_, [this, conn] { asio::co_spawn(io_, WriteLoop(conn), asio::detached); });
    }
  }
  if (!failed.ok()) Fail(conn, failed);
}

awaitable<void> AsioChannel::WriteLoop(Conn conn) {
  boost::system::error_code ec;
  for (;;) {
    std::string batch;
    std::vector<uint64_t> ids;
    {
      absl::MutexLock lock(&wr_mu_);
      if (conn->outbox.empty()) {
        conn->writing = false;
        co_return;
      }
      batch.swap(conn->outbox);
      ids.swap(conn->outbox_ids);
    }
    // D2: t_send is read here, immediately before the bytes go to the socket.
    const MonoTime t_send = clock_->Now();
    {
      absl::MutexLock lock(&mu_);
      for (uint64_t id : ids) {
        auto it = pending_.find(id);
        if (it == pending_.end()) continue;
        absl::MutexLock call_lock(&it->second->mu);
        it->second->reply.sent_at = t_send;
      }
    }
    co_await conn->WriteAll(asio::buffer(batch), ec);
    if (ec) {
      Fail(conn, absl::UnavailableError(absl::StrCat("write to lockd failed: ", ec.message())));
      co_return;  // `writing` stays set: nothing more is written to a failed connection
    }
  }
}

absl::StatusOr<Reply> AsioChannel::Call(wire::Request request, absl::Duration timeout) {
  auto call = Send(std::move(request));
  if (!call.ok()) return call.status();
  return Await(*call, timeout);
}

absl::StatusOr<std::shared_ptr<PendingCall>> AsioChannel::Send(wire::Request request) {
  auto call = std::make_shared<PendingCall>();
  auto id = Submit(request, call);
  if (!id.ok()) return id.status();
  return call;
}

absl::StatusOr<Reply> AsioChannel::Await(const std::shared_ptr<PendingCall>& call,
                                         absl::Duration timeout) {
  // Measured on the monotonic clock, as every wait here is: a wall-clock step moves nothing.
  const auto deadline = std::chrono::steady_clock::now() +
                        absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration()));
  Conn reading;
  {
    absl::MutexLock lock(&mu_);
    if (conn_ != nullptr && conn_->generation == call->generation && conn_->direct &&
        !conn_->failed && conn_->reader == Reader::kNone) {
      reading = conn_;
      reading->reader = Reader::kCaller;
    }
  }
  if (reading != nullptr) {
    ReadFor(reading, *call, deadline);
    ReleaseReader(reading);
  } else {
    // Another reads (a caller, or the I/O thread), or the call already failed: whoever reads
    // finishes it, and a reader that stops before its reply hands the reading on.
    call->finished.WaitFor(absl::FromChrono(deadline - std::chrono::steady_clock::now()));
  }
  Conn given_up_on;  // the connection whose reply this caller stopped waiting for
  {
    absl::MutexLock lock(&mu_);
    // A reply arriving from now on is unmatched (a grant goes back through the handler).
    if (pending_.erase(call->id) > 0) {
      given_up_.insert(call->id);
      if (conn_ != nullptr && conn_->generation == call->generation) given_up_on = conn_;
    }
  }
  if (given_up_on != nullptr) EnsureReading(given_up_on);
  absl::MutexLock lock(&call->mu);
  if (!call->done) {
    return absl::DeadlineExceededError(
        absl::StrCat("no reply from lockd within ", absl::FormatDuration(timeout)));
  }
  if (!call->status.ok()) return call->status;
  return std::move(call->reply);
}

void AsioChannel::ReadFor(const Conn& conn, PendingCall& call,
                          std::chrono::steady_clock::time_point deadline) {
  while (!call.Done()) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    const timespec wait{.tv_sec = static_cast<time_t>(ns / 1'000'000'000),
                        .tv_nsec = static_cast<long>(ns % 1'000'000'000)};
    // ppoll's timeout is an interval on the monotonic clock.
    pollfd p{.fd = conn->fd, .events = POLLIN, .revents = 0};
    const int ready = ::ppoll(&p, 1, &wait, nullptr);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // the loop's deadline check decides
    bool drained = false;
    absl::Status s = ready < 0 ? absl::UnavailableError(absl::StrCat(
                                     "waiting for lockd failed: ", std::strerror(errno)))
                               : ReadOnce(*conn, &drained);
    if (!s.ok()) return Fail(conn, s);
  }
}

absl::Status AsioChannel::ReadOnce(Connection& conn, bool* drained) {
  *drained = false;
  if (conn.chunk.empty()) conn.chunk.resize(64 * 1024);
  ssize_t n;
  do {
    n = ::recv(conn.fd, conn.chunk.data(), conn.chunk.size(), MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    *drained = true;
    return absl::OkStatus();
  }
  if (n < 0) {
    return absl::UnavailableError(
        absl::StrCat("connection to lockd lost: ", std::strerror(errno)));
  }
  if (n == 0) return absl::UnavailableError("connection to lockd lost: End of file");
  conn.decoder.Feed(std::string_view(conn.chunk.data(), static_cast<size_t>(n)));
  return DeliverFrames(conn);
}

absl::Status AsioChannel::DeliverFrames(Connection& conn) {
  std::string payload;
  for (;;) {
    const auto result = conn.decoder.Next(&payload);
    if (result == protocol::FrameDecoder::Result::kNeedMore) return absl::OkStatus();
    wire::Response response;
    if (result == protocol::FrameDecoder::Result::kTooLarge ||
        !response.ParseFromString(payload)) {
      return absl::UnavailableError("lockd sent a frame that does not parse");
    }
    if (response.request_id() == 0 && response.code() != wire::OK) {
      // About the whole connection (refused at admission, a frame lockd could not parse):
      // every pending call fails with lockd's reason (kUnavailable, as for any lost
      // connection).
      return absl::UnavailableError(
          absl::StrCat("lockd closed the connection: ", response.message()));
    }
    Deliver(std::move(response));
  }
}

void AsioChannel::ReleaseReader(const Conn& conn) {
  bool arm = false;
  {
    absl::MutexLock lock(&mu_);
    conn->reader = Reader::kNone;
    // Replies are still due that this caller did not wait for: the I/O thread reads them.
    if (conn == conn_ && !conn->failed && RepliesDue()) arm = ArmLocked(conn);
  }
  if (arm) SpawnIoReader(conn);
}

void AsioChannel::EnsureReading(const Conn& conn) {
  bool arm = false;
  {
    absl::MutexLock lock(&mu_);
    // A caller reading hands on to the I/O thread when it stops, if anything is still due.
    if (conn == conn_ && !conn->failed && conn->reader != Reader::kCaller) arm = ArmLocked(conn);
  }
  if (arm) SpawnIoReader(conn);
}

void AsioChannel::SpawnIoReader(const Conn& conn) {
  // Started on the I/O thread: the socket's operations all begin there.
  asio::post(io_, [this, conn] { asio::co_spawn(io_, IoReadLoop(conn), asio::detached); });
}

bool AsioChannel::ArmLocked(const Conn& conn) {
  if (conn->io_armed) return false;
  conn->io_armed = true;
  return true;
}

awaitable<void> AsioChannel::IoReadLoop(Conn conn) {
  // Watched for as long as this loop runs, and no longer.
  struct Watching {
    Connection& conn;
    ~Watching() { conn.Unwatch(); }
  };
  asio::posix::stream_descriptor* watched = conn->Watch();
  Watching watching{*conn};
  if (!watched->is_open()) {
    {
      absl::MutexLock lock(&mu_);
      conn->io_armed = false;
    }
    Fail(conn, conn->WatchError());
    co_return;
  }
  boost::system::error_code ec;
  for (;;) {
    co_await watched->async_wait(asio::posix::stream_descriptor::wait_read,
                                 asio::redirect_error(use_awaitable, ec));
    bool read = false;
    {
      absl::MutexLock lock(&mu_);
      if (conn->failed || conn != conn_) {
        conn->io_armed = false;
      } else if (!ec && conn->reader == Reader::kCaller) {
        // A caller took over: it hands back when it stops, if replies are still due.
        conn->io_armed = false;
      } else if (!ec) {
        conn->reader = Reader::kIo;
        read = true;
      }
    }
    if (ec) {
      Fail(conn, absl::UnavailableError(absl::StrCat("connection to lockd lost: ", ec.message())));
      co_return;
    }
    if (!read) co_return;
    bool drained = false;
    absl::Status s = ReadOnce(*conn, &drained);
    if (!s.ok()) Fail(conn, s);
    {
      absl::MutexLock lock(&mu_);
      conn->reader = Reader::kNone;
      if (!s.ok() || conn->failed || conn != conn_ || !RepliesDue()) {
        conn->io_armed = false;
        co_return;
      }
    }
  }
}

awaitable<void> AsioChannel::TlsReadLoop(Conn conn) {
  std::string chunk(64 * 1024, '\0');
  boost::system::error_code ec;
  for (;;) {
    const size_t n = co_await conn->ReadSome(asio::buffer(chunk), ec);
    if (ec) {
      Fail(conn, absl::UnavailableError(absl::StrCat("connection to lockd lost: ", ec.message())));
      co_return;
    }
    conn->decoder.Feed(std::string_view(chunk.data(), n));
    if (absl::Status s = DeliverFrames(*conn); !s.ok()) {
      Fail(conn, s);
      co_return;
    }
  }
}

absl::StatusOr<uint64_t> AsioChannel::SendAsync(
    wire::Request request, absl::Duration timeout,
    std::function<void(absl::StatusOr<Reply>)> on_done) {
  auto call = std::make_shared<PendingCall>();
  call->on_done = std::move(on_done);
  auto id = Submit(request, call);
  if (!id.ok()) return id.status();
  {
    Conn conn;
    {
      absl::MutexLock lock(&mu_);
      conn = conn_;
    }
    if (conn != nullptr) EnsureReading(conn);  // nobody waits: the I/O thread reads its reply
  }
  asio::post(io_, [this, id = *id, timeout] {
    {
      absl::MutexLock lock(&mu_);
      if (!pending_.contains(id)) return;  // already answered or failed
    }
    auto timer = std::make_unique<asio::steady_timer>(io_);
    timer->expires_after(absl::ToChronoNanoseconds(timeout));
    timer->async_wait([this, id, timeout](boost::system::error_code ec) {
      if (!ec) Expire(id, timeout);
    });
    timers_[id] = std::move(timer);
  });
  return *id;
}

void AsioChannel::Expire(uint64_t id, absl::Duration timeout) {
  timers_.erase(id);
  std::shared_ptr<PendingCall> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;
    call = std::move(it->second);
    pending_.erase(it);
    given_up_.insert(id);  // a reply arriving from now on is unmatched
  }
  Finish(call, absl::DeadlineExceededError(
                   absl::StrCat("no reply from lockd within ", absl::FormatDuration(timeout))));
}

void AsioChannel::Finish(const std::shared_ptr<PendingCall>& call, absl::StatusOr<Reply> result) {
  if (call->on_done) {
    if (!OnIoThread()) {
      asio::post(io_, [this, call, result = std::move(result)]() mutable {
        Finish(call, std::move(result));
      });
      return;
    }
    timers_.erase(call->id);
    if (result.ok()) {
      absl::MutexLock lock(&call->mu);
      result->sent_at = call->reply.sent_at;
    }
    call->on_done(std::move(result));
    return;
  }
  {
    absl::MutexLock lock(&call->mu);
    if (result.ok()) {
      call->reply.response = std::move(result->response);
    } else {
      call->status = result.status();
    }
    call->done = true;
  }
  call->finished.Notify();
}

absl::StatusOr<uint64_t> AsioChannel::Post(wire::Request request) {
  return Submit(request, nullptr);
}

absl::StatusOr<uint64_t> AsioChannel::PostWithNext(wire::Request request) {
  return Submit(request, nullptr, /*with_next=*/true);
}

void AsioChannel::Deliver(wire::Response response) {
  std::shared_ptr<PendingCall> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(response.request_id());
    if (it != pending_.end()) {
      call = std::move(it->second);
      pending_.erase(it);
    } else {
      given_up_.erase(response.request_id());
    }
  }
  if (call != nullptr) return Finish(call, Reply{.response = std::move(response)});
  if (unmatched_) unmatched_(response);
}

void AsioChannel::Fail(const Conn& conn, const absl::Status& why) {
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> failed;
  {
    absl::MutexLock lock(&mu_);
    if (conn->failed) return;
    conn->failed = true;
    if (conn == conn_) {
      conn_.reset();
      connected_ = false;
      failed.swap(pending_);
      given_up_.clear();
    }
  }
  // Wakes a caller blocked reading it; the descriptor itself stays open while anyone holds the
  // connection.
  if (conn->fd >= 0) ::shutdown(conn->fd, SHUT_RDWR);
  asio::post(io_, [conn] {
    conn->CancelWaits();  // the I/O thread's waits end, and with them its references
  });
  for (auto& [id, call] : failed) Finish(call, why);
}

void AsioChannel::Close() {
  Conn conn;
  {
    absl::MutexLock lock(&mu_);
    conn = conn_;
  }
  if (conn != nullptr) Fail(conn, absl::UnavailableError("channel closed"));
  if (OnIoThread()) return;
  // The completions Fail handed to the I/O thread have run when this returns.
  std::promise<void> done;
  asio::post(io_, [&done] { done.set_value(); });
  done.get_future().wait();
}

}  // namespace

std::unique_ptr<Channel> Channel::Create(Clock* clock, std::shared_ptr<net::TlsContext> tls,
                                         std::string tls_server_name) {
  return std::make_unique<AsioChannel>(clock, std::move(tls), std::move(tls_server_name));
}

}  // namespace fencelock::client_internal
