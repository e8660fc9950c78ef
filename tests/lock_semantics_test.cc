// Lock semantics against a real lockd process, over TCP and over a Unix socket: mutual
// exclusion under contention, strictly increasing tokens, waiters granted by a push on
// release, on the holder's session expiry and on lease expiry, and fence 1.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <random>
#include <signal.h>

#include <thread>

#include "absl/synchronization/mutex.h"
#include "fencelock/wire.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

struct Transport {
  const char* name;
  bool unix_socket;
};

class LockSemanticsTest : public ::testing::TestWithParam<Transport> {
 protected:
  LockSemanticsTest() : lockd_(LockdProcess::Options{.unix_socket = GetParam().unix_socket}) {}

  std::unique_ptr<Client> NewClient(ClientOptions options = {}) {
    options.server = GetParam().unix_socket ? lockd_.unix_address() : lockd_.tcp_address();
    auto client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }
  RawConnection Raw() {
    return GetParam().unix_socket ? RawConnection::Unix(lockd_.unix_path())
                                  : RawConnection::Tcp(lockd_.port());
  }
  wire::StatsReply Stats() {
    RawConnection admin = Raw();
    admin.Hello();
    return admin.Call(request::GetStats()).stats();
  }
  // Waits (polling the server's own count) until `n` acquires are queued.
  void WaitForWaiters(uint64_t n) {
    for (int i = 0; i < 2000 && Stats().waiters() != n; ++i) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_EQ(Stats().waiters(), n);
  }
  static wire::Response RawAcquire(RawConnection& c, uint64_t session, const std::string& lock,
                                   absl::Duration ttl) {
    return c.Call(request::Acquire(session, lock, absl::ZeroDuration(), ttl));
  }

  LockdProcess lockd_;
};

