// ADR-006 D1, D2, D3 and D5 through real bytes: a real lockd, the real client, a fault proxy
// in between, and a simulated client clock that moves only when the test moves it. The
// server keeps real time; its TTLs here are long unless a test is about the server's expiry.
#include <atomic>
#include <future>
#include <mutex>
#include <cstdlib>
#include <new>
#include <thread>

#include "absl/synchronization/notification.h"
#include "harness/fault_proxy.h"
#include "fencelock/wire.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "raw_connection.h"

// Counts heap allocations made by the test thread while counting is on, to prove that
// checkStillHeld allocates nothing.
namespace {
thread_local bool g_counting = false;
thread_local int g_allocations = 0;
}  // namespace

// The replacements below are a matched pair (malloc/free); GCC cannot see that.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_counting) ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace fencelock {
namespace {

using Dir = harness::FaultProxy::Direction;
using Mode = harness::FaultProxy::Mode;
using harness::FaultProxy;
using testing::LockdProcess;

constexpr absl::Duration kLockTtl = absl::Seconds(30);
constexpr absl::Duration kUsable = absl::Seconds(21);  // 30 s × (1 − 0.30)

class ClientLeaseTest : public ::testing::Test {
 protected:
  ClientLeaseTest() : proxy_(lockd_.port()) {}

  // The heartbeat period is long enough that the test drives every heartbeat (real time never
  // reaches it); it also decides when a late grant is renewed before it is returned.
  std::unique_ptr<Client> NewClient(absl::Duration session_ttl = absl::Seconds(60),
                                    absl::Duration request_timeout = absl::Seconds(10),
                                    absl::Duration heartbeat_interval = absl::Hours(1),
                                    std::vector<StepCost> steps = {},
                                    std::function<void(LogLevel, const std::string&)> log = nullptr) {
    ClientOptions options;
    options.steps = std::move(steps);
    options.log = std::move(log);
    options.server = "127.0.0.1:" + std::to_string(proxy_.port());
    options.clock = &clock_;
    options.session_ttl = session_ttl;
    options.default_lock_ttl = kLockTtl;
    options.heartbeat_interval = heartbeat_interval;
    options.request_timeout = request_timeout;
    auto client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }
  std::unique_ptr<Client> DirectRealClient() {
    ClientOptions options;
    options.server = lockd_.tcp_address();
    auto client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }
  static LossReason ReasonThrown(const Client& client, const LockHandle& handle) {
    try {
      client.checkStillHeld(handle);
    } catch (const LockLostException& e) {
      return e.reason();
    }
    return LossReason::kNone;
  }
  uint64_t Waiters() {
    auto admin = testing::RawConnection::Tcp(lockd_.port());
    admin.Hello();
    const wire::Request r = testing::request::GetStats();
    return admin.Call(r).stats().waiters();
  }

