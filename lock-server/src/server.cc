#include "lock-server/server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "fencelock/wire.pb.h"
#include "dispatch.h"
#include "durable_log.h"
#include "lock_service.h"
#include "metrics/metrics.h"
#include "storage.h"
#include "net/asio.h"
#include "protocol/codes.h"
#include "protocol/frame.h"
#include "protocol/version.h"

namespace fencelock::server {
namespace {

using asio::awaitable;
using asio::use_awaitable;
using Socket = asio::generic::stream_protocol::socket;

uint64_t ToMillis(absl::Duration d) { return static_cast<uint64_t>(absl::ToInt64Milliseconds(d)); }

// How long a connection that was told of a protocol error may keep sending before it is cut.
constexpr auto kErrorLinger = std::chrono::seconds(1);

class ServerImpl;

// One client connection: a read coroutine that dispatches requests, and a write coroutine
// that drains the outbox. Lives on the server's I/O thread only.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerImpl* server, Socket socket, uint64_t id, bool counted)
      : server_(server),
        socket_(std::move(socket)),
        linger_(socket_.get_executor()),
        hello_timer_(socket_.get_executor()),
        id_(id),
        counted_(counted) {}

  // Both coroutines take a strong reference as a parameter: a coroutine starts after
  // co_spawn returns, when the caller's reference may be gone.
  awaitable<void> ReadLoop(std::shared_ptr<Connection> self);
  // Replies go through the server, which holds them until what they reflect is durable.
  void Send(const wire::Response& response);
  // Sends `response`, then stops reading requests and closes once it is flushed.
  void SendAndClose(const wire::Response& response);
  // Writes an encoded frame now (the server decided it may go).
  void QueueFrame(const std::string& frame);
  void Close();
  // Closes the connection with HELLO_REQUIRED if no Hello arrived within `timeout`.
  void ExpectHelloWithin(absl::Duration timeout);
  uint64_t id() const { return id_; }
  // Whether it counts against max_connections (a connection refused at accept does not).
  bool counted() const { return counted_; }
  absl::flat_hash_set<WaiterId>& waiters() { return waiters_; }

  // Replies waiting for the WAL batch `batch` to be durable, oldest first.
  struct GatedReply {
    uint64_t batch;
    uint64_t request_id;
    std::string frame;
  };
  std::deque<GatedReply>& gated() { return gated_; }

 private:
  void Dispatch(const std::string& payload, MonoTime now);
  awaitable<void> WriteLoop(std::shared_ptr<Connection> self);

  ServerImpl* server_;
  Socket socket_;
  asio::steady_timer linger_;
  asio::steady_timer hello_timer_;
  uint64_t id_;
  bool counted_;
  std::string outbox_;
  bool writing_ = false;
  bool closing_ = false;
  bool closed_ = false;
  ConnectionState state_;
  absl::flat_hash_set<WaiterId> waiters_;
  std::deque<GatedReply> gated_;
};

class ServerImpl final : public Server, public DispatchHost {
 public:
  ServerImpl(const ServerOptions& options, Clock* clock, Recovered recovered)
      : options_(options),
        clock_(clock),
        service_(ServiceOptions{.default_session_ttl = options.default_session_ttl,
                                .default_lock_ttl = options.default_lock_ttl,
                                .min_ttl = options.min_ttl,
                                .max_ttl = options.max_ttl,
                                .max_wait = options.max_wait,
                                .max_locks_per_session = options.max_locks_per_session,
                                .max_waiters_per_lock = options.max_waiters_per_lock,
                                .on_fenced_out =
                                    [](const std::string& what) {
                                      std::fprintf(stderr, "lockd: %s\n", what.c_str());
                                    }},
                 std::move(recovered.state)),
        report_(std::move(recovered.report)),
        tcp_acceptor_(io_),
        unix_acceptor_(io_),
        timer_(io_),
        stall_timer_(io_) {}

  // Takes over the state directory (after recovery) and starts logging every record.
  absl::Status OpenLog();
  absl::Status Bind();
  uint16_t tcp_port() const override { return tcp_port_; }
  std::vector<std::string> recovery_summary() const override;
  int metrics_port() const override { return exposer_ ? exposer_->port() : 0; }
  absl::Status StartMetrics();
  void Run() override;
  void Shutdown() override {
    asio::post(io_, [this] { StopLocked(); });
  }

