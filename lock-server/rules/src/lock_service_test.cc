#include "lock-server/lock_service.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::server {
namespace {

using namespace ::fencelock::id_literals;
using ::testing::HasSubstr;

MonoTime At(int ms) { return MonoTime::FromNanos(int64_t{ms} * 1'000'000); }

class LockServiceTest : public ::testing::Test {
 protected:
  LockServiceTest() : service_(ServiceOptions{}) {}

  SessionId Open(int at_ms, absl::Duration ttl = absl::Seconds(15)) {
    auto s = service_.OpenSession(ttl, At(at_ms));
    EXPECT_TRUE(s.ok()) << s.status();
    return s->first;
  }
  FenceToken Grant(SessionId s, const std::string& lock, int at_ms,
                   absl::Duration ttl = absl::Seconds(30)) {
    auto r = service_.Acquire(s, lock, ttl, absl::ZeroDuration(), 0, At(at_ms));
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->kind, AcquireResult::Kind::kGranted);
    return r->token;
  }

  LockService service_;
};

TEST_F(LockServiceTest, GrantsTakeStrictlyIncreasingTokens) {
  SessionId a = Open(0);
  FenceToken t1 = Grant(a, "x", 1);
  FenceToken t2 = Grant(a, "y", 2);
  ASSERT_TRUE(service_.Release(a, "x", t1, At(3)).ok());
  FenceToken t3 = Grant(a, "x", 4);
  EXPECT_LT(t1, t2);
  EXPECT_LT(t2, t3);
  EXPECT_EQ(service_.stats().grants_total, 3u);
}

TEST_F(LockServiceTest, TryAcquireOnHeldLockIsBusy) {
  SessionId a = Open(0), b = Open(0);
  Grant(a, "x", 1);
  auto r = service_.Acquire(b, "x", absl::ZeroDuration(), absl::ZeroDuration(), 0, At(2));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kind, AcquireResult::Kind::kBusy);
}

TEST_F(LockServiceTest, ReacquireByHolderIsRefused) {
  SessionId a = Open(0);
  Grant(a, "x", 1);
  auto r = service_.Acquire(a, "x", absl::ZeroDuration(), absl::Seconds(1), 7, At(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("already holds"));
}

TEST_F(LockServiceTest, WaitersAreGrantedInArrivalOrderOnRelease) {
  SessionId a = Open(0), b = Open(0), c = Open(0);
  FenceToken ta = Grant(a, "x", 1);
  ASSERT_EQ(service_.Acquire(c, "x", {}, absl::Seconds(10), 300, At(2))->kind,
            AcquireResult::Kind::kQueued);
  ASSERT_EQ(service_.Acquire(b, "x", {}, absl::Seconds(10), 200, At(3))->kind,
            AcquireResult::Kind::kQueued);
  EXPECT_TRUE(service_.TakeWaiterOutcomes().empty());
  ASSERT_TRUE(service_.Release(a, "x", ta, At(4)).ok());
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiter, 300u);  // c queued first
  EXPECT_TRUE(out[0].status.ok());
  EXPECT_GT(out[0].token, ta);
  EXPECT_EQ(service_.state().FindHolder("x")->session, c);
}

TEST_F(LockServiceTest, AThousandWaitersAreServedInOrderOneGrantPerRelease) {
  // Issue 60: each release hands the lock to the first in line and wakes nobody else.
  ServiceOptions options;
  options.max_waiters_per_lock = 1000;
  LockService service(options);
  auto open = [&] { return service.OpenSession(absl::Seconds(60), At(0))->first; };
  SessionId holder = open();
  auto granted = service.Acquire(holder, "x", absl::Seconds(30), {}, 0, At(0));
  ASSERT_TRUE(granted.ok());
  FenceToken token = granted->token;
  std::vector<SessionId> line;
  for (int i = 0; i < 1000; ++i) {
    line.push_back(open());
    auto queued = service.Acquire(line.back(), "x", absl::Seconds(30), absl::Seconds(50),
                                  WaiterId(1000 + i), At(1));
    ASSERT_TRUE(queued.ok()) << queued.status();
    ASSERT_EQ(queued->kind, AcquireResult::Kind::kQueued);
  }
  SessionId releasing = holder;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(service.Release(releasing, "x", token, At(2 + i)).ok());
    auto out = service.TakeWaiterOutcomes();
    ASSERT_EQ(out.size(), 1u) << "release " << i;
    EXPECT_EQ(out[0].waiter, WaiterId(1000 + i));
    ASSERT_TRUE(out[0].status.ok());
    EXPECT_GT(out[0].token, token);
    token = out[0].token;
    releasing = line[i];
    EXPECT_EQ(service.waiters_for("x"), static_cast<size_t>(999 - i));
  }
}