  LockdProcess lockd_;
  FaultProxy proxy_;
  SimulatedClock clock_;
};

TEST_F(ClientLeaseTest, D1DeadlineIsSendPlusTtlTimesOneMinusMargin) {
  auto client = NewClient();
  const MonoTime t_send = clock_.Now();
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_EQ(client->remaining(*lock), kUsable);
  clock_.Set(t_send + kUsable - absl::Nanoseconds(1));
  EXPECT_NO_THROW(client->checkStillHeld(*lock));
  clock_.Set(t_send + kUsable);
  EXPECT_EQ(ReasonThrown(*client, *lock), LossReason::kDeadlinePassed);
  EXPECT_EQ(client->remaining(*lock), absl::ZeroDuration());
}

TEST_F(ClientLeaseTest, D1ShorterSessionLeaseBoundsTheLock) {
  auto client = NewClient(/*session_ttl=*/absl::Seconds(10));
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  // The lock is valid only while its session is: 10 s × 0.7 from the session's open.
  EXPECT_EQ(client->remaining(*lock), absl::Seconds(7));
}

TEST_F(ClientLeaseTest, D2StalledKeepAliveReplyIsMeasuredFromTheSend) {
  auto client = NewClient();
  const MonoTime t0 = clock_.Now();
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();

  clock_.Advance(absl::Seconds(5));
  proxy_.Set(Dir::kToClient, Mode::kHold);
  absl::Status renewed = absl::UnknownError("not run");
  std::thread heartbeat([&] { renewed = client->renewNow(); });
  // The keep-alive went out at t0+5 s; its reply is now held by the proxy.
  while (proxy_.bytes_held(Dir::kToClient) == 0) absl::SleepFor(absl::Milliseconds(1));
  clock_.Advance(absl::Seconds(2));  // the reply arrives 2 s after it was sent
  proxy_.Release(Dir::kToClient);
  heartbeat.join();
  ASSERT_TRUE(renewed.ok()) << renewed;

  // Measured from the send (t0+5 s), not from the arrival (t0+7 s).
  clock_.Set(t0 + absl::Seconds(5) + kUsable - absl::Nanoseconds(1));
  EXPECT_NO_THROW(client->checkStillHeld(*lock));
  clock_.Set(t0 + absl::Seconds(5) + kUsable);
  EXPECT_EQ(ReasonThrown(*client, *lock), LossReason::kDeadlinePassed);
}

TEST_F(ClientLeaseTest, D3CheckStillHeldDoesNotWaitForAStuckHeartbeatNorAllocate) {
  auto client = NewClient();
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  proxy_.Set(Dir::kToClient, Mode::kHold);
  std::thread heartbeat([&] { (void)client->renewNow(); });
  while (proxy_.bytes_held(Dir::kToClient) == 0) absl::SleepFor(absl::Milliseconds(1));
  // A heartbeat is in flight and stuck. checkStillHeld answers anyway, without allocating.
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 1000; ++i) client->checkStillHeld(*lock);
  g_counting = false;
  EXPECT_EQ(g_allocations, 0);
  proxy_.Release(Dir::kToClient);
  heartbeat.join();
}

TEST_F(ClientLeaseTest, D5FailedHeartbeatNeverExtendsAndTheDeadlineStillEndsTheLock) {
  // The timeout ends the held renewal below; it must also outlast the durable OpenSession and
  // Acquire before it on a loaded machine (300 ms once did not, in an ASan CI run).
  auto client = NewClient(absl::Seconds(60), /*request_timeout=*/absl::Seconds(2));
  const MonoTime t0 = clock_.Now();
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  clock_.Advance(absl::Seconds(10));
  proxy_.Set(Dir::kToClient, Mode::kHold);  // replies never come back in time
  // The request timeout runs on the client's clock: 2 s of it pass while the answer is held.
  std::thread waiting([&] {
    while (proxy_.bytes_held(Dir::kToClient) == 0) absl::SleepFor(absl::Milliseconds(1));
    clock_.Advance(absl::Seconds(2));
  });
  absl::Status renewed = client->renewNow();
  waiting.join();
  EXPECT_EQ(renewed.code(), absl::StatusCode::kDeadlineExceeded) << renewed;
  EXPECT_EQ(client->remaining(*lock), absl::Seconds(9));  // still t0 + 21 s

  // The server still holds the lock (its lease is 30 s of real time), but at the client's
  // deadline the client stops believing it holds it.
  clock_.Set(t0 + kUsable);
  EXPECT_EQ(ReasonThrown(*client, *lock), LossReason::kDeadlinePassed);

  // A renewal that succeeds afterwards does not bring the lock back.
  proxy_.Release(Dir::kToClient);
  ASSERT_TRUE(client->renewNow().ok());
  EXPECT_EQ(ReasonThrown(*client, *lock), LossReason::kDeadlinePassed);
}