  // Called from connections, on the I/O thread.
  LockService& service() override { return service_; }
  const absl::Status* fault() const override {
    return log_->faulted() ? &log_->fault() : nullptr;
  }
  size_t max_sessions_per_connection() const override {
    return options_.max_sessions_per_connection;
  }
  Clock* clock() const { return clock_; }
  size_t max_frame_bytes() const { return options_.max_frame_bytes; }
  WaiterId NextWaiterId() override { return ++last_waiter_id_; }
  // Remembers where to push the answer to a queued acquire.
  void RouteWaiter(WaiterId id, const std::shared_ptr<Connection>& c, uint64_t request_id) {
    waiters_[id] = {c, request_id};
    c->waiters().insert(id);
  }
  void ConnectionGone(Connection* c);
  const ServerOptions& options() const { return options_; }
  // Extends every lease by the time lockd did not run, if that was longer than
  // options.stall_threshold. Called before anything that reads the clock for leases.
  void NoticeStall();
  // OK if the Unix-socket peer on `fd` is allowed (ServerOptions::allowed_uids).
  absl::Status CheckPeer(int fd) const;
  void CountProtocolError() override { ++protocol_errors_total_; }
  // Sends `response` on `c` once every record it may reflect is durable.
  void Reply(const std::shared_ptr<Connection>& c, const wire::Response& response);
  // Delivers settled waiter outcomes and re-arms the expiry timer. Call after every request.
  void AfterRequest();
  void FillStats(wire::StatsReply* stats) const override;

 private:
  void OnDurable(uint64_t batch);
  void ScheduleFlush();
  // Copies the server's figures into the metrics registry (every 250 ms).
  void ExportMetrics();
  awaitable<void> MetricsLoop();
  void OnFault(const absl::Status& status);
  template <typename Acceptor>
  awaitable<void> AcceptLoop(Acceptor& acceptor);
  awaitable<void> TimerLoop();
  // Wakes every quarter of the stall threshold, so that a gap longer than the threshold means
  // the I/O thread did not run.
  awaitable<void> StallWatch();
  void StopLocked();

  struct WaiterRoute {
    std::weak_ptr<Connection> connection;
    uint64_t request_id;
  };

