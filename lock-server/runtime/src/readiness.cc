#include "readiness.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fencelock::server {

template <typename Handler>
struct Waker::PendingHandler final : Waker::Pending {
  explicit PendingHandler(Handler h) : handler(std::move(h)) {}
  // Resumes the waiting coroutine from its own executor's queue, never inline from Fire().
  void Complete() override {
    auto executor = asio::get_associated_executor(handler);
    asio::post(executor, std::move(handler));
  }
  Handler handler;
};

asio::awaitable<void> Waker::Wait() {
  if (fired_) {
    fired_ = false;
    co_return;
  }
  co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(
      [this](auto handler) {
        pending_ = std::make_unique<PendingHandler<decltype(handler)>>(std::move(handler));
      },
      asio::use_awaitable);
}

void Waker::Fire() {
  if (pending_ == nullptr) {
    fired_ = true;
    return;
  }
  std::unique_ptr<Pending> pending = std::move(pending_);
  pending->Complete();
}

struct ReadinessSet::State {
  State(asio::io_context& io, int fd) : epoll(io, fd) {}
  asio::posix::stream_descriptor epoll;
  absl::flat_hash_map<int, Watcher*> watchers;
  bool stopped = false;
  bool failed = false;
};

bool ReadinessSet::failed() const { return state_->failed; }

absl::StatusOr<std::unique_ptr<ReadinessSet>> ReadinessSet::Create(asio::io_context& io) {
  const int fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot make lockd's epoll set: ", std::strerror(errno)));
  }
  return std::unique_ptr<ReadinessSet>(new ReadinessSet(io, fd));
}

ReadinessSet::ReadinessSet(asio::io_context& io, int epoll_fd)
    : state_(std::make_shared<State>(io, epoll_fd)) {
  asio::co_spawn(io, Loop(state_), asio::detached);
}

ReadinessSet::~ReadinessSet() {
  state_->stopped = true;
  state_->watchers.clear();
  boost::system::error_code ec;
  state_->epoll.cancel(ec);  // the loop ends; its reference to the state goes with it
}

absl::Status ReadinessSet::Add(int fd, Watcher* watcher) {
  // Edge-triggered: an event for each arrival, so a socket read dry needs no re-arming.
  epoll_event e{.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data = {.fd = fd}};
  if (::epoll_ctl(state_->epoll.native_handle(), EPOLL_CTL_ADD, fd, &e) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot add a connection to lockd's epoll set: ", std::strerror(errno)));
  }
  state_->watchers[fd] = watcher;
  return absl::OkStatus();
}

void ReadinessSet::Remove(int fd) {
  if (state_->watchers.erase(fd) == 0) return;
  ::epoll_ctl(state_->epoll.native_handle(), EPOLL_CTL_DEL, fd, nullptr);
}

asio::awaitable<void> ReadinessSet::Loop(std::shared_ptr<State> state) {
  constexpr int kBatch = 256;
  epoll_event events[kBatch];
  boost::system::error_code ec;
  while (!state->stopped) {
    co_await state->epoll.async_wait(asio::posix::stream_descriptor::wait_read,
                                     asio::redirect_error(asio::use_awaitable, ec));
    if (ec || state->stopped) break;
    for (;;) {
      const int n = ::epoll_wait(state->epoll.native_handle(), events, kBatch, 0);
      if (n < 0 && errno == EINTR) continue;
      // Readable() only schedules the read: nobody is removed while this pass runs.
      for (int i = 0; i < n; ++i) {
        if (auto it = state->watchers.find(events[i].data.fd); it != state->watchers.end()) {
          it->second->Readable();
        }
      }
      if (n < kBatch) break;
    }
  }
  if (!state->stopped) {
    // The set's descriptor failed: every connection goes back to waiting on its own socket.
    state->failed = true;
    auto watchers = std::move(state->watchers);
    state->watchers.clear();
    for (auto& [fd, watcher] : watchers) watcher->Readable();
  }
}

}  // namespace fencelock::server
