// Issues 20 and 34: the client's fast path against a real lockd. A blocking call writes its
// request on the caller's thread (with what other callers queued meanwhile) and reads the reply
// itself if nobody else reads the connection, or the shared I/O thread reads it;
// releaseWithNextRequest() holds its Release for the next request's
// write. The cases are what could go wrong with that: a caller blocked reading when
// lockd dies or the client closes, a caller reading the replies of others, an idle connection
// lockd closed, callers on several threads
// sharing one connection, a Release that never goes out, a fenced-out one nobody waits for,
// what waits to be written to a lockd that stops reading (then dies, or reads again), and a
// process out of descriptors.
// Every wait for lockd's state polls with a generous bound; nothing asserts timing.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "clock/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::LockdProcess;
using testing::RawConnection;

class ClientFastPathTest : public ::testing::Test {
 protected:
  // A 60 s session: its heartbeat comes every 20 s, later than any of these cases ends, unless
  // a case asks for a shorter one.
  std::unique_ptr<Client> NewClient(absl::Duration session_ttl = absl::Seconds(60),
                                    Clock* clock = nullptr,
                                    absl::Duration heartbeat_interval = absl::ZeroDuration()) {
    ClientOptions options;
    options.heartbeat_interval = heartbeat_interval;
    options.server = lockd_.tcp_address();
    options.session_ttl = session_ttl;
    options.default_lock_ttl = session_ttl;
    options.clock = clock;
    options.request_timeout = absl::Seconds(10);
    options.log = [this](LogLevel level, const std::string& line) {
      absl::MutexLock lock(&log_mu_);
      if (level == LogLevel::kWarning) warnings_.push_back(line);
    };
    auto client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }
  // Whether a session of its own can take `lock` now (and gives it back at once).
  bool Free(const std::string& lock) {
    RawConnection probe = RawConnection::Tcp(lockd_.port());
    probe.Hello();
    const uint64_t session =
        probe.Call(testing::request::OpenSession(absl::Seconds(10))).open_session().session_id();
    const wire::Response r = probe.Call(testing::request::Acquire(session, lock));
    probe.Call(testing::request::Close(session));
    return r.code() == wire::OK && r.acquire().granted();
  }
  template <typename Pred>
  static bool Eventually(Pred pred) {
    for (int i = 0; i < 1000; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  std::vector<std::string> Warnings() {
    absl::MutexLock lock(&log_mu_);
    return warnings_;
  }

  LockdProcess lockd_;
  absl::Mutex log_mu_;
  std::vector<std::string> warnings_ ABSL_GUARDED_BY(log_mu_);
};

TEST_F(ClientFastPathTest, AReleaseWithTheNextRequestGoesOutWithIt) {
  auto client = NewClient(absl::Seconds(60), nullptr, absl::Hours(1));  // no heartbeat of its own
  auto a = client->acquire("fast/a", absl::Seconds(5));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(client->releaseWithNextRequest(*a).ok());
  EXPECT_THROW(client->checkStillHeld(*a), LockLostException);  // lost on this side at once
  // Nothing was written yet: lockd still has it.
  EXPECT_FALSE(Free("fast/a"));
  // The next acquire carries it: lockd applies the Release first, and commits both before it
  // answers the acquire.
  auto b = client->acquire("fast/b", absl::Seconds(5));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(Free("fast/a"));
  EXPECT_TRUE(client->release(*b).ok());
  EXPECT_TRUE(Warnings().empty());
}

TEST_F(ClientFastPathTest, WithNoNextRequestTheHeartbeatCarriesTheRelease) {
  auto client = NewClient(absl::Seconds(3));  // a heartbeat every second
  auto a = client->acquire("fast/idle", absl::Seconds(5));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(client->releaseWithNextRequest(*a).ok());
  EXPECT_TRUE(Eventually([&] { return Free("fast/idle"); }));
}

TEST_F(ClientFastPathTest, AFencedOutReleaseNobodyWaitsForIsCountedAndLogged) {
  SimulatedClock clock;  // stands still: the client goes on believing it holds the lock
  // No heartbeat of its own (a short lock would otherwise be renewed every 100 ms): lockd lets
  // the 300 ms lease run out.
  auto client = NewClient(absl::Seconds(60), &clock, absl::Hours(1));
  auto lock = client->acquire("fast/x", absl::Seconds(5), absl::Milliseconds(300));
  ASSERT_TRUE(lock.ok()) << lock.status();
  auto other = NewClient();
  auto taken = other->acquire("fast/x", absl::Seconds(10));  // once lockd expired the lease
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_TRUE(client->releaseWithNextRequest(*lock).ok());
  ASSERT_TRUE(client->renewNow().ok());  // the next request: the Release goes out with it
  metrics::Counter& fenced = client->metrics()->GetCounter(
      "lock_client_fenced_out_total",
      "FENCED_OUT answers this client received: a token of its that no longer held its lock");
  // Its answer is read with the next reply read after it.
  EXPECT_TRUE(Eventually([&] {
    (void)client->renewNow();
    return fenced.value() == 1;
  }));
  EXPECT_THAT(Warnings(), ::testing::Contains(HasSubstr("fast/x")));
  EXPECT_TRUE(other->release(*taken).ok());
}

TEST_F(ClientFastPathTest, ACallerBlockedReadingHearsOfLockdsDeathAtOnce) {
  auto holder = NewClient();
  auto held = holder->acquire("fast/held", absl::Seconds(5));
  ASSERT_TRUE(held.ok()) << held.status();
  auto client = NewClient();
  absl::Status waited;
  std::atomic<bool> done{false};
  // Blocks on its own thread, reading the socket itself, for up to 60 s + the request timeout.
  std::thread waiter([&] {
    waited = client->acquire("fast/held", absl::Seconds(60)).status();
    done = true;
  });
  ASSERT_TRUE(Eventually([&] {
    RawConnection admin = RawConnection::Tcp(lockd_.port());
    admin.Hello();
    const wire::Request stats = testing::request::GetStats();
    return admin.Call(stats).stats().waiters() == 1;
  }));
  lockd_.Kill();
  // Long before the wait or the request timeout: the end of the connection wakes the reader.
  EXPECT_TRUE(Eventually([&] { return done.load(); }));
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
}

// A caller blocked in a long acquire reads the shared connection for its own reply (nobody
// else read it when it sent): the replies to the other Clients on that connection arrive
// first, and it hands each to its Client, a blocking caller or a callback, and reads on.
TEST_F(ClientFastPathTest, ACallerReadingForItsOwnReplyHandsTheOthersTheirs) {
  auto holder = NewClient();
  auto held = holder->acquire("fast/lead/held", absl::Seconds(5));
  ASSERT_TRUE(held.ok()) << held.status();
  auto waiting = NewClient();
  absl::StatusOr<LockHandle> got = absl::UnknownError("not yet");
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    got = waiting->acquire("fast/lead/held", absl::Seconds(60));
    done = true;
  });
  ASSERT_TRUE(Eventually([&] {
    RawConnection admin = RawConnection::Tcp(lockd_.port());
    admin.Hello();
    return admin.Call(testing::request::GetStats()).stats().waiters() == 1;
  }));
  auto busy = NewClient();  // the same connection: same address and name
  for (int i = 0; i < 200; ++i) {
    auto lock = busy->acquire("fast/lead/busy", absl::Seconds(5));
    ASSERT_TRUE(lock.ok()) << lock.status();
    ASSERT_TRUE(busy->release(*lock).ok());
  }
  std::promise<absl::StatusOr<LockHandle>> called;
  std::future<absl::StatusOr<LockHandle>> answer = called.get_future();
  auto pending = busy->acquireAsync(
      "fast/lead/async", absl::Seconds(5), absl::ZeroDuration(),
      [&](absl::StatusOr<LockHandle> h) { called.set_value(std::move(h)); });
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  absl::StatusOr<LockHandle> async_lock = answer.get();
  ASSERT_TRUE(async_lock.ok()) << async_lock.status();
  EXPECT_TRUE(busy->release(*async_lock).ok());
  EXPECT_FALSE(done.load());
  ASSERT_TRUE(holder->release(*held).ok());
  EXPECT_TRUE(Eventually([&] { return done.load(); }));
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(waiting->release(*got).ok());
}