  ServerOptions options_;
  Clock* clock_;
  LockService service_;
  RecoveryReport report_;
  asio::io_context io_{1};
  asio::ip::tcp::acceptor tcp_acceptor_;
  asio::local::stream_protocol::acceptor unix_acceptor_;
  asio::steady_timer timer_;
  asio::steady_timer stall_timer_;
  MonoTime last_alive_ = Clock::Real()->Now();  // the I/O thread last ran (real clock)
  uint64_t stalls_total_ = 0;
  MonoTime timer_armed_for_ = MonoTime::Max();
  uint16_t tcp_port_ = 0;
  bool stopping_ = false;
  uint64_t last_connection_id_ = 0;
  size_t counted_connections_ = 0;  // open connections that count against max_connections
  WaiterId last_waiter_id_ = 0;
  uint64_t protocol_errors_total_ = 0;
  bool flush_scheduled_ = false;
  absl::flat_hash_map<WaiterId, WaiterRoute> waiters_;
  absl::flat_hash_map<uint64_t, std::weak_ptr<Connection>> connections_;
  // Connections with replies waiting for a durable batch.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Connection>> gated_connections_;
  // Before log_: the log's writer reports sync times into it until the log is destroyed.
  std::shared_ptr<metrics::Registry> metrics_ = std::make_shared<metrics::Registry>();
  // Declared after io_: destroyed first, so its writer finishes while io_ still exists.
  std::unique_ptr<DurableLog> log_;
  std::unique_ptr<metrics::Exposer> exposer_;
  ServiceStats exported_;  // the totals already added to the counters
  uint64_t exported_protocol_errors_ = 0;
  uint64_t exported_stalls_ = 0;
  uint64_t exported_syncs_ = 0;
};

// ---- Connection ----

awaitable<void> Connection::ReadLoop(std::shared_ptr<Connection> self) {
  protocol::FrameDecoder decoder(server_->max_frame_bytes());
  std::string chunk(64 * 1024, '\0');
  std::string payload;
  boost::system::error_code ec;
  for (;;) {
    // Wait for readability, then read without blocking: unlike async_read_some, this makes no
    // speculative recv that would only return EAGAIN after every request.
    co_await socket_.async_wait(Socket::wait_read, asio::redirect_error(use_awaitable, ec));
    if (ec) break;
    const size_t n = socket_.read_some(asio::buffer(chunk), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
    if (ec) break;
    if (closing_) continue;  // drain and discard until the peer or the linger timer closes
    server_->NoticeStall();
    const MonoTime now = server_->clock()->Now();  // receipt time for every lease in this read
    decoder.Feed(std::string_view(chunk.data(), n));
    for (;;) {
      const auto result = decoder.Next(&payload);
      if (result == protocol::FrameDecoder::Result::kNeedMore) break;
      if (result == protocol::FrameDecoder::Result::kTooLarge) {
        server_->CountProtocolError();
        wire::Response r;
        r.set_code(wire::FRAME_TOO_LARGE);
        r.set_message(absl::StrCat("frame announces ", decoder.announced_length(),
                                   " bytes; the maximum is ", decoder.max_frame_bytes()));
        SendAndClose(r);
        break;
      }
      Dispatch(payload, now);
      if (closing_) break;
    }
    server_->AfterRequest();
  }
  Close();
}

void Connection::Send(const wire::Response& response) {
  if (!closed_) server_->Reply(shared_from_this(), response);
}

void Connection::QueueFrame(const std::string& frame) {
  if (closed_) return;
  if (!writing_ && outbox_.empty()) {
    // Most replies fit in the socket buffer: send at once, and only hand what is left to
    // the write coroutine.
    boost::system::error_code ec;
    const size_t sent = socket_.write_some(asio::buffer(frame), ec);
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      Close();
      return;
    }
    if (sent == frame.size()) return;
    outbox_.append(frame, sent, std::string::npos);
  } else {
    outbox_ += frame;
  }
  if (!writing_) {
    writing_ = true;
    asio::co_spawn(socket_.get_executor(), WriteLoop(shared_from_this()), asio::detached);
  }
}

void Connection::SendAndClose(const wire::Response& response) {
  Send(response);
  closing_ = true;
  linger_.expires_after(kErrorLinger);
  linger_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->Close();
  });
}

awaitable<void> Connection::WriteLoop(std::shared_ptr<Connection> self) {
  boost::system::error_code ec;
  while (!outbox_.empty() && !closed_) {
    std::string batch;
    batch.swap(outbox_);
    co_await asio::async_write(socket_, asio::buffer(batch), asio::redirect_error(use_awaitable, ec));
    if (ec) {
      Close();
      break;
    }
  }
  writing_ = false;
  if (closing_ && !closed_) {
    // Tell the peer we are done; the read loop drains until it closes or the linger ends.
    socket_.shutdown(Socket::shutdown_send, ec);
  }
}

void Connection::ExpectHelloWithin(absl::Duration timeout) {
  hello_timer_.expires_after(absl::ToChronoNanoseconds(timeout));
  hello_timer_.async_wait([self = shared_from_this(), timeout](boost::system::error_code ec) {
    if (ec || self->state_.hello_done || self->closing_ || self->closed_) return;
    self->server_->CountProtocolError();
    wire::Response r;
    r.set_code(wire::HELLO_REQUIRED);
    r.set_message(absl::StrCat("no Hello within ", absl::FormatDuration(timeout),
                               " of connecting (lockd --hello-timeout)"));
    self->SendAndClose(r);
  });
}

void Connection::Close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ec;
  linger_.cancel();
  hello_timer_.cancel();
  socket_.close(ec);
  server_->ConnectionGone(this);
}

