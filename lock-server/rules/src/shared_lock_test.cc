// Shared and exclusive modes on one lock name, and the lock delay (ADR 0006), on LockService's
// rules with injected time.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "lock-server/lock_service.h"

namespace fencelock::server {
namespace {

using namespace ::fencelock::id_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

MonoTime At(int ms) { return MonoTime::FromNanos(int64_t{ms} * 1'000'000); }

constexpr AcquireMode kShared{LockMode::kShared, std::nullopt};
constexpr AcquireMode kExclusive{LockMode::kExclusive, std::nullopt};

AcquireMode WithDelay(LockMode mode, absl::Duration delay) { return AcquireMode{mode, delay}; }

class SharedLockTest : public ::testing::Test {
 protected:
  explicit SharedLockTest(ServiceOptions options = {}) : service_(std::move(options)) {}

  SessionId Open(int at_ms, absl::Duration ttl = absl::Seconds(100)) {
    auto s = service_.OpenSession(ttl, At(at_ms));
    EXPECT_TRUE(s.ok()) << s.status();
    return s->first;
  }
  // A grant at once; FenceToken() (0) when the answer is anything else.
  FenceToken Grant(SessionId s, const std::string& lock, int at_ms, const AcquireMode& how,
                   absl::Duration ttl = absl::Seconds(30)) {
    auto r = service_.Acquire(s, lock, ttl, absl::ZeroDuration(), 0, At(at_ms), how);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->kind == AcquireResult::Kind::kGranted ? r->token : FenceToken();
  }
  AcquireResult::Kind Try(SessionId s, const std::string& lock, int at_ms, const AcquireMode& how) {
    auto r = service_.Acquire(s, lock, absl::Seconds(30), absl::ZeroDuration(), 0, At(at_ms), how);
    EXPECT_TRUE(r.ok()) << r.status();
    return r->kind;
  }
  void Queue(SessionId s, const std::string& lock, WaiterId waiter, int at_ms,
             const AcquireMode& how, absl::Duration wait = absl::Seconds(60)) {
    auto r = service_.Acquire(s, lock, absl::Seconds(30), wait, waiter, At(at_ms), how);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->kind, AcquireResult::Kind::kQueued);
  }
  // The waiters granted since the last call, in grant order.
  std::vector<WaiterId> Granted() {
    std::vector<WaiterId> out;
    for (const WaiterOutcome& o : service_.TakeWaiterOutcomes()) {
      if (o.status.ok()) out.push_back(o.waiter);
    }
    return out;
  }
  size_t Holders(const std::string& lock) const {
    const LockState* l = service_.state().FindLock(lock);
    return l == nullptr ? 0 : l->holders().size();
  }

  LockService service_;
};

TEST_F(SharedLockTest, EightReadersHoldAtOnceWhileAWriterWaitsThenTheWriterIsGranted) {
  std::vector<SessionId> readers;
  std::vector<FenceToken> tokens;
  for (int i = 0; i < 8; ++i) {
    readers.push_back(Open(0));
    tokens.push_back(Grant(readers.back(), "r", 1 + i, kShared));
    ASSERT_NE(tokens.back(), 0_token) << "reader " << i;
  }
  EXPECT_EQ(Holders("r"), 8u);
  EXPECT_EQ(service_.state().FindLock("r")->mode(), LockMode::kShared);
  EXPECT_EQ(service_.state().held_lock_count(), 1u);
  const SessionId writer = Open(0);
  Queue(writer, "r", 100, 20, kExclusive);
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(service_.Release(readers[i], "r", tokens[i], At(30 + i)).ok());
    EXPECT_TRUE(Granted().empty()) << "granted with " << 7 - i << " readers left";
  }
  ASSERT_TRUE(service_.Release(readers[7], "r", tokens[7], At(40)).ok());
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiter, 100u);
  // A writer's token is above every token granted before it, readers' included.
  EXPECT_GT(out[0].token, tokens.back());
  EXPECT_EQ(service_.state().FindLock("r")->mode(), LockMode::kExclusive);
  EXPECT_EQ(service_.stats().grants_total, 9u);
  EXPECT_EQ(service_.stats().shared_grants_total, 8u);
}

