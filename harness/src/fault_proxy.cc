#include "harness/fault_proxy.h"

#include <atomic>
#include <future>
#include <chrono>
#include <deque>
#include <list>
#include <string>
#include <thread>

#include "net/asio.h"

namespace fencelock::harness {

using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;

namespace {
constexpr int kDirections = 2;
int Index(FaultProxy::Direction d) { return d == FaultProxy::Direction::kToServer ? 0 : 1; }
}  // namespace

class FaultProxy::Impl {
 public:
  struct Pipe {  // one direction of one proxied connection
    std::string outbox;
    std::string held;
    bool writing = false;
    // Chunks read under a delay, each with the time it may go on: a latency, so that reading
    // goes on meanwhile and a busy connection is not throttled to a chunk per delay.
    std::deque<std::pair<std::chrono::steady_clock::time_point, std::string>> delayed;
    bool delaying = false;
  };
  struct Link : std::enable_shared_from_this<Link> {
    Link(tcp::socket c, tcp::socket s) : client(std::move(c)), server(std::move(s)) {}
    tcp::socket client;
    tcp::socket server;
    Pipe pipes[kDirections];  // [0]: to server, [1]: to client
    bool closed = false;
    void Close() {
      if (closed) return;
      closed = true;
      boost::system::error_code ec;
      client.close(ec);
      server.close(ec);
    }
  };

  explicit Impl(int target_port)
      : target_port_(target_port), acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(io_, AcceptLoop(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~Impl() {
    asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      CutAllOnIo();
    });
    io_.stop();
    thread_.join();
  }

  int port() const { return port_; }