TEST_F(LockServiceTest, SessionExpiryReleasesLocksAndGrantsWaiter) {
  SessionId a = Open(0, absl::Seconds(1));
  SessionId b = Open(0, absl::Seconds(100));
  FenceToken ta = Grant(a, "x", 0);
  ASSERT_EQ(service_.Acquire(b, "x", {}, absl::Seconds(50), 9, At(10))->kind,
            AcquireResult::Kind::kQueued);
  EXPECT_EQ(service_.NextDeadline(), At(1000));
  service_.Advance(At(999));
  EXPECT_TRUE(service_.TakeWaiterOutcomes().empty());
  service_.Advance(At(1000));
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiter, 9u);
  EXPECT_GT(out[0].token, ta);
  EXPECT_EQ(service_.state().FindSession(a), nullptr);
  EXPECT_EQ(service_.stats().session_expiries_total, 1u);
}

TEST_F(LockServiceTest, LockLeaseExpiryGrantsWaiterWhileHolderSessionLives) {
  SessionId a = Open(0, absl::Seconds(100));
  SessionId b = Open(0, absl::Seconds(100));
  FenceToken ta = Grant(a, "x", 0, absl::Milliseconds(300));
  ASSERT_EQ(service_.Acquire(b, "x", {}, absl::Seconds(5), 4, At(1))->kind,
            AcquireResult::Kind::kQueued);
  service_.Advance(At(300));
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].status.ok());
  EXPECT_NE(service_.state().FindSession(a), nullptr);
  EXPECT_EQ(service_.stats().lock_expiries_total, 1u);
  // The old holder's release is stale now.
  absl::Status s = service_.Release(a, "x", ta, At(301));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("FENCED_OUT"));
}

TEST_F(LockServiceTest, KeepAliveRenewsSessionAndLocksFromReceipt) {
  SessionId a = Open(0, absl::Seconds(1));
  FenceToken t = Grant(a, "x", 0, absl::Seconds(1));
  std::vector<LockRef> refs = {{"x", t}};
  auto r = service_.KeepAlive(a, refs, At(900));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 1u);
  EXPECT_TRUE((*r)[0].ok());
  service_.Advance(At(1899));
  EXPECT_NE(service_.state().FindHolder("x"), nullptr);
  service_.Advance(At(1900));
  EXPECT_EQ(service_.state().FindHolder("x"), nullptr);
  EXPECT_EQ(service_.state().FindSession(a), nullptr);
}

TEST_F(LockServiceTest, ARenewRenewsEveryConfirmedLockAndLetsAnUnconfirmedOneRunOut) {
  SessionId a = Open(0, absl::Seconds(10));
  FenceToken x = Grant(a, "x", 0, absl::Seconds(1));
  FenceToken y = Grant(a, "y", 0, absl::Seconds(2));
  FenceToken orphan = Grant(a, "orphan", 0, absl::Seconds(1));  // its client never heard
  std::vector<LockRef> confirm = {{"x", x}, {"y", y}, {"gone", FenceToken(99)}};
  auto r = service_.Renew(a, confirm, At(900));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->held, 3u);
  EXPECT_EQ(r->losses, 0u);
  // Later Renews name nothing, and still renew what was confirmed, each by its own TTL.
  r = service_.Renew(a, {}, At(1800));
  ASSERT_TRUE(r.ok());
  service_.Advance(At(2799));
  EXPECT_NE(service_.state().FindHolder("x"), nullptr);
  EXPECT_EQ(service_.state().FindHolder("orphan"), nullptr);  // ran out at 1000
  // The orphan's end is a loss of the session's, counted (the client learns which by name).
  r = service_.Renew(a, {}, At(2799));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->losses, 1u);
  EXPECT_EQ(r->held, 2u);
  service_.Advance(At(3799));
  EXPECT_EQ(service_.state().FindHolder("x"), nullptr);  // renewed last at 2799, TTL 1 s
  EXPECT_NE(service_.state().FindHolder("y"), nullptr);
  EXPECT_EQ(service_.state().FindSession(a)->losses, 2u);
  (void)orphan;
}