TEST_F(SharedLockTest, NewReadersQueueBehindAWaitingWriter) {
  const SessionId r1 = Open(0), w = Open(0), r2 = Open(0), r3 = Open(0);
  const FenceToken t1 = Grant(r1, "x", 1, kShared);
  Queue(w, "x", 10, 2, kExclusive);
  // The lock is held shared, but a writer waits: no barging past it.
  EXPECT_EQ(Try(r2, "x", 3, kShared), AcquireResult::Kind::kBusy);
  Queue(r2, "x", 20, 4, kShared);
  Queue(r3, "x", 30, 5, kShared);
  EXPECT_THAT(service_.QueuedModes("x"),
              ElementsAre(LockMode::kExclusive, LockMode::kShared, LockMode::kShared));
  ASSERT_TRUE(service_.Release(r1, "x", t1, At(6)).ok());
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiter, 10u);
  ASSERT_TRUE(service_.Release(w, "x", out[0].token, At(7)).ok());
  // The consecutive readers are granted together.
  EXPECT_THAT(Granted(), ElementsAre(20u, 30u));
  EXPECT_EQ(Holders("x"), 2u);
}

TEST_F(SharedLockTest, ReadersAreBatchedUpToTheNextWriterInLine) {
  const SessionId w1 = Open(0), r1 = Open(0), r2 = Open(0), w2 = Open(0), r3 = Open(0);
  const FenceToken tw = Grant(w1, "x", 1, kExclusive);
  EXPECT_EQ(Try(r1, "x", 2, kShared), AcquireResult::Kind::kBusy);
  Queue(r1, "x", 1, 3, kShared);
  Queue(r2, "x", 2, 4, kShared);
  Queue(w2, "x", 3, 5, kExclusive);
  Queue(r3, "x", 4, 6, kShared);
  ASSERT_TRUE(service_.Release(w1, "x", tw, At(7)).ok());
  EXPECT_THAT(Granted(), ElementsAre(1u, 2u));
  EXPECT_THAT(service_.QueuedSessions("x"), ElementsAre(w2, r3));
}

TEST_F(SharedLockTest, AWriterThatStopsWaitingLetsTheReadersBehindItJoin) {
  const SessionId r1 = Open(0), w = Open(0), r2 = Open(0);
  Grant(r1, "x", 1, kShared);
  Queue(w, "x", 10, 2, kExclusive, absl::Seconds(1));
  Queue(r2, "x", 20, 3, kShared);
  service_.Advance(At(1002));  // the writer's wait ran out at 1002
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].waiter, 10u);
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(out[1].waiter, 20u);
  EXPECT_TRUE(out[1].status.ok());
  EXPECT_EQ(Holders("x"), 2u);
}

TEST_F(SharedLockTest, AWithdrawnOrClosedWriterLetsTheReadersBehindItJoin) {
  const SessionId r1 = Open(0), w = Open(0), r2 = Open(0), w2 = Open(0), r3 = Open(0);
  Grant(r1, "x", 1, kShared);
  Queue(w, "x", 10, 2, kExclusive);
  Queue(r2, "x", 20, 3, kShared);
  ASSERT_TRUE(*service_.Withdraw(10, w, At(4)));
  EXPECT_THAT(Granted(), ElementsAre(20u));
  Queue(w2, "x", 30, 5, kExclusive);
  Queue(r3, "x", 40, 6, kShared);
  ASSERT_TRUE(service_.CloseSession(w2, At(7)).ok());
  EXPECT_THAT(Granted(), ElementsAre(40u));
  service_.CancelWaiter(40);  // already granted: nothing to do
  EXPECT_EQ(Holders("x"), 3u);
}