  template <typename F>
  void RunOnIo(F f) {
    std::promise<void> done;
    asio::post(io_, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }

  void Set(int dir, Mode mode) {
    RunOnIo([&] { modes_[dir] = mode; });
  }
  void SetDelay(int dir, absl::Duration delay) {
    RunOnIo([&] { delays_[dir] = delay; });
  }
  void Release(int dir) {
    RunOnIo([&] {
      modes_[dir] = Mode::kPass;
      for (auto& weak : links_) {
        auto link = weak.lock();
        if (!link) continue;
        Pipe& pipe = link->pipes[dir];
        held_[dir] -= pipe.held.size();
        pipe.outbox += pipe.held;
        pipe.held.clear();
        StartWriter(link, dir);
      }
    });
  }
  void CutAll() {
    RunOnIo([&] { CutAllOnIo(); });
  }
  uint64_t bytes_read(int dir) const { return read_[dir].load(); }
  uint64_t bytes_held(int dir) const { return held_[dir].load(); }

 private:
  void CutAllOnIo() {
    for (auto& weak : links_) {
      if (auto link = weak.lock()) link->Close();
    }
    links_.clear();
  }

  awaitable<void> AcceptLoop() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket client(io_);
      co_await acceptor_.async_accept(client, asio::redirect_error(use_awaitable, ec));
      if (ec) co_return;
      tcp::socket server(io_);
      co_await server.async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"),
                                                  static_cast<uint16_t>(target_port_)),
                                    asio::redirect_error(use_awaitable, ec));
      if (ec) continue;
      client.set_option(tcp::no_delay(true), ec);
      server.set_option(tcp::no_delay(true), ec);
      auto link = std::make_shared<Link>(std::move(client), std::move(server));
      links_.push_back(link);
      asio::co_spawn(io_, Pump(link, 0), asio::detached);
      asio::co_spawn(io_, Pump(link, 1), asio::detached);
    }
  }

  awaitable<void> Pump(std::shared_ptr<Link> link, int dir) {
    tcp::socket& from = dir == 0 ? link->client : link->server;
    std::string chunk(64 * 1024, '\0');
    for (;;) {
      boost::system::error_code ec;
      size_t n = co_await from.async_read_some(asio::buffer(chunk),
                                               asio::redirect_error(use_awaitable, ec));
      if (ec) {
        link->Close();
        co_return;
      }
      read_[dir] += n;
      Pipe& pipe = link->pipes[dir];
      if (modes_[dir] == Mode::kPass &&
          (delays_[dir] > absl::ZeroDuration() || !pipe.delayed.empty())) {
        // Goes on `delay` after it was read; a chunk read once the delay is off still waits for
        // the ones before it, so the order is kept.
        pipe.delayed.emplace_back(
            std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(delays_[dir]),
            chunk.substr(0, n));
        StartDelayer(link, dir);
        continue;
      }
      switch (modes_[dir]) {
        case Mode::kPass:
          pipe.outbox.append(chunk, 0, n);
          StartWriter(link, dir);
          break;
        case Mode::kHold:
          pipe.held.append(chunk, 0, n);
          held_[dir] += n;
          break;
        case Mode::kDrop:
          break;
      }
    }
  }

  void StartDelayer(const std::shared_ptr<Link>& link, int dir) {
    Pipe& pipe = link->pipes[dir];
    if (pipe.delaying || link->closed) return;
    pipe.delaying = true;
    asio::co_spawn(io_, Delayer(link, dir), asio::detached);
  }

  // Hands each delayed chunk on once its time comes (held or dropped instead if the mode
  // changed meanwhile).
  awaitable<void> Delayer(std::shared_ptr<Link> link, int dir) {
    Pipe& pipe = link->pipes[dir];
    asio::steady_timer timer(io_);
    while (!pipe.delayed.empty() && !link->closed) {
      timer.expires_at(pipe.delayed.front().first);
      boost::system::error_code ec;
      co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
      if (link->closed) break;
      std::string bytes = std::move(pipe.delayed.front().second);
      pipe.delayed.pop_front();
      switch (modes_[dir]) {
        case Mode::kPass:
          pipe.outbox += bytes;
          StartWriter(link, dir);
          break;
        case Mode::kHold:
          held_[dir] += bytes.size();
          pipe.held += bytes;
          break;
        case Mode::kDrop:
          break;
      }
    }
    pipe.delaying = false;
  }

  void StartWriter(const std::shared_ptr<Link>& link, int dir) {
    Pipe& pipe = link->pipes[dir];
    if (pipe.writing || pipe.outbox.empty() || link->closed) return;
    pipe.writing = true;
    asio::co_spawn(io_, Writer(link, dir), asio::detached);
  }

  awaitable<void> Writer(std::shared_ptr<Link> link, int dir) {
    tcp::socket& to = dir == 0 ? link->server : link->client;
    Pipe& pipe = link->pipes[dir];
    while (!pipe.outbox.empty() && !link->closed) {
      std::string batch;
      batch.swap(pipe.outbox);
      boost::system::error_code ec;
      co_await asio::async_write(to, asio::buffer(batch), asio::redirect_error(use_awaitable, ec));
      if (ec) {
        link->Close();
        break;
      }
    }
    pipe.writing = false;
  }

  const int target_port_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  int port_ = 0;
  Mode modes_[kDirections] = {Mode::kPass, Mode::kPass};
  absl::Duration delays_[kDirections] = {absl::ZeroDuration(), absl::ZeroDuration()};
  std::atomic<uint64_t> read_[kDirections] = {0, 0};
  std::atomic<uint64_t> held_[kDirections] = {0, 0};
  std::list<std::weak_ptr<Link>> links_;
  std::thread thread_;
};

FaultProxy::FaultProxy(int target_port) : impl_(std::make_unique<Impl>(target_port)) {}
FaultProxy::~FaultProxy() = default;
int FaultProxy::port() const { return impl_->port(); }
void FaultProxy::Set(Direction d, Mode m) { impl_->Set(Index(d), m); }
void FaultProxy::SetDelay(Direction d, absl::Duration delay) { impl_->SetDelay(Index(d), delay); }
void FaultProxy::Release(Direction d) { impl_->Release(Index(d)); }
void FaultProxy::CutAll() { impl_->CutAll(); }
uint64_t FaultProxy::bytes_read(Direction d) const { return impl_->bytes_read(Index(d)); }
uint64_t FaultProxy::bytes_held(Direction d) const { return impl_->bytes_held(Index(d)); }

}  // namespace fencelock::harness