TEST_F(LockServiceTest, ARenewConfirmsNothingOfAnotherSession) {
  SessionId a = Open(0, absl::Seconds(10));
  SessionId b = Open(0, absl::Seconds(10));
  FenceToken tb = Grant(b, "b-lock", 0, absl::Seconds(1));
  std::vector<LockRef> confirm = {{"b-lock", tb}};
  auto r = service_.Renew(a, confirm, At(900));
  ASSERT_TRUE(r.ok());
  service_.Advance(At(1000));
  EXPECT_EQ(service_.state().FindHolder("b-lock"), nullptr);  // not renewed by a's Renew
  EXPECT_EQ(service_.Renew(SessionId(77), {}, At(1000)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(LockServiceTest, PostponedLeasesEndThatMuchLaterAndStillRenew) {
  SessionId a = Open(0, absl::Seconds(1));
  FenceToken t = Grant(a, "x", 0, absl::Seconds(1));
  service_.PostponeLeases(absl::Seconds(5));  // the server did not run for 5 s
  service_.Advance(At(5999));
  ASSERT_NE(service_.state().FindHolder("x"), nullptr);
  std::vector<LockRef> refs = {{"x", t}};
  auto r = service_.KeepAlive(a, refs, At(5999));  // a renewal that waited out the stall
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)[0].ok());
  EXPECT_EQ(service_.stats().fenced_out_total, 0u);
  service_.Advance(At(6998));
  EXPECT_NE(service_.state().FindHolder("x"), nullptr);
  service_.Advance(At(6999));  // a full TTL after that renewal
  EXPECT_EQ(service_.state().FindHolder("x"), nullptr);
  EXPECT_EQ(service_.state().FindSession(a), nullptr);
}

TEST_F(LockServiceTest, KeepAliveFencesStaleLockAndCountsIt) {
  SessionId a = Open(0, absl::Seconds(100));
  SessionId b = Open(0, absl::Seconds(100));
  FenceToken ta = Grant(a, "x", 0, absl::Milliseconds(100));
  service_.Advance(At(200));
  FenceToken tb = Grant(b, "x", 201);
  std::vector<LockRef> refs = {{"x", ta}};
  auto r = service_.KeepAlive(a, refs, At(202));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].code(), absl::StatusCode::kAborted);
  EXPECT_EQ(service_.stats().fenced_out_total, 1u);
  EXPECT_EQ(service_.state().FindHolder("x")->token, tb);
}

