// Issue 19: the asynchronous client (lock-client/async.h) against a real lockd: coroutines,
// callbacks and futures as completion tokens; cancellation that withdraws the waiter on lockd;
// a grant that races a cancellation given back; pending operations completed when the client
// goes away. Every wait for lockd's state polls with a generous bound; nothing asserts timing.
#include "lock-client/async.h"

#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

namespace asio = boost::asio;
using ::testing::HasSubstr;
using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

class ClientAsyncTest : public ::testing::Test {
 protected:
  std::unique_ptr<Client> NewClient(const std::string& name) {
    auto client = Client::Create({.server = lockd_.tcp_address(), .client_name = name});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }
  wire::StatsReply Stats() {
    RawConnection admin = RawConnection::Tcp(lockd_.port());
    admin.Hello();
    return admin.Call(request::GetStats()).stats();
  }
  // Polls lockd until `pred(stats)` holds, for at most 10 s.
  template <typename Pred>
  bool EventuallyStats(Pred pred) {
    for (int i = 0; i < 1000; ++i) {
      if (pred(Stats())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  LockdProcess lockd_;
};

TEST_F(ClientAsyncTest, ACoroutineAcquiresRenewsAndReleases) {
  auto client = NewClient("async-coroutine");
  auto other = NewClient("async-coroutine-2");
  asio::io_context io;
  AsyncClient locks(io.get_executor(), *client);
  AsyncClient other_locks(io.get_executor(), *other);
  bool finished = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        absl::StatusOr<LockHandle> lock =
            co_await locks.async_acquire("co/1", absl::Seconds(5), asio::use_awaitable);
        EXPECT_TRUE(lock.ok()) << lock.status();
        if (!lock.ok()) co_return;
        EXPECT_GT(lock->token(), 0u);
        client->checkStillHeld(*lock);
        const absl::Status renewed = co_await locks.async_renew(*lock, asio::use_awaitable);
        EXPECT_TRUE(renewed.ok()) << renewed;
        const absl::Status released = co_await locks.async_release(*lock, asio::use_awaitable);
        EXPECT_TRUE(released.ok()) << released;
        EXPECT_THROW(client->checkStillHeld(*lock), LockLostException);
        // After its release the handle is lost: a renewal says so.
        const absl::Status after = co_await locks.async_renew(*lock, asio::use_awaitable);
        EXPECT_TRUE(absl::IsAborted(after)) << after;
        EXPECT_THAT(after.message(), HasSubstr("released"));
        // ADR 0006: two sessions hold one lock shared at once, through the asynchronous forms.
        absl::StatusOr<LockHandle> r1 =
            co_await locks.async_acquire_shared("co/2", absl::Seconds(5), asio::use_awaitable);
        absl::StatusOr<LockHandle> r2 = co_await other_locks.async_acquire(
            "co/2", absl::Seconds(5), AcquireOptions{.mode = LockMode::kShared},
            asio::use_awaitable);
        EXPECT_TRUE(r1.ok() && r2.ok());
        if (!r1.ok() || !r2.ok()) co_return;
        EXPECT_EQ(r1->mode(), LockMode::kShared);
        EXPECT_GT(r2->token(), r1->token());
        EXPECT_TRUE((co_await locks.async_release(*r1, asio::use_awaitable)).ok());
        EXPECT_TRUE((co_await other_locks.async_release(*r2, asio::use_awaitable)).ok());
        finished = true;
      },
      asio::detached);
  io.run();  // returns once the coroutine is done: pending operations keep the context busy
  EXPECT_TRUE(finished);
}

TEST_F(ClientAsyncTest, CallbacksRunOnTheIoContextAndFuturesWork) {
  auto client = NewClient("async-callbacks");
  asio::io_context io;
  AsyncClient locks(io.get_executor(), *client);
  std::thread::id ran_on;
  absl::StatusOr<LockHandle> got = absl::UnknownError("not called");
  locks.async_acquire("cb/1", absl::Seconds(5), absl::Seconds(20),
                      [&](absl::StatusOr<LockHandle> lock) {
                        ran_on = std::this_thread::get_id();
                        got = std::move(lock);
                      });
  // Never called from within the initiating call.
  EXPECT_THAT(got.status().message(), HasSubstr("not called"));
  io.run();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_GT(client->remaining(*got), absl::Seconds(10));

  // use_future: the context runs on another thread meanwhile.
  io.restart();
  auto guard = asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  std::future<absl::Status> released = locks.async_release(*got, asio::use_future);
  EXPECT_TRUE(released.get().ok());
  // Bad arguments are a completion too, never an exception or an inline call.
  std::future<absl::StatusOr<LockHandle>> bad =
      locks.async_acquire("", absl::ZeroDuration(), asio::use_future);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.get().status()));
  guard.reset();
  runner.join();
}