void Connection::Dispatch(const std::string& payload, MonoTime now) {
  Dispatched d = server::Dispatch(payload, state_, *server_, now);
  switch (d.then) {
    case Dispatched::Then::kReply:
      Send(d.response);
      break;
    case Dispatched::Then::kReplyAndClose:
      SendAndClose(d.response);
      break;
    case Dispatched::Then::kQueued:
      server_->RouteWaiter(d.waiter, shared_from_this(), d.response.request_id());
      break;
  }
}

// ---- ServerImpl ----

absl::Status ServerImpl::Bind() {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options_.tcp_host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse listen address \"", options_.tcp_host, "\": ", ec.message()));
  }
  if (!address.is_loopback() && !options_.allow_remote) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address ", options_.tcp_host,
        " is not loopback: lockd would be reachable from other machines; pass --allow-remote "
        "to do that on purpose"));
  }
  asio::ip::tcp::endpoint endpoint(address, options_.tcp_port);
  tcp_acceptor_.open(endpoint.protocol(), ec);
  if (!ec) tcp_acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) tcp_acceptor_.bind(endpoint, ec);
  if (!ec) tcp_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen on tcp ", options_.tcp_host, ":",
                                               options_.tcp_port, ": ", ec.message()));
  }
  tcp_port_ = tcp_acceptor_.local_endpoint().port();

  if (!options_.unix_socket_path.empty()) {
    const std::string& path = options_.unix_socket_path;
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return absl::InvalidArgumentError(
            absl::StrCat("unix socket path ", path, " exists and is not a socket"));
      }
      // A socket file that nobody answers on is left over from a server that died.
      asio::local::stream_protocol::socket probe(io_);
      probe.connect(asio::local::stream_protocol::endpoint(path), ec);
      if (!ec) {
        return absl::UnavailableError(
            absl::StrCat("unix socket ", path, " is in use by another server"));
      }
      ::unlink(path.c_str());
    }
    asio::local::stream_protocol::endpoint unix_endpoint(path);
    unix_acceptor_.open(unix_endpoint.protocol(), ec);
    if (!ec) {
      // bind() creates the file with 0777 & ~umask: narrow the umask for that call so the
      // socket never exists with more permissions than asked for. lockd starts no thread
      // that creates files before it listens.
      const mode_t old_umask = ::umask(0777 & ~static_cast<mode_t>(options_.unix_socket_mode));
      unix_acceptor_.bind(unix_endpoint, ec);
      ::umask(old_umask);
    }
    if (!ec && ::chmod(path.c_str(), static_cast<mode_t>(options_.unix_socket_mode)) != 0) {
      ec.assign(errno, boost::system::system_category());
    }
    if (!ec && options_.unix_socket_gid >= 0 &&
        ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(options_.unix_socket_gid)) != 0) {
      ec.assign(errno, boost::system::system_category());
    }
    if (!ec) unix_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on unix socket ", path, ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

template <typename Acceptor>
awaitable<void> ServerImpl::AcceptLoop(Acceptor& acceptor) {
  boost::system::error_code ec;
  while (!stopping_) {
    typename Acceptor::protocol_type::socket socket(io_);
    co_await acceptor.async_accept(socket, asio::redirect_error(use_awaitable, ec));
    if (stopping_) break;
    if (ec) {
      if (ec == asio::error::operation_aborted) break;
      std::fprintf(stderr, "lockd: accept failed: %s\n", ec.message().c_str());
      continue;
    }
    if constexpr (std::is_same_v<typename Acceptor::protocol_type, asio::ip::tcp>) {
      socket.set_option(asio::ip::tcp::no_delay(true), ec);
    }
    const uint64_t id = ++last_connection_id_;
    socket.non_blocking(true, ec);  // the reads and first writes above must never block
    // Admission: a refused peer gets one error frame and is closed; nobody else notices.
    absl::Status refused;
    if constexpr (std::is_same_v<typename Acceptor::protocol_type, asio::local::stream_protocol>) {
      refused = CheckPeer(socket.native_handle());
    }
    if (refused.ok() && counted_connections_ >= options_.max_connections) {
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "lockd already serves ", counted_connections_,
          " connections, the most it may (lockd --max-connections=", options_.max_connections, ")"));
    }
    auto connection =
        std::make_shared<Connection>(this, Socket(std::move(socket)), id, refused.ok());
    connections_[id] = connection;
    asio::co_spawn(io_, connection->ReadLoop(connection), asio::detached);
    if (!refused.ok()) {
      std::fprintf(stderr, "lockd: refused connection %lu: %s\n", static_cast<unsigned long>(id),
                   std::string(refused.message()).c_str());
      wire::Response r;
      r.set_code(protocol::CodeFromStatus(refused));
      r.set_message(std::string(refused.message()));
      connection->SendAndClose(r);
      continue;
    }
    ++counted_connections_;
    connection->ExpectHelloWithin(options_.hello_timeout);
  }
}