TEST_F(LockServiceTest, StrangersStaleTokensAreRefusedButNotCountedAsFencedOut) {
  SessionId a = Open(0, absl::Seconds(100));
  SessionId b = Open(0, absl::Seconds(100));
  SessionId stranger = Open(0, absl::Seconds(100));
  // 2,000 locks that a held and released, one that b holds now.
  std::vector<LockRef> stale;
  for (int i = 0; i < 2000; ++i) {
    const std::string name = absl::StrCat("l", i);
    FenceToken t = Grant(a, name, 1);
    ASSERT_TRUE(service_.Release(a, name, t, At(2)).ok());
    stale.push_back({name, t});
  }
  FenceToken tb = Grant(b, "held", 3);
  stale.push_back({"held", tb});  // the current token, from a session that is not its holder
  auto r = service_.KeepAlive(stranger, stale, At(4));
  ASSERT_TRUE(r.ok());
  for (const absl::Status& s : *r) EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(service_.stats().fenced_out_total, 0u);
  EXPECT_EQ(service_.stats().foreign_tokens_total, 2001u);
  // A token of another lock is foreign too, even when the session held it.
  EXPECT_EQ(service_.Release(a, "held", stale[0].token, At(5)).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(service_.stats().fenced_out_total, 0u);
  // The session that held the token, acting on it after the release, is fenced out.
  EXPECT_EQ(service_.Release(a, "l0", stale[0].token, At(5)).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(service_.stats().fenced_out_total, 1u);
  // Nothing of b's changed.
  EXPECT_EQ(service_.state().FindHolder("held")->token, tb);
}

TEST_F(LockServiceTest, OnlyTheNewestLeaseEndsAreRemembered) {
  ServiceOptions options;
  options.remembered_lease_ends = 2;
  LockService small(options);
  auto a = small.OpenSession(absl::Seconds(100), At(0));
  ASSERT_TRUE(a.ok());
  std::vector<FenceToken> tokens;
  for (int i = 0; i < 3; ++i) {
    auto g = small.Acquire(a->first, "x", {}, {}, 0, At(1));
    ASSERT_TRUE(g.ok());
    tokens.push_back(g->token);
    ASSERT_TRUE(small.Release(a->first, "x", g->token, At(2)).ok());
  }
  EXPECT_FALSE(small.Validate("x", tokens[0], At(3)).ok());  // forgotten: foreign
  EXPECT_EQ(small.stats().foreign_tokens_total, 1u);
  EXPECT_FALSE(small.Validate("x", tokens[2], At(3)).ok());  // remembered: fenced out
  EXPECT_EQ(small.stats().fenced_out_total, 1u);
  // Forgotten by when the lease ended, not by its token: a lock held while many others came
  // and went, lost just now, is remembered.
  auto old = small.Acquire(a->first, "long-held", {}, {}, 0, At(4));
  ASSERT_TRUE(old.ok());
  for (int i = 0; i < 3; ++i) {
    auto g = small.Acquire(a->first, "y", {}, {}, 0, At(5));
    ASSERT_TRUE(small.Release(a->first, "y", g->token, At(6)).ok());
  }
  ASSERT_TRUE(small.Release(a->first, "long-held", old->token, At(7)).ok());
  EXPECT_FALSE(small.Release(a->first, "long-held", old->token, At(8)).ok());
  EXPECT_EQ(small.stats().fenced_out_total, 2u);
}

TEST_F(LockServiceTest, KeepAliveOfUnknownSessionIsNotFound) {
  auto r = service_.KeepAlive(42_session, {}, At(0));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LockServiceTest, ValidateIsFenceOne) {
  SessionId a = Open(0);
  FenceToken t1 = Grant(a, "x", 0);
  EXPECT_TRUE(service_.Validate("x", t1, At(1)).ok());
  ASSERT_TRUE(service_.Release(a, "x", t1, At(2)).ok());
  FenceToken t2 = Grant(a, "x", 3);
  EXPECT_EQ(service_.Validate("x", t1, At(4)).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(service_.Validate("x", t2, At(4)).ok());
  EXPECT_EQ(service_.Validate("x", t2 + 100, At(4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.stats().fenced_out_total, 1u);
}

TEST_F(LockServiceTest, WaiterTimesOut) {
  SessionId a = Open(0), b = Open(0);
  Grant(a, "x", 0);
  ASSERT_EQ(service_.Acquire(b, "x", {}, absl::Milliseconds(500), 5, At(0))->kind,
            AcquireResult::Kind::kQueued);
  service_.Advance(At(500));
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(service_.waiter_count(), 0u);
}

TEST_F(LockServiceTest, WaiterWhoseSessionExpiresStopsWaiting) {
  SessionId a = Open(0, absl::Seconds(100));
  SessionId b = Open(0, absl::Seconds(1));
  SessionId c = Open(0, absl::Seconds(100));
  FenceToken ta = Grant(a, "x", 0);
  ASSERT_TRUE(service_.Acquire(b, "x", {}, absl::Seconds(50), 1, At(0)).ok());
  ASSERT_TRUE(service_.Acquire(c, "x", {}, absl::Seconds(50), 2, At(0)).ok());
  service_.Advance(At(1000));
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiter, 1u);
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(service_.Release(a, "x", ta, At(1001)).ok());
  out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiter, 2u);  // b is skipped: it no longer waits
}

TEST_F(LockServiceTest, LockExpiringBeforeWaitRunsOutIsHandedOverEvenIfSettledLate) {
  SessionId a = Open(0, absl::Seconds(100));
  SessionId b = Open(0, absl::Seconds(100));
  Grant(a, "x", 0, absl::Milliseconds(400));
  ASSERT_TRUE(service_.Acquire(b, "x", {}, absl::Milliseconds(500), 3, At(0)).ok());
  service_.Advance(At(10'000));  // both moments passed; the lock expired first
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].status.ok());
}

TEST_F(LockServiceTest, AWithdrawnWaiterLeavesTheQueueAndIsNeverGranted) {
  SessionId a = Open(0), b = Open(0), c = Open(0);
  FenceToken ta = Grant(a, "x", 0);
  ASSERT_TRUE(service_.Acquire(b, "x", {}, absl::Seconds(50), 1, At(0)).ok());
  ASSERT_TRUE(service_.Acquire(c, "x", {}, absl::Seconds(50), 2, At(0)).ok());
  // Another session cannot withdraw b's wait, and nothing changes.
  auto foreign = service_.Withdraw(1, c, At(1));
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.waiter_count(), 2u);
  auto withdrawn = service_.Withdraw(1, b, At(2));
  ASSERT_TRUE(withdrawn.ok()) << withdrawn.status();
  EXPECT_TRUE(*withdrawn);
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiter, 1u);
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(out[0].status.message(), HasSubstr("withdrawn by its client"));
  EXPECT_EQ(service_.waiters_for("x"), 1u);
  // Twice is no error, and no second outcome.
  EXPECT_FALSE(*service_.Withdraw(1, b, At(3)));
  EXPECT_TRUE(service_.TakeWaiterOutcomes().empty());
  ASSERT_TRUE(service_.Release(a, "x", ta, At(4)).ok());
  out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].waiter, 2u);  // c, not b
  // A waiter already granted is not withdrawn: the grant stands.
  EXPECT_FALSE(*service_.Withdraw(2, c, At(5)));
  EXPECT_EQ(service_.state().FindHolder("x")->session, c);
}