TEST_F(ClientAsyncTest, CancellingAPendingAcquireWithdrawsItsWaiterOnLockd) {
  auto holder = NewClient("async-holder");
  auto held = holder->acquire("contended", absl::Seconds(5));
  ASSERT_TRUE(held.ok()) << held.status();
  auto waiter = NewClient("async-waiter");
  asio::io_context io;
  AsyncClient locks(io.get_executor(), *waiter);
  std::optional<absl::StatusOr<LockHandle>> outcome;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        outcome = co_await locks.async_acquire("contended", absl::Seconds(60), asio::use_awaitable);
      },
      asio::detached);
  std::thread runner([&] { io.run(); });
  ASSERT_TRUE(EventuallyStats([](const wire::StatsReply& s) { return s.waiters() == 1; }))
      << "the acquire never queued";
  const uint64_t grants = Stats().grants_total();

  EXPECT_EQ(locks.cancel(), 1u);
  runner.join();  // the coroutine resumed with the outcome, so the context ran out of work
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(absl::IsCancelled(outcome->status())) << outcome->status();
  // Withdrawn on lockd, not merely forgotten by the client: the queue is empty at once, and
  // the lock, once released, goes to nobody (a stranger then gets it at once).
  ASSERT_TRUE(EventuallyStats([](const wire::StatsReply& s) { return s.waiters() == 0; }))
      << "lockd still has the waiter";
  ASSERT_TRUE(holder->release(*held).ok());
  RawConnection stranger = RawConnection::Tcp(lockd_.port());
  const uint64_t session = stranger.HelloAndOpenSession(absl::Seconds(30));
  EXPECT_TRUE(stranger.Call(request::Acquire(session, "contended")).acquire().granted());
  EXPECT_EQ(Stats().grants_total(), grants + 1);  // the stranger's, and no other
  EXPECT_EQ(locks.cancel(), 0u);                  // nothing left to cancel
}

TEST_F(ClientAsyncTest, AGrantThatCrossesACancellationIsGivenBack) {
  // The holder releases while the waiter cancels: whichever lockd sees first, the waiter's
  // handler gets either the grant (cancel() said false) or kCancelled, and a grant nobody
  // took is released by the client, so the lock ends up free every time.
  auto holder = NewClient("race-holder");
  auto waiter = NewClient("race-waiter");
  asio::io_context io;
  AsyncClient locks(io.get_executor(), *waiter);
  int cancelled = 0, granted = 0;
  for (int round = 0; round < 20; ++round) {
    const std::string name = "race/" + std::to_string(round);
    auto held = holder->acquire(name, absl::Seconds(5));
    ASSERT_TRUE(held.ok()) << held.status();
    std::optional<absl::StatusOr<LockHandle>> outcome;
    locks.async_acquire(name, absl::Seconds(30),
                        [&](absl::StatusOr<LockHandle> lock) { outcome = std::move(lock); });
    ASSERT_TRUE(EventuallyStats([](const wire::StatsReply& s) { return s.waiters() == 1; }));
    std::thread release([&] { EXPECT_TRUE(holder->release(*held).ok()); });
    if (round % 2 == 1) std::this_thread::sleep_for(std::chrono::microseconds(100 * round));
    const bool did_cancel = locks.cancel() == 1;
    release.join();
    io.restart();
    io.run();
    ASSERT_TRUE(outcome.has_value());
    if (did_cancel) {
      EXPECT_TRUE(absl::IsCancelled(outcome->status())) << outcome->status();
      ++cancelled;
    } else {
      ASSERT_TRUE(outcome->ok()) << outcome->status();
      EXPECT_TRUE(waiter->release(**outcome).ok());
      ++granted;
    }
    // Free again: the holder gets it back within a few relinquish round trips.
    bool free = false;
    for (int i = 0; i < 500 && !free; ++i) {
      auto again = holder->tryAcquire(name);
      ASSERT_TRUE(again.ok()) << again.status();
      if (again->has_value()) {
        free = true;
        EXPECT_TRUE(holder->release(**again).ok());
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    EXPECT_TRUE(free) << name << " stayed held after the race";
  }
  std::printf("20 races: %d cancelled, %d granted first\n", cancelled, granted);
  EXPECT_EQ(Stats().fenced_out_total(), 0u);
}

TEST_F(ClientAsyncTest, DestroyingTheClientCompletesWhatIsPending) {
  auto holder = NewClient("gone-holder");
  auto held = holder->acquire("gone", absl::Seconds(5));
  ASSERT_TRUE(held.ok());
  auto waiter = NewClient("gone-waiter");
  asio::io_context io;
  auto locks = std::make_unique<AsyncClient>(io.get_executor(), *waiter);
  std::optional<absl::StatusOr<LockHandle>> outcome;
  locks->async_acquire("gone", absl::Seconds(60),
                       [&](absl::StatusOr<LockHandle> lock) { outcome = std::move(lock); });
  ASSERT_TRUE(EventuallyStats([](const wire::StatsReply& s) { return s.waiters() == 1; }));
  waiter.reset();  // closes the session: lockd drops the waiter with it
  io.run();        // the handler was posted before the destructor returned
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(absl::IsCancelled(outcome->status())) << outcome->status();
  EXPECT_THAT(outcome->status().message(), HasSubstr("destroyed"));
  EXPECT_TRUE(EventuallyStats([](const wire::StatsReply& s) { return s.waiters() == 0; }));
  EXPECT_EQ(locks->cancel(), 0u);  // the pending acquire outlived its client harmlessly
}

}  // namespace
}  // namespace fencelock