TEST_P(LockSemanticsTest, ContendingClientsNeverOverlapAndSeeIncreasingTokens) {
  constexpr int kClients = 8;
  constexpr int kRounds = 40;
  constexpr int kLocks = 3;
  const unsigned seed = 1129;
  std::printf("seed=%u\n", seed);

  std::atomic<uint64_t> holder[kLocks] = {};
  absl::Mutex mu;
  std::vector<uint64_t> grant_order[kLocks];  // tokens in the order holders entered
  std::atomic<int> overlaps{0}, failures{0};

  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = NewClient();
      if (!client) {
        ++failures;
        return;
      }
      std::mt19937 rng(seed + c);
      for (int round = 0; round < kRounds; ++round) {
        const int l = static_cast<int>(rng() % kLocks);
        auto handle = client->acquire("contended-" + std::to_string(l), absl::Seconds(30));
        if (!handle.ok()) {
          ++failures;
          continue;
        }
        uint64_t expected = 0;
        if (!holder[l].compare_exchange_strong(expected, handle->token())) ++overlaps;
        {
          absl::MutexLock lock(&mu);
          grant_order[l].push_back(handle->token());
        }
        if (rng() % 4 == 0) std::this_thread::yield();
        client->checkStillHeld(*handle);
        expected = handle->token();
        if (!holder[l].compare_exchange_strong(expected, 0)) ++overlaps;
        if (!client->release(*handle).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();

  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  std::set<uint64_t> all;
  size_t grants = 0;
  for (int l = 0; l < kLocks; ++l) {
    for (size_t i = 1; i < grant_order[l].size(); ++i) {
      EXPECT_LT(grant_order[l][i - 1], grant_order[l][i]) << "lock " << l << " grant " << i;
    }
    all.insert(grant_order[l].begin(), grant_order[l].end());
    grants += grant_order[l].size();
  }
  EXPECT_EQ(grants, size_t{kClients * kRounds});
  EXPECT_EQ(all.size(), grants) << "a token was issued twice";
  EXPECT_EQ(Stats().fenced_out_total(), 0u);
}

TEST_P(LockSemanticsTest, WaiterIsGrantedOnRelease) {
  auto a = NewClient();
  auto b = NewClient();
  auto held = a->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(held.ok());
  absl::StatusOr<LockHandle> waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = b->acquire("x", absl::Seconds(20)); });
  WaitForWaiters(1);
  ASSERT_TRUE(a->release(*held).ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_GT(waited->token(), held->token());
  EXPECT_NO_THROW(b->checkStillHeld(*waited));
}

TEST_P(LockSemanticsTest, WaiterIsGrantedWhenHolderSessionExpires) {
  RawConnection silent = Raw();
  const uint64_t session = silent.HelloAndOpenSession(absl::Milliseconds(300));
  wire::Response grant = RawAcquire(silent, session, "x", absl::Seconds(30));
  ASSERT_TRUE(grant.acquire().granted());
  // The holder never sends a keep-alive: its session ends 300 ms after it was opened.
  auto b = NewClient();
  auto waited = b->acquire("x", absl::Seconds(20));
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_GT(waited->token(), grant.acquire().token());
  wire::StatsReply stats = Stats();
  EXPECT_EQ(stats.session_expiries_total(), 1u);
  EXPECT_EQ(stats.lock_expiries_total(), 0u);
}

TEST_P(LockSemanticsTest, WaiterIsGrantedWhenLockLeaseExpires) {
  RawConnection silent = Raw();
  const uint64_t session = silent.HelloAndOpenSession(absl::Seconds(60));
  wire::Response grant = RawAcquire(silent, session, "x", absl::Milliseconds(300));
  ASSERT_TRUE(grant.acquire().granted());
  auto b = NewClient();
  auto waited = b->acquire("x", absl::Seconds(20));
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_GT(waited->token(), grant.acquire().token());
  wire::StatsReply stats = Stats();
  EXPECT_EQ(stats.lock_expiries_total(), 1u);
  EXPECT_EQ(stats.session_expiries_total(), 0u);
}

// With a declared step, the default heartbeat keeps the lease left above the step's cost:
// D4 never refuses a healthy holder just because a renewal is due. (A third of the 3 s TTL,
// 1 s, would leave 2.1 s − 1 s = 1.1 s before each renewal, less than the 1.5 s step.)
TEST_P(LockSemanticsTest, DeclaredStepsShortenTheHeartbeatSoD4DoesNotRefuseHealthyHolders) {
  const StepCost submit = StepCost::Hop("submit", absl::Milliseconds(1500));
  auto client = NewClient({.session_ttl = absl::Seconds(3),
                           .default_lock_ttl = absl::Seconds(3),
                           .steps = {submit}});
  auto lock = client->acquire("stepper", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  int refused = 0;
  absl::Duration lowest = absl::InfiniteDuration();
  for (absl::Time end = absl::Now() + absl::Seconds(3); absl::Now() < end;) {
    lowest = std::min(lowest, client->remaining(*lock));
    try {
      client->beginIrreversibleStep(*lock, submit);
    } catch (const LockLostException&) {
      ++refused;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(refused, 0) << "lowest lease left: " << lowest;
  EXPECT_TRUE(client->release(*lock).ok());
}

// A holder paused past its lease (here: its heartbeat never runs) wakes up, sees the loss and
// releases. That is clean-up, not a stale request: both sides keep lock_fenced_out_total at 0.
TEST_P(LockSemanticsTest, ReleasingALockAlreadyLostIsNotCountedAsFencedOut) {
  auto paused = NewClient({.heartbeat_interval = absl::Hours(1)});
  auto lost = paused->acquire("p", absl::Seconds(5), absl::Milliseconds(300));
  ASSERT_TRUE(lost.ok()) << lost.status();
  auto other = NewClient();
  auto current = other->acquire("p", absl::Seconds(20));  // once the 300 ms lease ends
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_THROW(paused->checkStillHeld(*lost), LockLostException);

  absl::Status s = paused->release(*lost);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("already lost before release: deadline_passed"));
  EXPECT_EQ(paused->release(*lost).code(), absl::StatusCode::kAborted);  // twice: still quiet
  EXPECT_EQ(paused->metrics()->GetCounter("lock_client_fenced_out_total", "").value(), 0);
  EXPECT_EQ(paused->metrics()
                ->GetCounter("lock_lease_lost_total", "", {{"reason", "deadline_passed"}})
                .value(),
            1);
  EXPECT_NO_THROW(other->checkStillHeld(*current));  // the relinquish did not touch the holder
  EXPECT_EQ(Stats().fenced_out_total(), 0u);

  // Another connection sending the paused session's stale release is refused before any
  // fence: the session is not its own, and nothing is counted as fenced out.
  RawConnection stranger = Raw();
  stranger.Hello();
  EXPECT_EQ(stranger.Call(request::Release(paused->sessionId(), "p", lost->token())).code(),
            wire::PERMISSION_DENIED);
  EXPECT_EQ(Stats().fenced_out_total(), 0u);

  // A lease's own session sending its stale token without the relinquish flag is a stale
  // request, and counted; with the flag it is answered the same and not counted.
  RawConnection raw = Raw();
  const uint64_t session = raw.HelloAndOpenSession(absl::Seconds(30));
  const uint64_t stale = raw.Call(testing::request::Acquire(session, "q", absl::ZeroDuration(),
                                                            absl::Milliseconds(300)))
                             .acquire()
                             .token();
  ASSERT_GT(stale, 0u);
  ASSERT_TRUE(other->acquire("q", absl::Seconds(20)).ok());  // once the 300 ms lease ends
  EXPECT_EQ(raw.Call(request::Release(session, "q", stale)).code(), wire::FENCED_OUT);
  EXPECT_EQ(raw.Call(request::Release(session, "q", stale, /*relinquish=*/true)).code(),
            wire::FENCED_OUT);
  EXPECT_EQ(Stats().fenced_out_total(), 1u);
}

// A release that overtakes a heartbeat already carrying the same lock must not reach lockd
// first: the heartbeat's renewal would then present a released token and be counted as fenced
// out although the worker never held anything it should not. With a 1 ms heartbeat, hundreds
// of releases race a heartbeat in flight.
TEST_P(LockSemanticsTest, ReleaseRacingTheHeartbeatIsNeverFencedOut) {
  auto client = NewClient({.heartbeat_interval = absl::Milliseconds(1)});
  constexpr int kCycles = 3000;
  for (int i = 0; i < kCycles; ++i) {
    auto lock = client->acquire("r", absl::Seconds(5));
    ASSERT_TRUE(lock.ok()) << lock.status();
    absl::Status s = client->release(*lock);
    ASSERT_TRUE(s.ok()) << "cycle " << i << ": " << s;
  }
  EXPECT_EQ(client->metrics()->GetCounter("lock_client_fenced_out_total", "").value(), 0);
  EXPECT_EQ(Stats().fenced_out_total(), 0u);
}

// lockd frozen (SIGSTOP) for three times its leases: a KeepAlive sent meanwhile waits in its
// socket. Without stall compensation lockd would expire the session on waking and answer
// SESSION_NOT_FOUND; with it (the default) the leases were extended by the freeze and the
// renewal succeeds. Either way nothing is counted as fenced out.
TEST_P(LockSemanticsTest, FrozenLockdDoesNotCostClientsTheirLeases) {
  RawConnection holder = Raw();
  const uint64_t session = holder.HelloAndOpenSession(absl::Milliseconds(500));
  const uint64_t token = RawAcquire(holder, session, "s", absl::Milliseconds(500)).acquire().token();
  ASSERT_EQ(kill(lockd_.pid(), SIGSTOP), 0);
  absl::SleepFor(absl::Milliseconds(1500));
  wire::Request ka = request::KeepAlive(session, "s", token);
  ka.set_request_id(77);
  ASSERT_TRUE(holder.SendRequest(ka));
  ASSERT_EQ(kill(lockd_.pid(), SIGCONT), 0);
  auto reply = holder.ReadResponse();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->code(), wire::OK) << reply->message();
  ASSERT_EQ(reply->keep_alive().lock_codes_size(), 1);
  EXPECT_EQ(reply->keep_alive().lock_codes(0), wire::OK);
  EXPECT_EQ(Stats().fenced_out_total(), 0u);
}

TEST(StallCompensationTest, DisabledTheFrozenLockdExpiresTheSessionOnWaking) {
  LockdProcess lockd({.extra_args = {"--stall-threshold=0"}});
  RawConnection holder = RawConnection::Tcp(lockd.port());
  const uint64_t session = holder.HelloAndOpenSession(absl::Milliseconds(500));
  ASSERT_EQ(kill(lockd.pid(), SIGSTOP), 0);
  absl::SleepFor(absl::Milliseconds(1500));
  wire::Request ka = request::KeepAlive(session);
  ka.set_request_id(78);
  ASSERT_TRUE(holder.SendRequest(ka));
  ASSERT_EQ(kill(lockd.pid(), SIGCONT), 0);
  auto reply = holder.ReadResponse();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->code(), wire::SESSION_NOT_FOUND);
}

TEST_P(LockSemanticsTest, StaleTokenIsFencedOutOnReleaseAndValidate) {
  RawConnection old_holder = Raw();
  const uint64_t session = old_holder.HelloAndOpenSession(absl::Seconds(60));
  const uint64_t stale =
      RawAcquire(old_holder, session, "x", absl::Milliseconds(300)).acquire().token();
  auto b = NewClient();
  auto current = b->acquire("x", absl::Seconds(20));  // granted once the 300 ms lease ends
  ASSERT_TRUE(current.ok()) << current.status();

  wire::Response r = old_holder.Call(request::Release(session, "x", stale));
  EXPECT_EQ(r.code(), wire::FENCED_OUT);
  EXPECT_THAT(r.message(), ::testing::HasSubstr("current token"));

  EXPECT_EQ(old_holder.Call(request::Validate("x", stale)).code(), wire::FENCED_OUT);
  EXPECT_EQ(old_holder.Call(request::Validate("x", current->token())).code(), wire::OK);

  EXPECT_EQ(Stats().fenced_out_total(), 2u);
  EXPECT_NO_THROW(b->checkStillHeld(*current));
  EXPECT_TRUE(b->release(*current).ok());
}

TEST_P(LockSemanticsTest, WaiterWhoseSessionExpiresIsToldAndStopsWaiting) {
  auto a = NewClient();
  auto held = a->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(held.ok());
  RawConnection waiter = Raw();
  const uint64_t session = waiter.HelloAndOpenSession(absl::Milliseconds(300));
  wire::Request acquire = request::Acquire(session, "x", absl::Seconds(60));
  acquire.set_request_id(77);
  ASSERT_TRUE(waiter.SendRequest(acquire));
  auto pushed = waiter.ReadResponse(absl::Seconds(10));
  ASSERT_TRUE(pushed.has_value());
  EXPECT_EQ(pushed->request_id(), 77u);
  EXPECT_EQ(pushed->code(), wire::CANCELLED);
  EXPECT_EQ(Stats().waiters(), 0u);
}

TEST_P(LockSemanticsTest, TryAcquireAndWaitTimeout) {
  auto a = NewClient();
  auto b = NewClient();
  auto held = a->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(held.ok());
  auto busy = b->tryAcquire("x");
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_FALSE(busy->has_value());
  auto timed_out = b->acquire("x", absl::Milliseconds(200));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
  auto again = a->acquire("x", absl::Seconds(1));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a->release(*held).ok());
  auto free_now = b->tryAcquire("x");
  ASSERT_TRUE(free_now.ok());
  ASSERT_TRUE(free_now->has_value());
  EXPECT_GT((*free_now)->token(), held->token());
}

TEST_P(LockSemanticsTest, ClosingTheClientReleasesItsLocksForWaiters) {
  auto b = NewClient();
  uint64_t first_token;
  absl::StatusOr<LockHandle> waited = absl::UnknownError("not run");
  {
    auto a = NewClient();
    auto held = a->acquire("x", absl::Seconds(5));
    ASSERT_TRUE(held.ok());
    first_token = held->token();
    std::thread waiter([&] { waited = b->acquire("x", absl::Seconds(20)); });
    WaitForWaiters(1);
    a.reset();  // closes the session
    waiter.join();
  }
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_GT(waited->token(), first_token);
}

INSTANTIATE_TEST_SUITE_P(Transports, LockSemanticsTest,
                         ::testing::Values(Transport{"tcp", false}, Transport{"unix", true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace fencelock
