#include "channel.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <charconv>
#include <future>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "clock/monotonic_event.h"
#include "net/asio.h"
#include "net/asio_ssl.h"
#include "protocol/codes.h"
#include "protocol/frame.h"
#include "protocol/version.h"

namespace fencelock::client_internal {

struct PendingCall {
  uint64_t id = 0;  // the request id, set by Submit before the call is registered
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  Reply reply ABSL_GUARDED_BY(mu);
  // Set once `done` is: the caller waits on it, not on `mu`, so that a wall-clock step does not
  // change how long it waits (Debian Abseil's timed waits are on the wall clock).
  MonotonicEvent finished;
  // SendAsync's callback, called on the I/O thread instead of anyone waiting.
  std::function<void(absl::StatusOr<Reply>)> on_done;
};

namespace {

using asio::awaitable;
using asio::use_awaitable;
using Socket = asio::generic::stream_protocol::socket;
using Endpoint = asio::generic::stream_protocol::endpoint;

// One connection's socket, and the TLS session over it when there is one: all bytes go
// through `tls` then.
struct Connection {
  explicit Connection(asio::io_context& io) : socket(io) {}
  Socket socket;
  std::unique_ptr<asio::ssl::stream<Socket&>> tls;

  template <typename Buffer>
  awaitable<size_t> ReadSome(const Buffer& buffer, boost::system::error_code& ec) {
    if (tls) co_return co_await tls->async_read_some(buffer, asio::redirect_error(use_awaitable, ec));
    co_return co_await socket.async_read_some(buffer, asio::redirect_error(use_awaitable, ec));
  }
  template <typename Buffer>
  awaitable<void> WriteAll(const Buffer& buffer, boost::system::error_code& ec) {
    if (tls) {
      co_await asio::async_write(*tls, buffer, asio::redirect_error(use_awaitable, ec));
    } else {
      co_await asio::async_write(socket, buffer, asio::redirect_error(use_awaitable, ec));
    }
  }
};


absl::StatusOr<Endpoint> ResolveAddress(asio::io_context& io, const std::string& address) {
  if (address.rfind("unix:", 0) == 0) {
    const std::string path = address.substr(5);
    if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad unix socket path in \"", address, "\""));
    }
    return Endpoint(asio::local::stream_protocol::endpoint(path));
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server address \"", address, "\" is neither host:port nor unix:/path"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = address.substr(colon + 1);
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad port \"", port_text, "\" in server address \"", address, "\""));
  }
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
  bool connected() const override {
    absl::MutexLock lock(&mu_);
    return connected_;
  }
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
  // Registers a pending call (or none, for Post) and queues its frame. Returns the id, or an
  // error if not connected or the request is too large.
  absl::StatusOr<uint64_t> Submit(wire::Request& request, std::shared_ptr<PendingCall> call);
  // I/O thread only.
  void Enqueue(std::string frame, uint64_t id, uint64_t generation);
  awaitable<void> WriteLoop(std::shared_ptr<Connection> connection, uint64_t generation);
  awaitable<void> ReadLoop(std::shared_ptr<Connection> connection, uint64_t generation);
  void FailConnection(uint64_t generation, const absl::Status& why);
  void Deliver(wire::Response response);
  // Completes `call` with `result`: its callback, or whoever awaits it.
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
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> pending_ ABSL_GUARDED_BY(mu_);

  // I/O thread only.
  std::shared_ptr<Connection> socket_;
  uint64_t socket_generation_ = 0;
  std::string outbox_;
  std::vector<uint64_t> outbox_ids_;
  bool writing_ = false;
  // The timeouts of SendAsync calls, by request id (a fired or cancelled one is erased).
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

  uint64_t generation;
  {
    absl::MutexLock lock(&mu_);
    generation = ++generation_;
  }
  const bool use_tls = tls_ != nullptr && address.rfind("unix:", 0) != 0;
  const std::string server_name = tls_server_name_.empty() ? net::ServerNameOf(address) : tls_server_name_;
  // The connect's (and the TLS handshake's) outcome: empty when connected.
  auto connected = std::make_shared<std::promise<std::string>>();
  auto result = connected->get_future();
  asio::post(io_, [this, generation, ep = *endpoint, connected, use_tls, server_name] {
    socket_ = std::make_shared<Connection>(io_);
    socket_generation_ = generation;
    outbox_.clear();
    outbox_ids_.clear();
    auto connection = socket_;
    connection->socket.async_connect(ep, [this, connection, connected, use_tls, server_name](
                                             boost::system::error_code ec) {
      if (ec) return connected->set_value(ec.message());
      if (!use_tls) return connected->set_value("");
      connection->tls = std::make_unique<asio::ssl::stream<Socket&>>(connection->socket,
                                                                     *tls_context_);
      if (absl::Status s = net::ExpectServerName(connection->tls->native_handle(), server_name);
          !s.ok()) {
        return connected->set_value(std::string(s.message()));
      }
      connection->tls->async_handshake(
          asio::ssl::stream_base::client, [connected](boost::system::error_code ec) {
            connected->set_value(ec ? absl::StrCat("TLS handshake failed: ", ec.message()) : "");
          });
    });
  });
  if (result.wait_for(absl::ToChronoNanoseconds(timeout)) != std::future_status::ready) {
    asio::post(io_, [this, generation] {
      FailConnection(generation, absl::UnavailableError("connect timed out"));
    });
    return absl::UnavailableError(absl::StrCat("cannot connect to lockd at ", address,
                                               ": no answer within ",
                                               absl::FormatDuration(timeout)));
  }
  if (std::string error = result.get(); !error.empty()) {
    asio::post(io_, [this, generation] {
      FailConnection(generation, absl::UnavailableError("connect failed"));
    });
    return absl::UnavailableError(absl::StrCat("cannot connect to lockd at ", address, ": ", error));
  }
  asio::post(io_, [this, generation] {
    if (generation != socket_generation_) return;
    boost::system::error_code ec;
    if (socket_->socket.local_endpoint(ec).protocol().family() != AF_UNIX) {
      socket_->socket.set_option(asio::ip::tcp::no_delay(true), ec);
    }
    asio::co_spawn(io_, ReadLoop(socket_, generation), asio::detached);
  });
  {
    absl::MutexLock lock(&mu_);
    if (generation_ != generation) return absl::UnavailableError("connection replaced");
    connected_ = true;
  }

  wire::Request hello;
  hello.mutable_hello()->set_min_version(protocol::kMinProtocolVersion);
  hello.mutable_hello()->set_max_version(protocol::kMaxProtocolVersion);
  hello.mutable_hello()->set_client_name(client_name);
  auto reply = Call(std::move(hello), std::max(give_up - clock_->Now(), absl::Milliseconds(1)));
  absl::Status status = reply.ok() ? protocol::StatusFromCode(reply->response.code(),
                                                              reply->response.message())
                                   : reply.status();
  if (!status.ok()) {
    Close();
    if (reply.ok() && reply->response.code() == wire::NOT_LEADER && leader != nullptr) {
      *leader = reply->response.hello().leader();
    }
    return absl::Status(status.code(),
                        absl::StrCat("lockd at ", address, " refused Hello: ", status.message()));
  }
  absl::MutexLock lock(&mu_);
  version_ = reply->response.hello().version();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> AsioChannel::Submit(wire::Request& request,
                                             std::shared_ptr<PendingCall> call) {
  uint64_t id, generation;
  {
    absl::MutexLock lock(&mu_);
    if (!connected_) return absl::UnavailableError("not connected to lockd");
    id = ++next_request_id_;
    generation = generation_;
    request.set_request_id(id);
    if (call != nullptr) {
      call->id = id;  // before the call is published: the I/O thread may finish it at once
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
  asio::post(io_, [this, frame = std::move(frame), id, generation]() mutable {
    Enqueue(std::move(frame), id, generation);
  });
  return id;
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
  call->finished.WaitFor(timeout);
  {
    absl::MutexLock lock(&mu_);
    pending_.erase(call->id);  // a reply arriving from now on is unmatched
  }
  absl::MutexLock lock(&call->mu);
  if (!call->done) {
    return absl::DeadlineExceededError(
        absl::StrCat("no reply from lockd within ", absl::FormatDuration(timeout)));
  }
  if (!call->status.ok()) return call->status;
  return std::move(call->reply);
}

absl::StatusOr<uint64_t> AsioChannel::SendAsync(
    wire::Request request, absl::Duration timeout,
    std::function<void(absl::StatusOr<Reply>)> on_done) {
  auto call = std::make_shared<PendingCall>();
  call->on_done = std::move(on_done);
  auto id = Submit(request, call);
  if (!id.ok()) return id.status();
  // Posted after the frame's Enqueue, so the timer is armed before any reply can be read.
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
    pending_.erase(it);  // a reply arriving from now on is unmatched
  }
  Finish(call, absl::DeadlineExceededError(
                   absl::StrCat("no reply from lockd within ", absl::FormatDuration(timeout))));
}

void AsioChannel::Finish(const std::shared_ptr<PendingCall>& call, absl::StatusOr<Reply> result) {
  if (call->on_done) {
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

void AsioChannel::Enqueue(std::string frame, uint64_t id, uint64_t generation) {
  if (generation != socket_generation_ || socket_ == nullptr) return;
  outbox_.append(frame);
  outbox_ids_.push_back(id);
  if (!writing_) {
    writing_ = true;
    asio::co_spawn(io_, WriteLoop(socket_, generation), asio::detached);
  }
}

awaitable<void> AsioChannel::WriteLoop(std::shared_ptr<Connection> connection,
                                       uint64_t generation) {
  boost::system::error_code ec;
  while (!outbox_.empty() && generation == socket_generation_) {
    std::string batch;
    std::vector<uint64_t> ids;
    batch.swap(outbox_);
    ids.swap(outbox_ids_);
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
    co_await connection->WriteAll(asio::buffer(batch), ec);
    if (ec) {
      FailConnection(generation, absl::UnavailableError(
                                     absl::StrCat("write to lockd failed: ", ec.message())));
      break;
    }
  }
  if (generation == socket_generation_) writing_ = false;
}

awaitable<void> AsioChannel::ReadLoop(std::shared_ptr<Connection> connection,
                                      uint64_t generation) {
  protocol::FrameDecoder decoder;
  std::string chunk(64 * 1024, '\0');
  std::string payload;
  boost::system::error_code ec;
  for (;;) {
    const size_t n = co_await connection->ReadSome(asio::buffer(chunk), ec);
    if (ec) {
      FailConnection(generation, absl::UnavailableError(
                                     absl::StrCat("connection to lockd lost: ", ec.message())));
      co_return;
    }
    decoder.Feed(std::string_view(chunk.data(), n));
    for (;;) {
      const auto result = decoder.Next(&payload);
      if (result == protocol::FrameDecoder::Result::kNeedMore) break;
      wire::Response response;
      if (result == protocol::FrameDecoder::Result::kTooLarge ||
          !response.ParseFromString(payload)) {
        FailConnection(generation,
                       absl::UnavailableError("lockd sent a frame that does not parse"));
        co_return;
      }
      if (response.request_id() == 0 && response.code() != wire::OK) {
        // About the whole connection (refused at admission, a frame lockd could not parse):
        // every pending call fails with lockd's reason (kUnavailable, as for any lost
        // connection).
        FailConnection(generation, absl::UnavailableError(absl::StrCat(
                                       "lockd closed the connection: ", response.message())));
        co_return;
      }
      Deliver(std::move(response));
    }
  }
}

void AsioChannel::Deliver(wire::Response response) {
  std::shared_ptr<PendingCall> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(response.request_id());
    if (it != pending_.end()) {
      call = std::move(it->second);
      pending_.erase(it);
    }
  }
  if (call == nullptr) {
    if (unmatched_) unmatched_(response);
    return;
  }
  Finish(call, Reply{.response = std::move(response)});
}

void AsioChannel::FailConnection(uint64_t generation, const absl::Status& why) {
  if (generation != socket_generation_ || socket_ == nullptr) return;
  boost::system::error_code ec;
  socket_->socket.close(ec);
  socket_.reset();
  outbox_.clear();
  outbox_ids_.clear();
  writing_ = false;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> failed;
  {
    absl::MutexLock lock(&mu_);
    if (generation_ == generation) connected_ = false;
    failed.swap(pending_);
  }
  for (auto& [id, call] : failed) Finish(call, why);
}

void AsioChannel::Close() {
  if (std::this_thread::get_id() == thread_.get_id()) {
    FailConnection(socket_generation_, absl::UnavailableError("channel closed"));
    return;
  }
  std::promise<void> done;
  asio::post(io_, [this, &done] {
    FailConnection(socket_generation_, absl::UnavailableError("channel closed"));
    done.set_value();
  });
  done.get_future().wait();
  absl::MutexLock lock(&mu_);
  connected_ = false;
}

}  // namespace

std::unique_ptr<Channel> Channel::Create(Clock* clock, std::shared_ptr<net::TlsContext> tls,
                                         std::string tls_server_name) {
  return std::make_unique<AsioChannel>(clock, std::move(tls), std::move(tls_server_name));
}

}  // namespace fencelock::client_internal