// A lockd that stops reading: the requests fill both sides' socket buffers, the rest waits in
// the client for the socket to take more (its I/O thread's write loop), and when lockd dies
// every pending call fails. Nothing raises SIGPIPE (the test process would die of it).
TEST_F(ClientFastPathTest, ALockdThatStopsReadingThenDiesFailsWhatWaitsToBeWritten) {
  auto client = NewClient(absl::Seconds(60), nullptr, absl::Hours(1));
  ASSERT_EQ(::kill(lockd_.pid(), SIGSTOP), 0);
  // 40 acquires of 900 KB lock names: 36 MB, far more than the socket buffers hold.
  constexpr int kCalls = 40;
  std::atomic<int> done{0}, failed{0};
  std::vector<std::shared_ptr<PendingAcquire>> pending;
  for (int i = 0; i < kCalls; ++i) {
    pending.push_back(client->acquireAsync(
        std::string(900 * 1024, static_cast<char>('a' + i % 26)) + std::to_string(i),
        absl::Seconds(60), absl::ZeroDuration(), [&](absl::StatusOr<LockHandle> h) {
          if (!h.ok()) ++failed;
          ++done;
        }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(done.load(), 0);  // nothing answered, nothing failed yet
  lockd_.Kill();              // a stopped process dies of SIGKILL too: its sockets reset
  EXPECT_TRUE(Eventually([&] { return done.load() == kCalls; }));
  EXPECT_EQ(failed.load(), kCalls);
  lockd_.Restart();
  auto again = client->acquire("fast/after", absl::Seconds(5));  // reconnects
  EXPECT_TRUE(again.ok()) << again.status();
}

TEST_F(ClientFastPathTest, WhatWaitedToBeWrittenToAStoppedLockdReachesItWhole) {
  // Before the client: a callback cancelled by its destruction still finds them.
  std::atomic<int> refused{0}, other{0};
  absl::Notification granted;
  absl::Status last;
  auto client = NewClient(absl::Seconds(60), nullptr, absl::Hours(1));
  ASSERT_EQ(::kill(lockd_.pid(), SIGSTOP), 0);
  // 40 acquires of 900 KB names (36 MB: the I/O thread's write loop holds most of it), then
  // one lockd can grant. Each big one must come back as lockd's refusal of its name's length,
  // and the last one granted: a byte lost or reordered would cut a frame short.
  constexpr int kBig = 40;
  std::vector<std::shared_ptr<PendingAcquire>> pending;
  for (int i = 0; i < kBig; ++i) {
    pending.push_back(client->acquireAsync(
        std::string(900 * 1024, static_cast<char>('a' + i % 26)) + std::to_string(i),
        absl::Seconds(60), absl::ZeroDuration(), [&](absl::StatusOr<LockHandle> h) {
          ++(absl::IsInvalidArgument(h.status()) ? refused : other);
        }));
  }
  pending.push_back(client->acquireAsync("fast/behind-the-big-ones", absl::Seconds(60),
                                         absl::ZeroDuration(), [&](absl::StatusOr<LockHandle> h) {
                                           last = h.status();
                                           granted.Notify();
                                         }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(refused.load() + other.load(), 0);
  ASSERT_EQ(::kill(lockd_.pid(), SIGCONT), 0);
  EXPECT_TRUE(granted.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(last.ok()) << last;
  EXPECT_TRUE(Eventually([&] { return refused.load() + other.load() == kBig; }));
  EXPECT_EQ(refused.load(), kBig);
}

// Clients share their connection to a replica (runtime.h): with every descriptor taken, a
// connected client goes on, and one that needs a connection of its own is told why; with
// descriptors back, it connects.
TEST_F(ClientFastPathTest, OutOfDescriptorsAConnectedClientGoesOnAndANewOneSaysWhy) {
  auto client = NewClient(absl::Seconds(60), nullptr, absl::Hours(1));
  auto first = client->acquire("fast/fd/first", absl::Seconds(5));
  ASSERT_TRUE(first.ok()) << first.status();
  ClientOptions fresh_options;
  fresh_options.server = lockd_.tcp_address();
  fresh_options.client_name = "another-name";  // a connection of its own
  fresh_options.log = [](LogLevel, const std::string&) {};
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old_limit), 0);
  rlimit low = old_limit;
  low.rlim_cur = std::min<rlim_t>(old_limit.rlim_cur, 512);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> taken;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) taken.push_back(fd);
  ASSERT_EQ(errno, EMFILE);
  auto second = client->acquire("fast/fd/second", absl::Seconds(5));
  auto fresh = Client::Create(fresh_options);
  for (int fd : taken) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old_limit), 0);
  EXPECT_TRUE(second.ok()) << second.status();
  ASSERT_FALSE(fresh.ok());
  EXPECT_TRUE(absl::IsUnavailable(fresh.status())) << fresh.status();
  EXPECT_THAT(std::string(fresh.status().message()), HasSubstr("out of file descriptors"))
      << fresh.status();
  auto again = Client::Create(fresh_options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->acquire("fast/fd/third", absl::Seconds(5)).ok());
}

TEST_F(ClientFastPathTest, AnIdleConnectionLockdClosedIsNoticedBeforeTheNextAcquire) {
  auto client = NewClient();
  auto a = client->acquire("fast/r", absl::Seconds(5));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(client->release(*a).ok());
  // Nobody reads an idle connection. lockd restarts (closing it); the next acquire must
  // reconnect and resume first rather than fail on the dead connection.
  lockd_.Restart();
  auto b = client->acquire("fast/r", absl::Seconds(5));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(client->release(*b).ok());
}

// Established TCP connections whose far end is lockd's port (from /proc/net/tcp).
int ConnectionsTo(int port) {
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  int count = 0;
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const size_t colon = remote.find(':');
    if (state == "01" && colon != std::string::npos &&
        std::stoi(remote.substr(colon + 1), nullptr, 16) == port) {
      ++count;
    }
  }
  return count;
}