awaitable<void> ServerImpl::TimerLoop() {
  boost::system::error_code ec;
  while (!stopping_) {
    const MonoTime next = service_.NextDeadline();
    timer_armed_for_ = next;
    if (next == MonoTime::Max()) {
      timer_.expires_after(std::chrono::hours(24));
    } else {
      const absl::Duration wait = std::max(next - clock_->Now(), absl::ZeroDuration());
      timer_.expires_after(absl::ToChronoNanoseconds(wait));
    }
    co_await timer_.async_wait(asio::redirect_error(use_awaitable, ec));
    if (stopping_) break;
    if (log_->faulted()) continue;  // no mutations, expiries included, after a disk fault
    NoticeStall();
    service_.Advance(clock_->Now());
    AfterRequest();
  }
}

awaitable<void> ServerImpl::StallWatch() {
  boost::system::error_code ec;
  while (!stopping_) {
    stall_timer_.expires_after(absl::ToChronoNanoseconds(options_.stall_threshold / 4));
    co_await stall_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
    if (stopping_) break;
    NoticeStall();
  }
}

void ServerImpl::NoticeStall() {
  if (options_.stall_threshold <= absl::ZeroDuration()) return;
  const MonoTime now = Clock::Real()->Now();
  const absl::Duration gap = now - last_alive_;
  last_alive_ = now;
  if (gap <= options_.stall_threshold) return;
  ++stalls_total_;
  service_.PostponeLeases(gap);
  if (timer_armed_for_ != MonoTime::Max()) timer_.cancel();  // re-arm for the later expiries
  std::fprintf(stderr,
               "lockd: did not run for %s (frozen, suspended or starved of CPU); every session "
               "and lock lease is extended by that much\n",
               absl::FormatDuration(gap).c_str());
}

void ServerImpl::ScheduleFlush() {
  // Flushing from a task posted behind the handlers that are already ready lets every request
  // that arrived together join one batch.
  if (flush_scheduled_) return;
  flush_scheduled_ = true;
  asio::post(io_, [this] {
    flush_scheduled_ = false;
    log_->Flush();
  });
}

void ServerImpl::AfterRequest() {
  for (WaiterOutcome& o : service_.TakeWaiterOutcomes()) {
    auto it = waiters_.find(o.waiter);
    if (it == waiters_.end()) continue;
    WaiterRoute route = it->second;
    waiters_.erase(it);
    auto connection = route.connection.lock();
    if (connection == nullptr) continue;
    connection->waiters().erase(o.waiter);
    wire::Response resp;
    resp.set_request_id(route.request_id);
    resp.set_code(protocol::CodeFromStatus(o.status));
    if (o.status.ok()) {
      auto* reply = resp.mutable_acquire();
      reply->set_granted(true);
      reply->set_token(o.token);
      reply->set_ttl_ms(ToMillis(o.ttl));
      reply->set_lock(o.lock);
    } else {
      resp.set_message(std::string(o.status.message()));
    }
    connection->Send(resp);
  }
  ScheduleFlush();
  if (service_.NextDeadline() < timer_armed_for_) timer_.cancel();
}