TEST_F(SharedLockTest, EachReaderIsItsOwnLeaseUnderFenceOne) {
  const SessionId a = Open(0), b = Open(0);
  const FenceToken ta = Grant(a, "x", 1, kShared);
  const FenceToken tb = Grant(b, "x", 2, kShared);
  EXPECT_TRUE(service_.Validate("x", ta, At(3)).ok());
  EXPECT_TRUE(service_.Validate("x", tb, At(3), b).ok());
  // b cannot use a's token, nor release it.
  EXPECT_EQ(service_.Validate("x", ta, At(3), b).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(service_.Release(b, "x", ta, At(4)).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(service_.Release(a, "x", ta, At(5)).ok());
  const absl::Status stale = service_.Validate("x", ta, At(6), a);
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale.message(), HasSubstr("current token"));
  EXPECT_TRUE(service_.Validate("x", tb, At(6)).ok());
  // Renewal names each holder's own token.
  std::vector<LockRef> refs = {{"x", tb}};
  auto renewed = service_.KeepAlive(b, refs, At(25'000));
  ASSERT_TRUE(renewed.ok());
  EXPECT_TRUE((*renewed)[0].ok());
  service_.Advance(At(40'000));  // b's lease renewed at 25 s runs to 55 s
  EXPECT_EQ(Holders("x"), 1u);
}

TEST_F(SharedLockTest, ASessionHoldsALockOnceInEitherMode) {
  const SessionId a = Open(0);
  const FenceToken t = Grant(a, "x", 1, kShared);
  for (const AcquireMode& how : {kShared, kExclusive}) {
    auto r = service_.Acquire(a, "x", absl::Seconds(30), absl::Seconds(1), 9, At(2), how);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("token ", t)));
  }
}

// Found by the simulator: one session's two Acquires of one lock waiting one behind the other
// (the client gave up on the first, and lockd had not yet timed it out). Granted together as a
// batch of readers, the session would hold the lock twice; the second waits for the session's
// own hold to end, as it always did for exclusive locks.
TEST_F(SharedLockTest, ASessionsSecondWaiterWaitsForItsOwnHoldToEnd) {
  const SessionId w = Open(0), s = Open(0), other = Open(0);
  const FenceToken tw = Grant(w, "x", 1, kExclusive);
  Queue(s, "x", 1, 2, kShared);
  Queue(s, "x", 2, 3, kShared);
  Queue(other, "x", 3, 4, kShared);
  ASSERT_TRUE(service_.Release(w, "x", tw, At(5)).ok());
  EXPECT_THAT(Granted(), ElementsAre(1u));
  const FenceToken ts = service_.state().FindLock("x")->FindSession(s)->token;
  ASSERT_TRUE(service_.Release(s, "x", ts, At(6)).ok());
  EXPECT_THAT(Granted(), ElementsAre(2u, 3u));
  EXPECT_EQ(Holders("x"), 2u);
}

TEST_F(SharedLockTest, TheStateRefusesASharedGrantWhileAnExclusiveHolds) {
  // What a planted bug in the rules would make the state apply: Check refuses it by name.
  const SessionId a = Open(0), b = Open(0);
  Grant(a, "x", 1, kExclusive);
  StateMachine copy = service_.state();
  const absl::Status s = copy.Check(record::LockGranted{
      "x", b, copy.last_token() + 1, absl::Seconds(1), LockMode::kShared, absl::ZeroDuration()});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("while held exclusive"));
  const SessionId c = Open(2);
  Grant(c, "y", 3, kShared);
  copy = service_.state();
  EXPECT_THAT(copy.Check(record::LockGranted{"y", b, copy.last_token() + 1, absl::Seconds(1)})
                  .message(),
              HasSubstr("grant of held lock y"));
}

// A lock state keeps one holder in place and moves to a second allocation for several holders
// or a delay (state_machine.h): each transition keeps the holders in token order, the indexes
// (the sessions' locks, the expiry index) in step, and a copy of the state independent of it.
TEST_F(SharedLockTest, HoldersMoveBetweenOneAndManyWithTheIndexesInStep) {
  const SessionId a = Open(0), b = Open(0), c = Open(0);
  const FenceToken ta = Grant(a, "x", 1, kShared);
  const FenceToken tb = Grant(b, "x", 2, kShared, absl::Seconds(5));
  const FenceToken tc = Grant(c, "x", 3, kShared);
  const StateMachine before = service_.state();
  ASSERT_TRUE(service_.Release(b, "x", tb, At(4)).ok());
  const LockState* x = service_.state().FindLock("x");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->name(), "x");
  ASSERT_EQ(x->holders().size(), 2u);
  EXPECT_EQ(x->holders()[0].token, ta);
  EXPECT_EQ(x->holders()[1].token, tc);
  ASSERT_TRUE(service_.Release(a, "x", ta, At(5)).ok());
  ASSERT_EQ(Holders("x"), 1u);
  EXPECT_EQ(service_.state().FindHolder("x")->token, tc);
  EXPECT_EQ(service_.state().FindSession(c)->locks.size(), 1u);
  EXPECT_TRUE(service_.state().FindSession(a)->locks.empty());
  // The copy taken before still has all three, each in its session's locks, and its own
  // expiry index: b's 5 s lease runs out in it and not in the service's state.
  ASSERT_NE(before.FindLock("x"), nullptr);
  EXPECT_EQ(before.FindLock("x")->holders().size(), 3u);
  EXPECT_TRUE(before.FindSession(b)->locks.contains(std::string_view("x")));
  EXPECT_EQ(before.ExpiredLock(At(2 + 5'000)),
            std::make_optional(std::make_pair(std::string("x"), tb)));
  EXPECT_EQ(service_.state().ExpiredLock(At(2 + 5'000)), std::nullopt);
  // The last holder leaves: the name is forgotten.
  ASSERT_TRUE(service_.Release(c, "x", tc, At(6)).ok());
  EXPECT_EQ(service_.state().FindLock("x"), nullptr);
  EXPECT_TRUE(service_.state().locks().empty());
  EXPECT_EQ(service_.state().DebugString(), absl::StrCat("s", a, "/1m40s s", b, "/1m40s s", c,
                                                         "/1m40s"));
}

class LockDelayTest : public SharedLockTest {
 protected:
  LockDelayTest()
      : SharedLockTest(ServiceOptions{.default_lock_delay = absl::Seconds(5),
                                      .max_lock_delay = absl::Seconds(10)}) {}
};

TEST_F(LockDelayTest, ALostHolderDelaysTheNextGrantByItsDelay) {
  const SessionId a = Open(0), b = Open(0);
  const FenceToken ta = Grant(a, "x", 0, kExclusive, absl::Seconds(1));
  Queue(b, "x", 7, 10, kExclusive);
  service_.Advance(At(1000));  // a's lease ends: a loss
  EXPECT_TRUE(Granted().empty());
  EXPECT_EQ(service_.stats().lock_delays_started_total, 1u);
  EXPECT_EQ(service_.stats().lock_delay_blocked_acquires_total, 1u);  // b, first in line
  EXPECT_EQ(service_.state().FindLock("x")->DelayedUntil(LockMode::kShared), At(6000));
  service_.Advance(At(5999));
  EXPECT_TRUE(Granted().empty());
  service_.Advance(At(6000));
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_GT(out[0].token, ta);
  // The name is kept only while it is held or delayed.
  ASSERT_TRUE(service_.Release(b, "x", out[0].token, At(6001)).ok());
  EXPECT_EQ(service_.state().FindLock("x"), nullptr);
}

TEST_F(LockDelayTest, ACleanReleaseStartsNoDelay) {
  const SessionId a = Open(0), b = Open(0);
  const FenceToken ta = Grant(a, "x", 0, kExclusive);
  ASSERT_TRUE(service_.Release(a, "x", ta, At(10)).ok());
  EXPECT_NE(Grant(b, "x", 11, kExclusive), 0_token);
  EXPECT_EQ(service_.stats().lock_delays_started_total, 0u);
}

TEST_F(LockDelayTest, ASessionThatEndsIsALossAndDelays) {
  const SessionId a = Open(0), b = Open(0);
  Grant(a, "x", 0, WithDelay(LockMode::kExclusive, absl::Seconds(2)));
  ASSERT_TRUE(service_.CloseSession(a, At(100)).ok());
  EXPECT_EQ(Try(b, "x", 101, kShared), AcquireResult::Kind::kBusy);
  EXPECT_EQ(service_.stats().lock_delay_blocked_acquires_total, 1u);
  EXPECT_EQ(Try(b, "x", 2099, kExclusive), AcquireResult::Kind::kBusy);
  EXPECT_NE(Grant(b, "x", 2100, kExclusive), 0_token);
}

TEST_F(LockDelayTest, ALostReaderDelaysWritersOnly) {
  const SessionId r1 = Open(0), r2 = Open(0), w = Open(0), r3 = Open(0);
  Grant(r1, "x", 0, kShared, absl::Seconds(1));
  const FenceToken t2 = Grant(r2, "x", 0, kShared, absl::Seconds(60));
  service_.Advance(At(1000));  // r1 lost
  ASSERT_TRUE(service_.Release(r2, "x", t2, At(1500)).ok());
  // Readers are still granted; a writer waits for the end of r1's delay (6 s).
  EXPECT_EQ(Try(w, "x", 1600, kExclusive), AcquireResult::Kind::kBusy);
  const FenceToken t3 = Grant(r3, "x", 1700, kShared);
  ASSERT_NE(t3, 0_token);
  ASSERT_TRUE(service_.Release(r3, "x", t3, At(1800)).ok());
  Queue(w, "x", 5, 1900, kExclusive);
  service_.Advance(At(5999));
  EXPECT_TRUE(Granted().empty());
  service_.Advance(At(6000));
  EXPECT_THAT(Granted(), ElementsAre(5u));
}

TEST_F(LockDelayTest, AQueuedReaderWaitsOutALostWritersDelayThenItsBatchIsGranted) {
  const SessionId w = Open(0), r1 = Open(0), r2 = Open(0);
  Grant(w, "x", 0, WithDelay(LockMode::kExclusive, absl::Seconds(1)), absl::Seconds(1));
  Queue(r1, "x", 1, 10, kShared);
  Queue(r2, "x", 2, 20, kShared);
  service_.Advance(At(1999));
  EXPECT_TRUE(Granted().empty());
  EXPECT_EQ(service_.stats().lock_delay_blocked_acquires_total, 2u);  // the batch of readers
  service_.Advance(At(2000));
  EXPECT_THAT(Granted(), ElementsAre(1u, 2u));
}

TEST_F(LockDelayTest, ADelayAboveTheBoundIsRefusedNamingTheFlag) {
  const SessionId a = Open(0);
  auto r = service_.Acquire(a, "x", absl::Seconds(30), absl::ZeroDuration(), 0, At(1),
                            WithDelay(LockMode::kShared, absl::Seconds(11)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("--max-lock-delay"));
  r = service_.Acquire(a, "x", absl::Seconds(30), absl::ZeroDuration(), 0, At(1),
                       WithDelay(LockMode::kShared, -absl::Seconds(1)));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.state().FindLock("x"), nullptr);
}

TEST_F(LockDelayTest, AZeroDelayOnTheAcquireOverridesTheDefault) {
  const SessionId a = Open(0), b = Open(0);
  Grant(a, "x", 0, WithDelay(LockMode::kExclusive, absl::ZeroDuration()), absl::Seconds(1));
  service_.Advance(At(1000));
  EXPECT_NE(Grant(b, "x", 1000, kExclusive), 0_token);
  EXPECT_EQ(service_.stats().lock_delays_started_total, 0u);
}

TEST_F(LockDelayTest, ARestoredStateGivesEveryPendingDelayInFull) {
  const SessionId a = Open(0);
  Grant(a, "x", 0, kExclusive, absl::Seconds(1));
  service_.Advance(At(1000));  // delay to 6000
  StateMachine restored = service_.state();
  restored.RestartLeases(At(4000));  // a restart at 4 s: the delay runs 5 s from there
  EXPECT_EQ(restored.FindLock("x")->DelayedUntil(LockMode::kExclusive), At(9000));
  restored.RestartLeases(At(1000));  // never shorter
  EXPECT_EQ(restored.FindLock("x")->DelayedUntil(LockMode::kExclusive), At(9000));
}

}  // namespace
}  // namespace fencelock::server