// Issue 13, finding 5: the client gives a lock up at its deadline while its requests are lost,
// so lockd never hears the relinquish and the session still holds the lock there. The next
// acquire of that name used to fail with INVALID_ARGUMENT "session already holds lock".
TEST_F(ClientLeaseTest, ALockGivenUpWhileCutOffIsReleasedBeforeItIsAcquiredAgain) {
  auto client = NewClient(/*session_ttl=*/absl::Seconds(60),
                          /*request_timeout=*/absl::Seconds(1));
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  proxy_.Set(Dir::kToServer, Mode::kDrop);  // nothing the client sends arrives
  clock_.Advance(kUsable + absl::Seconds(1));  // the client's deadline passes; lockd's has not
  EXPECT_EQ(ReasonThrown(*client, *lock), LossReason::kDeadlinePassed);
  // The heartbeat gives the lock up (its relinquish is dropped) and then times out, once its
  // request timeout passes on the client's clock; so do redials' backoffs. The clock moves
  // 2.5 times as fast as real time until the lock is acquired again.
  std::atomic<bool> moving{true};
  std::thread mover([&] {
    while (moving) {
      absl::SleepFor(absl::Milliseconds(20));
      clock_.Advance(absl::Milliseconds(50));
    }
  });
  EXPECT_FALSE(client->renewNow().ok());
  proxy_.CutAll();
  proxy_.Set(Dir::kToServer, Mode::kPass);
  auto again = client->acquire("x", absl::Seconds(5));
  // The client may notice the cut only when it next writes; then the next attempt reconnects.
  if (absl::IsUnavailable(again.status())) again = client->acquire("x", absl::Seconds(5));
  moving = false;
  mover.join();
  ASSERT_TRUE(again.ok()) << again.status();  // was INVALID_ARGUMENT: "already holds lock"
  EXPECT_GT(again->token(), lock->token());
  EXPECT_NO_THROW(client->checkStillHeld(*again));
}

TEST_F(ClientLeaseTest, D5ServerSayingTheSessionIsGoneLosesTheLockAtOnce) {
  // Server time is real here: the session lives 500 ms on lockd. The request timeout only has
  // to outlast a durable OpenSession on a loaded machine (200 ms once did not, in CI).
  auto client = NewClient(/*session_ttl=*/absl::Milliseconds(500),
                          /*request_timeout=*/absl::Seconds(2));
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  proxy_.Set(Dir::kToServer, Mode::kDrop);
  absl::SleepFor(absl::Milliseconds(800));  // the session expires on lockd
  // The client clock has not moved: by its own arithmetic the lease is still good.
  EXPECT_GT(client->remaining(*lock), absl::ZeroDuration());
  proxy_.Set(Dir::kToServer, Mode::kPass);
  proxy_.CutAll();
  // The client reconnects at once; resuming, it hears that lockd no longer has the session,
  // and the lock is lost then, whatever its own arithmetic says.
  LossReason reason = LossReason::kNone;
  for (int i = 0; i < 1000 && reason == LossReason::kNone; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    reason = ReasonThrown(*client, *lock);
  }
  EXPECT_EQ(reason, LossReason::kSessionLost);
  EXPECT_EQ(client->remaining(*lock), absl::ZeroDuration());
  // The client opens a new session for the next acquire.
  auto again = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(again->token(), lock->token());
}

// After a stall of the client (or of lockd, or of the network) the client's own deadline for
// its session has passed while lockd still holds the session. A new grant under that deadline
// would be lost the moment it arrived, so acquire renews the session first.
TEST_F(ClientLeaseTest, AcquireAfterTheSessionDeadlinePassedRenewsFirst) {
  // A period shorter than the usable lock lease, as in production, so the grant is not renewed
  // for being late (which would hide the stale session deadline).
  auto client = NewClient(/*session_ttl=*/absl::Seconds(60), absl::Seconds(10),
                          /*heartbeat_interval=*/absl::Seconds(20));
  auto first = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t session = client->sessionId();
  clock_.Advance(absl::Seconds(50));  // the client's clock only: lockd's session lives on
  auto next = client->acquire("y", absl::Seconds(5));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(client->sessionId(), session);  // renewed, not replaced
  EXPECT_NO_THROW(client->checkStillHeld(*next));
  EXPECT_EQ(ReasonThrown(*client, *first), LossReason::kDeadlinePassed);
}

TEST_F(ClientLeaseTest, AcquireRenewsFirstWhenTheSessionLeaseNoLongerCoversAStep) {
  // After a stall (here: the client's clock moves 30 s with no heartbeat, as when lockd was
  // stopped), the session has 42 − 30 = 12 s of usable lease left: not run out, but less than
  // the declared 15 s step. A lock granted under it could not start that step.
  const StepCost submit{"submit", absl::Seconds(15)};
  auto client = NewClient(/*session_ttl=*/absl::Seconds(60), absl::Seconds(10),
                          /*heartbeat_interval=*/absl::Seconds(2), {submit});
  auto first = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t session = client->sessionId();
  clock_.Advance(absl::Seconds(30));
  auto next = client->acquire("y", absl::Seconds(5));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(client->sessionId(), session);  // renewed, not replaced
  EXPECT_EQ(client->remaining(*next), kUsable);  // the lock's own lease, not the old session's
  EXPECT_NO_THROW(client->beginIrreversibleStep(*next, submit));
}