void ServerImpl::Reply(const std::shared_ptr<Connection>& c, const wire::Response& response) {
  std::string frame;
  if (!protocol::AppendFrame(response.SerializeAsString(), &frame, options_.max_frame_bytes)
           .ok()) {
    wire::Response too_big;
    too_big.set_request_id(response.request_id());
    too_big.set_code(wire::UNAVAILABLE);
    too_big.set_message("reply exceeds the maximum frame size");
    frame.clear();
    (void)protocol::AppendFrame(too_big.SerializeAsString(), &frame);
  }
  // Every reply may reflect any record applied so far (a grant, a release another client
  // made, an expiry), so it waits for the newest batch. After a fault nothing becomes durable
  // again; replies then carry no mutation and go at once.
  const uint64_t batch = log_->newest_batch();
  if (log_->faulted() || batch <= log_->durable_batch()) {
    c->QueueFrame(frame);
    return;
  }
  c->gated().push_back({batch, response.request_id(), std::move(frame)});
  gated_connections_[c->id()] = c;
}

void ServerImpl::OnDurable(uint64_t batch) {
  for (auto it = gated_connections_.begin(); it != gated_connections_.end();) {
    auto& queue = it->second->gated();
    // Everything this batch releases for one connection goes out in one write.
    std::string frames;
    while (!queue.empty() && queue.front().batch <= batch) {
      frames += queue.front().frame;
      queue.pop_front();
    }
    if (!frames.empty()) it->second->QueueFrame(frames);
    if (queue.empty()) {
      gated_connections_.erase(it++);
    } else {
      ++it;
    }
  }
}

void ServerImpl::OnFault(const absl::Status& status) {
  const std::string message =
      absl::StrCat("lockd could not make this durable (", status.message(),
                   ") and stopped taking requests; restart it once the disk is fixed");
  // Nothing held back was made durable: none of it may be acknowledged.
  for (auto& [id, connection] : gated_connections_) {
    for (const auto& held : connection->gated()) {
      wire::Response r;
      r.set_request_id(held.request_id);
      r.set_code(wire::UNAVAILABLE);
      r.set_message(message);
      std::string frame;
      (void)protocol::AppendFrame(r.SerializeAsString(), &frame);
      connection->QueueFrame(frame);
    }
    connection->gated().clear();
  }
  gated_connections_.clear();
  service_.FailAllWaiters(absl::UnavailableError(message));
  AfterRequest();
}

std::vector<std::string> ServerImpl::recovery_summary() const {
  std::vector<std::string> lines = {
      absl::StrCat("restored ", service_.state().session_count(), " sessions and ",
                   service_.state().held_lock_count(), " held locks from ", options_.data_dir,
                   " (snapshot lsn ", report_.snapshot_lsn, ", ", report_.records_replayed,
                   " records replayed, last lsn ", report_.last_lsn, ")"),
      absl::StrCat("next token above ", report_.token_floor, ", next session id above ",
                   report_.session_floor)};
  for (const std::string& w : report_.warnings) lines.push_back("warning: " + w);
  return lines;
}

absl::Status ServerImpl::StartMetrics() {
  if (options_.metrics_port < 0) return absl::OkStatus();
  auto exposer = metrics::Exposer::Start(options_.metrics_host, options_.metrics_port, metrics_);
  if (!exposer.ok()) return exposer.status();
  exposer_ = std::move(*exposer);
  ExportMetrics();
  return absl::OkStatus();
}

void ServerImpl::ExportMetrics() {
  auto& m = *metrics_;
  const ServiceStats& s = service_.stats();
  auto add = [&](const char* name, const char* help, uint64_t now, uint64_t& before) {
    m.GetCounter(name, help).Increment(static_cast<double>(now - before));
    before = now;
  };
  add("lock_fenced_out_total", "Requests that presented a stale token (fence 1); must be zero",
      s.fenced_out_total, exported_.fenced_out_total);
  add("lockd_grants_total", "Locks granted", s.grants_total, exported_.grants_total);
  add("lockd_session_expiries_total", "Sessions that expired on lockd's clock",
      s.session_expiries_total, exported_.session_expiries_total);
  add("lockd_lock_expiries_total", "Lock leases that expired on lockd's clock",
      s.lock_expiries_total, exported_.lock_expiries_total);
  add("lockd_protocol_errors_total", "Connections closed for malformed or refused input",
      protocol_errors_total_, exported_protocol_errors_);
  add("lockd_stalls_total", "Times lockd did not run for longer than --stall-threshold (leases extended)",
      stalls_total_, exported_stalls_);
  const DurableLogStats log = log_->stats();
  add("lockd_log_syncs_total", "WAL batches written and fdatasynced", log.syncs, exported_syncs_);
  m.GetGauge("lockd_sessions", "Open sessions").Set(static_cast<double>(service_.state().session_count()));
  m.GetGauge("lockd_locks_held", "Held locks").Set(static_cast<double>(service_.state().held_lock_count()));
  m.GetGauge("lockd_waiters", "Queued acquires").Set(static_cast<double>(service_.waiter_count()));
  m.GetGauge("lockd_last_token", "The newest fencing token issued")
      .Set(static_cast<double>(service_.state().last_token()));
  m.GetGauge("lockd_disk_fault", "1 after a failed write or sync: lockd refuses mutations until restarted")
      .Set(log_->faulted() ? 1.0 : 0.0);
}

