// The lock client for Asio users: acquire, release and renew as asynchronous operations that
// take any Asio completion token, so that coroutines (`asio::use_awaitable`), plain callbacks
// and `asio::use_future` all work. Header-only over Client::acquireAsync, releaseAsync and
// renewAsync; it needs Boost.Asio's headers (Debian's libboost-dev), which the rest of the
// library does not.
//
//   fencelock::AsyncClient locks(io.get_executor(), *client);
//   absl::StatusOr<fencelock::LockHandle> lock =
//       co_await locks.async_acquire("payout-42", absl::Seconds(10), asio::use_awaitable);
//
// Completion signatures: void(absl::StatusOr<LockHandle>) for async_acquire and
// void(absl::Status) for the others. Errors are values, never exceptions, as in the blocking
// API. Handlers run through their associated executor (by default this object's), and the
// operation keeps that executor's work count up while it is pending.
//
// Cancellation: cancel() withdraws every acquire started through this object that has not
// completed; lockd takes each out of its lock's queue, and each completes with kCancelled
// (Boost 1.74's Asio has no per-operation cancellation slots, so this follows its I/O objects'
// cancel()). A grant that crosses a cancellation is released by the client, never handed to a
// handler.
#ifndef FENCELOCK_LOCK_CLIENT_ASYNC_H_
#define FENCELOCK_LOCK_CLIENT_ASYNC_H_

#include <utility>  // first: Boost 1.74's Asio uses std::exchange without it (GCC 12, C++20)

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "lock-client/client.h"
#include "api/export.h"
#include "clock/std_mutex.h"

namespace fencelock {

class FENCELOCK_API AsyncClient {
 public:
  using executor_type = boost::asio::any_io_executor;

  // `client` must outlive this object and every operation started through it.
  AsyncClient(executor_type executor, Client& client)
      : executor_(std::move(executor)), client_(&client) {}
  AsyncClient(const AsyncClient&) = delete;
  AsyncClient& operator=(const AsyncClient&) = delete;

  executor_type get_executor() const { return executor_; }
  Client& client() const { return *client_; }

  // Client::acquire without blocking. Completes with the handle or acquire's errors, or with
  // kCancelled after cancel(). `ttl` zero means the client's default lock TTL.
  template <typename CompletionToken>
  auto async_acquire(std::string_view lock, absl::Duration wait, absl::Duration ttl,
                     CompletionToken&& token) {
    return async_acquire(lock, wait, AcquireOptions{.ttl = ttl},
                         std::forward<CompletionToken>(token));
  }
  // The same in `options.mode` (ADR 0006), with its lock delay.
  template <typename CompletionToken>
  auto async_acquire(std::string_view lock, absl::Duration wait, const AcquireOptions& options,
                     CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(absl::StatusOr<LockHandle>)>(
        [this](auto handler, std::string name, absl::Duration w, AcquireOptions o) {
          // Started and tracked under one lock: a cancel() from another thread that sees the
          // acquire's effect (its waiter on lockd) finds it tracked. acquireAsync never calls
          // back from within itself, so nothing here waits for this lock.
          StdMutexLock lock(&mu_);
          auto pending = client_->acquireAsync(name, w, o, Completion(std::move(handler)));
          Track(std::move(pending));
        },
        token, std::string(lock), wait, options);
  }
  // async_acquire in shared mode.
  template <typename CompletionToken>
  auto async_acquire_shared(std::string_view lock, absl::Duration wait, CompletionToken&& token) {
    return async_acquire(lock, wait, AcquireOptions{.mode = LockMode::kShared},
                         std::forward<CompletionToken>(token));
  }
  template <typename CompletionToken>
  auto async_acquire(std::string_view lock, absl::Duration wait, CompletionToken&& token) {
    return async_acquire(lock, wait, absl::ZeroDuration(),
                         std::forward<CompletionToken>(token));
  }

  // Client::release without blocking.
  template <typename CompletionToken>
  auto async_release(const LockHandle& handle, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(absl::Status)>(
        [this](auto handler, LockHandle h) {
          client_->releaseAsync(h, Completion(std::move(handler)));
        },
        token, handle);
  }

  // A heartbeat now, then whether `handle` is still held (Client::renewAsync).
  template <typename CompletionToken>
  auto async_renew(const LockHandle& handle, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(absl::Status)>(
        [this](auto handler, LockHandle h) {
          client_->renewAsync(h, Completion(std::move(handler)));
        },
        token, handle);
  }

  // Withdraws every acquire started through this object that has not completed; each completes
  // with kCancelled. Returns how many were cancelled.
  size_t cancel() {
    std::vector<std::weak_ptr<PendingAcquire>> pending;
    {
      StdMutexLock lock(&mu_);
      pending.swap(pending_);
    }
    size_t cancelled = 0;
    for (const auto& weak : pending) {
      if (auto op = weak.lock(); op != nullptr && op->cancel()) ++cancelled;
    }
    return cancelled;
  }

 private:
  // The Client's callback for `handler`: posts the outcome to the handler's executor, and keeps
  // that executor's work count up until the post has returned. Reset in the handler instead,
  // run() could return, and the io_context be destroyed, while the client's thread is still
  // inside post() (TSan saw exactly that). std::function wants a copyable callable; the
  // handler (move-only for coroutines) lives behind a shared_ptr.
  template <typename Handler>
  auto Completion(Handler handler) {
    using Executor = boost::asio::associated_executor_t<Handler, executor_type>;
    struct State {
      Handler handler;
      boost::asio::executor_work_guard<Executor> work;
    };
    Executor ex = boost::asio::get_associated_executor(handler, executor_);
    auto state = std::make_shared<State>(
        State{std::move(handler), boost::asio::make_work_guard(ex)});
    return [state](auto result) {
      Executor target = state->work.get_executor();
      boost::asio::post(target, [state, result = std::move(result)]() mutable {
        auto h = std::move(state->handler);
        std::move(h)(std::move(result));
      });
      state->work.reset();
    };
  }

  void Track(std::shared_ptr<PendingAcquire> op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::erase_if(pending_, [](const std::weak_ptr<PendingAcquire>& w) { return w.expired(); });
    pending_.push_back(std::move(op));
  }

  executor_type executor_;
  Client* client_;
  StdMutex mu_;
  // Acquires started here, for cancel(). The client drops its reference when one completes.
  std::vector<std::weak_ptr<PendingAcquire>> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fencelock

#endif  // FENCELOCK_LOCK_CLIENT_ASYNC_H_