TEST_F(ClientLeaseTest, AFailedHeartbeatIsTriedAgainSoonerThanThePeriod) {
  // A 2 s period and requests that give up after 100 ms, on the client's clock. While lockd's
  // answers do not arrive, every heartbeat fails: tried again only at the period, 4 s would see
  // at most two tries; from 20 ms, doubling, they see at least five, so that leases are
  // renewed soon after lockd answers again.
  auto client = NewClient(absl::Seconds(60), absl::Milliseconds(100), absl::Seconds(2));
  auto held = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(held.ok()) << held.status();
  metrics::Counter& failures = client->metrics()->GetCounter(
      "lock_heartbeat_failures_total", "Heartbeats that failed or timed out (D5)");
  proxy_.Set(Dir::kToClient, Mode::kHold);
  const double before = failures.value();
  for (int step = 0; step < 400; ++step) {  // 4 s in 10 ms steps, each given time to act on
    clock_.Advance(absl::Milliseconds(10));
    absl::SleepFor(absl::Milliseconds(2));
  }
  const double tries = failures.value() - before;
  proxy_.CutAll();
  proxy_.Release(Dir::kToClient);
  EXPECT_GE(tries, 5) << "failed heartbeats were tried again only at the period";
}

TEST_F(ClientLeaseTest, D5FencedOutAnswerLosesTheLockAtOnce) {
  auto client = NewClient();
  auto lock = client->acquire("x", absl::Seconds(5), absl::Milliseconds(300));
  ASSERT_TRUE(lock.ok()) << lock.status();
  auto other = DirectRealClient();
  auto taken = other->acquire("x", absl::Seconds(10));  // after lockd expires the 300 ms lease
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_GT(client->remaining(*lock), absl::ZeroDuration());  // simulated time stood still
  EXPECT_EQ(client->renewNow().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ReasonThrown(*client, *lock), LossReason::kFencedOut);
}

TEST_F(ClientLeaseTest, GrantAfterLongQueueIsRenewedAndMeasuredFromTheRenewal) {
  auto holder = DirectRealClient();
  auto held = holder->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(held.ok());
  auto client = NewClient();
  absl::StatusOr<LockHandle> waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = client->acquire("x", absl::Seconds(60)); });
  while (Waiters() != 1) absl::SleepFor(absl::Milliseconds(2));
  // 25 s pass on the client's clock while it queues: more than the 21 s usable lease.
  clock_.Advance(absl::Seconds(25));
  const MonoTime renewal_send = clock_.Now();
  ASSERT_TRUE(holder->release(*held).ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(client->remaining(*waited), kUsable);  // renewal_send + 21 s
  clock_.Set(renewal_send + kUsable);
  EXPECT_EQ(ReasonThrown(*client, *waited), LossReason::kDeadlinePassed);
}

TEST_F(ClientLeaseTest, ReleaseEndsTheHandleAndStaleReleaseIsFencedOut) {
  auto client = NewClient();
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok());
  LockHandle copy = *lock;
  ASSERT_TRUE(client->release(*lock).ok());
  EXPECT_EQ(ReasonThrown(*client, copy), LossReason::kReleased);
  EXPECT_EQ(client->release(copy).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ReasonThrown(*client, LockHandle()), LossReason::kEmptyHandle);
}