awaitable<void> ServerImpl::MetricsLoop() {
  asio::steady_timer timer(io_);
  boost::system::error_code ec;
  while (!stopping_) {
    timer.expires_after(std::chrono::milliseconds(250));
    co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
    if (stopping_) break;
    ExportMetrics();
  }
}

absl::Status ServerImpl::OpenLog() {
  metrics::Histogram& sync_latency = metrics_->GetHistogram(
      "lockd_log_sync_seconds", "Duration of one WAL batch write + fdatasync",
      metrics::LatencyBuckets());
  DurableLogOptions log_options{options_.env, options_.data_dir, options_.wal_segment_bytes,
                                options_.reservation_block};
  log_options.on_sync = [&sync_latency](int64_t ns) { sync_latency.Observe(ns / 1e9); };
  auto log = DurableLog::Open(log_options,
      report_, [this](std::function<void()> f) { asio::post(io_, std::move(f)); });
  if (!log.ok()) return log.status();
  log_ = std::move(*log);
  log_->set_on_durable([this](uint64_t batch) { OnDurable(batch); });
  log_->set_on_fault([this](const absl::Status& s) { OnFault(s); });
  log_->set_on_snapshot_due([this] { log_->Snapshot(service_.state()); });
  service_.set_record_observer([this](const Record& r) {
    // A reservation covering every id handed out goes to disk before the batch that holds
    // the record, so a restart never reissues a token or session id, even if that batch is
    // lost.
    if (std::holds_alternative<record::LockGranted>(r) ||
        std::holds_alternative<record::SessionOpened>(r)) {
      log_->ReserveFor(service_.state().last_token(), service_.state().last_session_id());
    }
    log_->Append(r);
  });
  return absl::OkStatus();
}

absl::Status ServerImpl::CheckPeer(int fd) const {
  if (options_.allowed_uids.empty()) return absl::OkStatus();
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read the peer's credentials: ", std::strerror(errno)));
  }
  for (uint32_t uid : options_.allowed_uids) {
    if (peer.uid == uid) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "user id ", peer.uid, " (pid ", peer.pid, ") may not use lockd on this socket; allowed: ",
      absl::StrJoin(options_.allowed_uids, ","), " (lockd --allowed-uids)"));
}

void ServerImpl::ConnectionGone(Connection* c) {
  if (c->counted()) --counted_connections_;
  for (WaiterId id : c->waiters()) {
    service_.CancelWaiter(id);
    waiters_.erase(id);
  }
  c->waiters().clear();
  connections_.erase(c->id());
}

void ServerImpl::FillStats(wire::StatsReply* stats) const {
  const ServiceStats& s = service_.stats();
  stats->set_sessions(service_.state().session_count());
  stats->set_locks_held(service_.state().held_lock_count());
  stats->set_waiters(service_.waiter_count());
  stats->set_grants_total(s.grants_total);
  stats->set_fenced_out_total(s.fenced_out_total);
  stats->set_session_expiries_total(s.session_expiries_total);
  stats->set_lock_expiries_total(s.lock_expiries_total);
  stats->set_last_token(service_.state().last_token());
  stats->set_protocol_errors_total(protocol_errors_total_);
  const DurableLogStats log = log_->stats();
  stats->set_log_syncs_total(log.syncs);
  stats->set_log_records_total(log.records);
  stats->set_log_bytes_total(log.bytes);
  stats->set_wal_segment(log.segment);
  stats->set_snapshots_total(log.snapshots);
  stats->set_last_lsn(log_->last_lsn());
  stats->set_log_sync_ns_total(static_cast<uint64_t>(log.total_sync_ns));
  if (log_->faulted()) stats->set_disk_fault(log_->fault().ToString());
}