TEST_F(LockServiceTest, AWaitThatRanOutBeforeTheWithdrawalIsNotWithdrawn) {
  SessionId a = Open(0), b = Open(0);
  Grant(a, "x", 0);
  ASSERT_TRUE(service_.Acquire(b, "x", {}, absl::Milliseconds(100), 7, At(0)).ok());
  EXPECT_FALSE(*service_.Withdraw(7, b, At(200)));  // settled first, by the same clock
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(LockServiceTest, CloseSessionCancelsWaitersAndReleasesLocks) {
  SessionId a = Open(0), b = Open(0);
  Grant(a, "x", 0);
  Grant(b, "y", 0);
  ASSERT_TRUE(service_.Acquire(a, "y", {}, absl::Seconds(5), 11, At(1)).ok());
  ASSERT_TRUE(service_.Acquire(b, "x", {}, absl::Seconds(5), 12, At(1)).ok());
  ASSERT_TRUE(service_.CloseSession(a, At(2)).ok());
  auto out = service_.TakeWaiterOutcomes();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].waiter, 11u);
  EXPECT_EQ(out[0].status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(out[1].waiter, 12u);
  EXPECT_TRUE(out[1].status.ok());
  EXPECT_EQ(service_.CloseSession(a, At(3)).code(), absl::StatusCode::kNotFound);
}