// C2 §2.7: no ambient deadline. What a call checks is the handle it is given, wherever it is
// called from: there is no thread-local "current lock" for a call to fall back on, and work
// handed a copy of a handle sees that lock's end, not its own thread's state
// (lock_client_has_no_thread_local_state_test checks the library's objects for TLS).
TEST_F(ClientLeaseTest, C27AHandleIsTheSameOnEveryThreadAndNothingIsAmbient) {
  auto client = NewClient();
  const MonoTime t_send = clock_.Now();
  auto a = client->acquire("a", absl::Seconds(5));
  auto b = client->acquire("b", absl::Seconds(5));
  ASSERT_TRUE(a.ok() && b.ok());
  // The thread that holds two locks gets no help for a handle that holds none.
  EXPECT_EQ(ReasonThrown(*client, LockHandle()), LossReason::kEmptyHandle);
  EXPECT_EQ(client->remaining(LockHandle()), absl::ZeroDuration());

  // Another thread, which acquired nothing, sees the same lease through the same handle.
  absl::Duration remaining_there;
  LossReason reason_there = LossReason::kUnconfirmed;
  std::thread([&] {
    remaining_there = client->remaining(*a);
    reason_there = ReasonThrown(*client, *a);
    client->beginIrreversibleStep(*a, StepCost::Hop("write", absl::Seconds(1)));
  }).join();
  EXPECT_EQ(remaining_there, client->remaining(*a));
  EXPECT_EQ(remaining_there, kUsable - (clock_.Now() - t_send));
  EXPECT_EQ(reason_there, LossReason::kNone);

  // Work started under `b` and handed a copy of its handle: once `b` is released (here from a
  // third thread), the work sees it, although its own thread never released anything and `a` is
  // still held.
  LockHandle given = *b;
  std::thread([&] { EXPECT_TRUE(client->release(*b).ok()); }).join();
  LossReason in_work = LossReason::kUnconfirmed;
  std::thread([&] { in_work = ReasonThrown(*client, given); }).join();
  EXPECT_EQ(in_work, LossReason::kReleased);
  EXPECT_EQ(ReasonThrown(*client, *a), LossReason::kNone);

  // A deadline that passes ends the handle on every thread at once.
  clock_.Set(t_send + kUsable);
  LossReason after_deadline = LossReason::kUnconfirmed;
  std::thread([&] { after_deadline = ReasonThrown(*client, *a); }).join();
  EXPECT_EQ(after_deadline, LossReason::kDeadlinePassed);
  EXPECT_EQ(ReasonThrown(*client, *a), LossReason::kDeadlinePassed);
}

}  // namespace
}  // namespace fencelock