void ServerImpl::Run() {
  asio::co_spawn(io_, AcceptLoop(tcp_acceptor_), asio::detached);
  if (unix_acceptor_.is_open()) asio::co_spawn(io_, AcceptLoop(unix_acceptor_), asio::detached);
  asio::co_spawn(io_, TimerLoop(), asio::detached);
  if (options_.stall_threshold > absl::ZeroDuration()) {
    last_alive_ = Clock::Real()->Now();
    asio::co_spawn(io_, StallWatch(), asio::detached);
  }
  if (exposer_) asio::co_spawn(io_, MetricsLoop(), asio::detached);
  io_.run();
  if (!options_.unix_socket_path.empty()) ::unlink(options_.unix_socket_path.c_str());
}

void ServerImpl::StopLocked() {
  if (stopping_) return;
  stopping_ = true;
  boost::system::error_code ec;
  tcp_acceptor_.close(ec);
  unix_acceptor_.close(ec);
  timer_.cancel();
  stall_timer_.cancel();
  ExportMetrics();
  std::vector<std::shared_ptr<Connection>> open;
  for (auto& [id, weak] : connections_) {
    if (auto c = weak.lock()) open.push_back(std::move(c));
  }
  for (auto& c : open) c->Close();
  io_.stop();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  if (options.min_ttl <= absl::ZeroDuration() || options.min_ttl > options.max_ttl) {
    return absl::InvalidArgumentError("min_ttl must be positive and not above max_ttl");
  }
  for (absl::Duration d : {options.default_session_ttl, options.default_lock_ttl}) {
    if (d < options.min_ttl || d > options.max_ttl) {
      return absl::InvalidArgumentError(absl::StrCat(
          "default TTL ", absl::FormatDuration(d), " is outside [",
          absl::FormatDuration(options.min_ttl), ", ", absl::FormatDuration(options.max_ttl), "]"));
    }
  }
  if (options.max_frame_bytes < 64) {
    return absl::InvalidArgumentError("max_frame_bytes must be at least 64");
  }
  for (auto [name, value] : {std::pair{"max connections", options.max_connections},
                             std::pair{"max sessions per connection", options.max_sessions_per_connection},
                             std::pair{"max locks per session", options.max_locks_per_session},
                             std::pair{"max waiters per lock", options.max_waiters_per_lock}}) {
    if (value == 0) return absl::InvalidArgumentError(absl::StrCat(name, " must be at least 1"));
  }
  if (options.hello_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the Hello timeout must be positive");
  }
  if (options.unix_socket_mode > 0777) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unix socket mode %o is not a permission mode (0 to 0777)", options.unix_socket_mode));
  }
  if (options.data_dir.empty()) {
    return absl::InvalidArgumentError("a state directory is required (--data-dir)");
  }
  if (options.wal_segment_bytes < 4096 || options.reservation_block == 0) {
    return absl::InvalidArgumentError(
        "WAL segments must be at least 4096 bytes and reservations at least 1");
  }
  ServerOptions resolved = options;
  if (resolved.env == nullptr) resolved.env = Env::Posix();
  Clock* clock = options.clock != nullptr ? options.clock : Clock::Real();
  // Restore before anything listens: a directory we cannot trust is never served from.
  auto recovered = Recover(resolved.env, resolved.data_dir, clock->Now());
  if (!recovered.ok()) return recovered.status();
  auto server = std::make_unique<ServerImpl>(resolved, clock, std::move(*recovered));
  if (absl::Status s = server->OpenLog(); !s.ok()) return s;
  absl::Status bound = server->Bind();
  if (!bound.ok()) return bound;
  if (absl::Status s = server->StartMetrics(); !s.ok()) return s;
  return server;
}

}  // namespace fencelock::server