TEST_F(LockServiceTest, BadInputIsInvalidArgument) {
  SessionId a = Open(0);
  EXPECT_EQ(service_.Acquire(a, "", {}, {}, 0, At(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.Acquire(a, std::string(513, 'n'), {}, {}, 0, At(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.Acquire(a, "x", absl::Milliseconds(1), {}, 0, At(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.OpenSession(absl::Hours(2), At(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.Acquire(a, "x", {}, absl::Seconds(-1), 0, At(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.Acquire(999_session, "x", {}, {}, 0, At(1)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(LockServiceTest, RecordsAreObservedInOrder) {
  std::vector<size_t> kinds;
  service_.set_record_observer([&](const Record& r) { kinds.push_back(r.index()); });
  SessionId a = Open(0);
  FenceToken t = Grant(a, "x", 0);
  ASSERT_TRUE(service_.Release(a, "x", t, At(1)).ok());
  ASSERT_TRUE(service_.CloseSession(a, At(2)).ok());
  // SessionOpened, LockGranted, LockReleased, SessionEnded
  EXPECT_EQ(kinds, (std::vector<size_t>{0, 3, 5, 2}));
}

// Issue 15: who may drive a session.
TEST(SessionOwnershipTest, OnlyTheBoundConnectionDrivesASessionAndResumeTakesTheSecret) {
  std::vector<std::string> denied;
  LockService service(ServiceOptions{
      .on_permission_denied = [&](const std::string& line) { denied.push_back(line); }});
  const Caller one{1, ""}, two{2, ""};
  auto opened = service.OpenSession(absl::Seconds(15), At(0), one, "sixteen-byte-key");
  ASSERT_TRUE(opened.ok());
  const SessionId s = opened->first;
  EXPECT_TRUE(service.Authorize(s, one).ok());
  EXPECT_EQ(service.Authorize(s, two).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(service.Authorize(s + 1, two).ok());  // no such session: SESSION_NOT_FOUND later
  EXPECT_EQ(service.Resume(s, "sixteen-byte-kez", two).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(service.Resume(s, "sixteen-byte-ke", two).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(service.Resume(s + 1, "sixteen-byte-key", two).status().code(),
            absl::StatusCode::kNotFound);
  auto resumed = service.Resume(s, "sixteen-byte-key", two);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(*resumed, absl::Seconds(15));
  EXPECT_TRUE(service.Authorize(s, two).ok());
  EXPECT_EQ(service.Authorize(s, one).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(service.stats().permission_denied_total, 4u);
  EXPECT_EQ(denied.size(), 4u);
  // Ended sessions leave no binding behind.
  ASSERT_TRUE(service.CloseSession(s, At(1)).ok());
  EXPECT_TRUE(service.Authorize(s, one).ok());
}

TEST(SessionOwnershipTest, AStrangerReplayingAnEndedSessionsTokenCannotRaiseFencedOut) {
  LockService service(ServiceOptions{});
  const Caller worker{1, ""}, stranger{2, ""}, identified{3, "cn:worker-1"};
  const SessionId s = service.OpenSession(absl::Seconds(15), At(0), worker, "sixteen-byte-key")->first;
  const FenceToken t = service.Acquire(s, "payout/1", absl::Seconds(30), absl::ZeroDuration(), 1,
                                       At(0))->token;
  ASSERT_TRUE(service.CloseSession(s, At(1)).ok());
  // The stranger lists the old holder (no permissions file) and replays it: refused, and
  // counted as a foreign token, not as fenced out.
  EXPECT_FALSE(service.SentByItsDriver(s, stranger));
  EXPECT_EQ(service.Release(s, "payout/1", t, At(2), false, service.SentByItsDriver(s, stranger))
                .code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(service.Validate("payout/1", t, At(2), s, service.SentByItsDriver(s, stranger))
                .code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(service.stats().fenced_out_total, 0u);
  EXPECT_EQ(service.stats().foreign_tokens_total, 2u);
  // The worker's own late release is what fence 1 is for: fenced out, counted.
  EXPECT_TRUE(service.SentByItsDriver(s, worker));
  EXPECT_EQ(service.Release(s, "payout/1", t, At(2), false, service.SentByItsDriver(s, worker))
                .code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(service.stats().fenced_out_total, 1u);
  // An identity's ended session: any connection of that identity, nobody else.
  const SessionId i = service.OpenSession(absl::Seconds(15), At(0), identified, "another-key-0000")->first;
  ASSERT_TRUE(service.CloseSession(i, At(1)).ok());
  EXPECT_TRUE(service.SentByItsDriver(i, Caller{4, "cn:worker-1"}));
  EXPECT_FALSE(service.SentByItsDriver(i, Caller{5, "cn:worker-2"}));
  // Once the end is forgotten, nobody's replay counts as fenced out.
  LockService forgetful(ServiceOptions{.remembered_lease_ends = 1});
  const SessionId f = forgetful.OpenSession(absl::Seconds(15), At(0), worker, "sixteen-byte-key")->first;
  const SessionId g = forgetful.OpenSession(absl::Seconds(15), At(0), worker, "sixteen-byte-kez")->first;
  ASSERT_TRUE(forgetful.CloseSession(f, At(1)).ok());
  ASSERT_TRUE(forgetful.CloseSession(g, At(1)).ok());  // f's end is forgotten now
  EXPECT_FALSE(forgetful.SentByItsDriver(f, worker));
}

TEST(SessionOwnershipTest, AnIdentitysSessionIsNeverAnotherIdentitysEvenWithTheSecret) {
  LockService service(ServiceOptions{});
  auto opened = service.OpenSession(absl::Seconds(15), At(0), Caller{1, "uid:1000"}, "secret-of-1000!!");
  ASSERT_TRUE(opened.ok());
  const SessionId s = opened->first;
  EXPECT_EQ(service.state().FindSession(s)->owner, "uid:1000");
  EXPECT_EQ(service.Resume(s, "secret-of-1000!!", Caller{2, "uid:1001"}).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(service.Resume(s, "secret-of-1000!!", Caller{3, ""}).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(service.Resume(s, "secret-of-1000!!", Caller{4, "uid:1000"}).ok());
  // A session without a secret (logged before secrets existed) cannot be resumed at all.
  auto old = service.OpenSession(absl::Seconds(15), At(0), Caller{5, ""}, "");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(service.Resume(old->first, "", Caller{6, ""}).status().code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace fencelock::server