namespace fencelock {
namespace {

// Waits (real time, up to 10 s) for `done`.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 10'000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

// Loss notification through the real client: the heartbeat never runs in these tests (its
// period is an hour of real time), so what fires at the deadline is the client's own timer.
TEST_F(ClientLeaseTest, OnLostFiresAtTheDeadlineWithoutWaitingForAHeartbeat) {
  auto client = NewClient();
  const MonoTime t_send = clock_.Now();
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  std::atomic<int> calls{0};
  std::atomic<LossReason> reason{LossReason::kNone};
  std::atomic<int64_t> fired_at{0};
  ASSERT_TRUE(client
                  ->onLost(*lock,
                           [&](LossReason r) {
                             reason = r;
                             fired_at = clock_.Now().nanos();
                             ++calls;
                           })
                  .ok());
  std::future<LossReason> lost = client->whenLost(*lock);
  clock_.Set(t_send + kUsable - absl::Nanoseconds(1));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(lost.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  clock_.Set(t_send + kUsable);
  ASSERT_TRUE(Eventually([&] { return calls.load() == 1; }));
  EXPECT_EQ(reason.load(), LossReason::kDeadlinePassed);
  EXPECT_EQ(fired_at.load(), (t_send + kUsable).nanos());
  ASSERT_EQ(lost.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(lost.get(), LossReason::kDeadlinePassed);
  clock_.Advance(absl::Hours(1));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(ClientLeaseTest, OnLostNeverFiresForAReleasedLock) {
  auto client = NewClient();
  auto lock = client->acquire("x", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  std::atomic<int> calls{0};
  ASSERT_TRUE(client->onLost(*lock, [&](LossReason) { ++calls; }).ok());
  std::future<LossReason> lost = client->whenLost(*lock);
  ASSERT_TRUE(client->release(*lock).ok());
  clock_.Advance(kUsable * 2);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(calls.load(), 0);
  ASSERT_EQ(lost.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_THROW(lost.get(), std::future_error);  // no reason: the release ended the watch
  EXPECT_FALSE(client->onLost(LockHandle(), [](LossReason) {}).ok());
  EXPECT_EQ(client->whenLost(LockHandle()).get(), LossReason::kEmptyHandle);
}

TEST_F(ClientLeaseTest, OnLostFiresWhenLockdSaysTheTokenIsFencedOut) {
  auto client = NewClient();
  auto lock = client->acquire("x", absl::Seconds(5), absl::Milliseconds(300));
  ASSERT_TRUE(lock.ok()) << lock.status();
  std::future<LossReason> lost = client->whenLost(*lock);
  auto other = DirectRealClient();
  ASSERT_TRUE(other->acquire("x", absl::Seconds(10)).ok());  // lockd expired the 300 ms lease
  EXPECT_EQ(client->renewNow().code(), absl::StatusCode::kAborted);
  ASSERT_EQ(lost.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(lost.get(), LossReason::kFencedOut);  // simulated time stood still
}

TEST_F(ClientLeaseTest, AScopedLockReleasesAtTheEndOfItsScope) {
  auto client = NewClient();
  auto other = DirectRealClient();
  {
    auto guard = client->acquireScoped("x", absl::Seconds(5));
    ASSERT_TRUE(guard.ok()) << guard.status();
    EXPECT_TRUE(guard->owns());
    EXPECT_EQ(guard->lock(), "x");
    EXPECT_GT(guard->token(), 0u);
    EXPECT_NO_THROW(guard->checkStillHeld());
    EXPECT_NO_THROW(guard->beginIrreversibleStep({"step", absl::Seconds(1)}));
    EXPECT_EQ(guard->remaining(), kUsable);
    auto taken = other->tryAcquire("x");
    ASSERT_TRUE(taken.ok());
    EXPECT_FALSE(taken->has_value());  // held by the guard
    auto none = client->tryAcquireScoped("y");
    ASSERT_TRUE(none.ok() && none->has_value());
    auto busy = other->tryAcquire("y");
    ASSERT_TRUE(busy.ok());
    EXPECT_FALSE(busy->has_value());
  }
  auto x = other->tryAcquire("x");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_TRUE(x->has_value()) << "the guard's scope ended without a release";
  auto y = other->tryAcquire("y");
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(y->has_value());
}

TEST_F(ClientLeaseTest, AMovedScopedLockReleasesOnceAndAnEarlyReleaseReports) {
  auto client = NewClient();
  auto guard = client->acquireScoped("x", absl::Seconds(5));
  ASSERT_TRUE(guard.ok()) << guard.status();
  const LockHandle copy = guard->handle();
  ScopedLock moved = *std::move(guard);
  EXPECT_FALSE(guard->owns());
  EXPECT_EQ(guard->release().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THROW(guard->checkStillHeld(), LockLostException);
  EXPECT_EQ(guard->remaining(), absl::ZeroDuration());
  ASSERT_TRUE(moved.owns());
  EXPECT_TRUE(moved.release().ok());
  EXPECT_FALSE(moved.owns());
  EXPECT_EQ(ReasonThrown(*client, copy), LossReason::kReleased);
  // Assigning over a guard releases what it held first.
  auto a = client->acquireScoped("a", absl::Seconds(5));
  auto b = client->acquireScoped("b", absl::Seconds(5));
  ASSERT_TRUE(a.ok() && b.ok());
  const LockHandle a_handle = a->handle();
  *a = *std::move(b);
  EXPECT_EQ(ReasonThrown(*client, a_handle), LossReason::kReleased);
  EXPECT_EQ(a->lock(), "b");
}

TEST_F(ClientLeaseTest, AScopedLockReportsAFailedReleaseToTheLogAndNeverThrows) {
  std::mutex mu;
  std::vector<std::string> logged;
  auto client = NewClient(absl::Seconds(60), absl::Seconds(10), absl::Hours(1), {},
                          [&](LogLevel level, const std::string& line) {
                            std::lock_guard<std::mutex> lock(mu);
                            // The guard's own report; the loss itself is logged too.
                            if (line.find("ScopedLock") != std::string::npos) {
                              EXPECT_EQ(level, LogLevel::kWarning);
                              logged.push_back(line);
                            }
                          });
  {
    auto guard = client->acquireScoped("x", absl::Seconds(5));
    ASSERT_TRUE(guard.ok()) << guard.status();
    clock_.Advance(kUsable);  // the client's deadline passes inside the scope
    EXPECT_THROW(guard->checkStillHeld(), LockLostException);
  }  // the release at scope exit answers kAborted (lost before release): logged, not thrown
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_THAT(logged[0], ::testing::HasSubstr("could not release lock \"x\""));
  EXPECT_THAT(logged[0], ::testing::HasSubstr("deadline_passed"));
}

}  // namespace
}  // namespace fencelock