// The Clients of a process share one connection per replica, up to lockd's 64 sessions per
// connection: a 65th opens a second one rather than being refused its session.
TEST_F(ClientFastPathTest, SixtyFourClientsShareOneConnectionAndTheNextOpensAnother) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 65; ++i) {
    clients.push_back(NewClient());
    ASSERT_NE(clients.back(), nullptr) << "client " << i;
    if (i == 63) {
      EXPECT_EQ(ConnectionsTo(lockd_.port()), 1);
    }
  }
  EXPECT_EQ(ConnectionsTo(lockd_.port()), 2);
  for (size_t i = 0; i < clients.size(); ++i) {
    auto h = clients[i]->acquire("fast/many/" + std::to_string(i), absl::Seconds(5));
    EXPECT_TRUE(h.ok()) << "client " << i << ": " << h.status();
  }
  clients.clear();
  // The last Client gone, so are the connections.
  bool closed = false;
  for (int i = 0; i < 500 && !closed; ++i) {
    closed = ConnectionsTo(lockd_.port()) == 0;
    if (!closed) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(closed);
}

// Threads of this process (/proc/self/task).
int ThreadsOfThisProcess() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++n;
  }
  return n;
}

// A Client costs at most one thread of its own: onLost and the asynchronous calls' callbacks
// run on it, and it starts only when one of them is used. The deadline that onLost reports
// comes from the client's own timer (the runtime's), on the client's clock.
TEST_F(ClientFastPathTest, OnLostAndAsyncCallbacksShareTheClientsOneThread) {
  auto first = NewClient();  // the shared I/O thread exists from here on
  const int before = ThreadsOfThisProcess();
  SimulatedClock clock;
  auto client = NewClient(absl::Seconds(60), &clock, absl::Hours(1));  // no heartbeat
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(ThreadsOfThisProcess(), before) << "a Client that calls back nothing started a thread";
  std::promise<std::pair<absl::StatusOr<LockHandle>, std::thread::id>> granted;
  client->acquireAsync("fast/threads", absl::Seconds(5), absl::Seconds(30),
                       [&](absl::StatusOr<LockHandle> h) {
                         granted.set_value({std::move(h), std::this_thread::get_id()});
                       });
  auto [handle, async_thread] = granted.get_future().get();
  ASSERT_TRUE(handle.ok()) << handle.status();
  std::promise<std::pair<LossReason, std::thread::id>> lost;
  ASSERT_TRUE(client
                  ->onLost(*handle,
                           [&](LossReason r) { lost.set_value({r, std::this_thread::get_id()}); })
                  .ok());
  EXPECT_EQ(ThreadsOfThisProcess(), before + 1);
  clock.Advance(absl::Seconds(31));  // past any deadline of a 30 s lease
  std::future<std::pair<LossReason, std::thread::id>> fired = lost.get_future();
  ASSERT_EQ(fired.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const auto [reason, loss_thread] = fired.get();
  EXPECT_EQ(reason, LossReason::kDeadlinePassed);
  EXPECT_EQ(loss_thread, async_thread);
  EXPECT_EQ(ThreadsOfThisProcess(), before + 1);
}

TEST_F(ClientFastPathTest, CallersOnManyThreadsShareOneConnection) {
  auto client = NewClient();
  auto other = NewClient();
  auto blocker = other->acquire("fast/queued", absl::Seconds(5));
  ASSERT_TRUE(blocker.ok()) << blocker.status();
  // One caller waits in lockd's queue for most of the run: while it reads the socket, it reads
  // the others' replies too, and hands them over.
  absl::Status queued;
  std::thread waiter([&] {
    auto h = client->acquire("fast/queued", absl::Seconds(30));
    queued = h.ok() ? client->release(*h) : h.status();
  });
  constexpr int kThreads = 8;
  constexpr int kCycles = 200;
  std::atomic<int> failures{0};
  absl::Mutex first_mu;
  absl::Status first;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string lock = "fast/thread/" + std::to_string(t);
      for (int i = 0; i < kCycles; ++i) {
        auto h = client->acquire(lock, absl::Seconds(30));
        absl::Status s = h.status();
        if (h.ok()) s = i % 2 == 1 ? client->releaseWithNextRequest(*h) : client->release(*h);
        if (!s.ok()) {
          ++failures;
          absl::MutexLock l(&first_mu);
          if (first.ok()) first = s;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(other->release(*blocker).ok());
  waiter.join();
  EXPECT_TRUE(queued.ok()) << queued;
  EXPECT_EQ(failures.load(), 0) << first;
  ASSERT_TRUE(client->renewNow().ok());  // carries the last held-back Releases
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(Eventually([&] { return Free("fast/thread/" + std::to_string(t)); }));
  }
}

}  // namespace
}  // namespace fencelock
