// The admission coordinator's rules on simulated time: one test (at least) per confirmation
// bullet of ADR-0003 and ADR-0006 (the table in docs/admission.md names them).
#include "lock-server/pool_service.h"

#include <functional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-server/commit_log.h"
#include "lock-server/lock_service.h"
#include "lock-server/storage.h"

namespace fencelock::server {
namespace {

using namespace ::fencelock::id_literals;
using ::testing::HasSubstr;

MonoTime At(double seconds) {
  return MonoTime::FromNanos(static_cast<int64_t>(seconds * 1e9));
}

PoolProfileDef Profile(std::string id, uint64_t cost = 1, uint64_t reserved = 0,
                        bool lendable = false, bool borrow = false) {
  return PoolProfileDef{std::move(id), cost, reserved, lendable, borrow};
}

class PoolServiceTest : public ::testing::Test {
 protected:
  PoolServiceTest() : service_(ServiceOptions{}) {
    service_.set_record_observer([this](const Record& r) { records_.push_back(r); });
  }

  PoolService& pools() { return service_.pools(); }

  void Publish(uint64_t budget, std::vector<PoolProfileDef> profiles, uint64_t generation = 1,
               double at = 0) {
    auto g = pools().Publish("p", PoolPolicy{generation, budget, std::move(profiles)}, At(at));
    ASSERT_TRUE(g.ok()) << g.status();
  }
  PoolOwner Claim(const std::string& profile, uint64_t generation = 1, double at = 0) {
    auto o = pools().Claim("p", profile, generation, "key-" + profile + std::to_string(++keys_),
                           "uid:1000", At(at));
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : PoolOwner{};
  }
  // A granted provisional lease's token, or FenceToken() (0) when refused.
  FenceToken Acquire(const std::string& profile, const std::string& slot, const PoolOwner& o,
                     double at, absl::Duration ttl = absl::Seconds(10)) {
    auto g = pools().Acquire("p", profile, slot, o, ttl, At(at));
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok() || !g->granted) return FenceToken();
    return g->token;
  }
  // Acquires slots s0, s1, ... until one is refused; returns how many were granted.
  int Fill(const std::string& profile, const PoolOwner& o, double at, int most = 100) {
    int n = 0;
    while (n < most && Acquire(profile, profile + "-" + std::to_string(slot_++), o, at,
                               absl::Hours(1)) != FenceToken()) {
      ++n;
    }
    return n;
  }
  // Every logged record the service made, encoded as log frames and replayed on `into` as of
  // 100 s; returns the last lsn.
  absl::StatusOr<uint64_t> ReplayLog(StateMachine* into) {
    std::string frames;
    uint64_t lsn = 0;
    for (const Record& r : records_) {
      if (IsLogged(r)) frames += EncodeRecordFrame(++lsn, r);
    }
    uint64_t last = 0, count = 0;
    if (absl::Status s = ReplayRecordFrames("log", frames, 0, &last, into, At(100), &count);
        !s.ok()) {
      return s;
    }
    return lsn;
  }
  PoolView Status(double at) {
    auto s = pools().Status("p", At(at));
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }
  const PoolProfileView& ProfileOf(const PoolView& s, const std::string& id) {
    for (const auto& p : s.profiles) {
      if (p.profile.id == id) return p;
    }
    ADD_FAILURE() << "no profile " << id;
    return s.profiles.front();
  }
  // Every pool's leases, checked against its budget (the invariant of every decision).
  void ExpectWithinBudget() {
    for (const auto& [name, pool] : service_.state().pools()) {
      uint64_t units = 0;
      for (const auto& [key, lease] : pool.leases) units += lease.units;
      EXPECT_LE(units, pool.budget) << name;
    }
  }

  LockService service_;
  std::vector<Record> records_;
  int keys_ = 0;
  int slot_ = 0;
};

// --- Policy ---------------------------------------------------------------------------------

TEST_F(PoolServiceTest, PolicyIsAcknowledgedWithItsGenerationAndRepeatsAreIdempotent) {
  Publish(8, {Profile("a"), Profile("b")});
  auto again = pools().Publish("p", PoolPolicy{1, 8, {Profile("b"), Profile("a")}}, At(1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 1u);
  EXPECT_EQ(records_.size(), 1u);  // the repeat logged nothing
}

TEST_F(PoolServiceTest, IncompatibleGenerationIsRefusedNamingIt) {
  Publish(8, {Profile("a")}, 2);
  auto same = pools().Publish("p", PoolPolicy{2, 9, {Profile("a")}}, At(1));
  EXPECT_EQ(same.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(same.status().message(), HasSubstr("incompatible policy generation 2"));
  auto older = pools().Publish("p", PoolPolicy{1, 8, {Profile("a")}}, At(1));
  EXPECT_THAT(older.status().message(), HasSubstr("incompatible policy generation 1"));
}

TEST_F(PoolServiceTest, DuplicateProfileIdentityIsRefusedNamingIt) {
  auto g = pools().Publish("p", PoolPolicy{1, 8, {Profile("a"), Profile("b"), Profile("a")}},
                           At(0));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(g.status().message(), HasSubstr("duplicate profile identity \"a\""));
  EXPECT_EQ(service_.state().FindPool("p"), nullptr);
}

TEST_F(PoolServiceTest, ReservationsAboveTheBudgetAreRefused) {
  auto g = pools().Publish("p", PoolPolicy{1, 4, {Profile("a", 1, 3), Profile("b", 1, 2)}}, At(0));
  EXPECT_THAT(g.status().message(), HasSubstr("reservations add up to 5"));
}

TEST_F(PoolServiceTest, APolicyMayNotDropAProfileWithLeasesNorShrinkBelowThem) {
  Publish(8, {Profile("a", 2), Profile("b")});
  PoolOwner a = Claim("a");
  ASSERT_NE(Acquire("a", "s1", a, 1), 0_token);
  ASSERT_NE(Acquire("a", "s2", a, 1), 0_token);
  auto drop = pools().Publish("p", PoolPolicy{2, 8, {Profile("b")}}, At(2));
  EXPECT_THAT(drop.status().message(), HasSubstr("drops profile a"));
  auto shrink = pools().Publish("p", PoolPolicy{2, 3, {Profile("a", 1), Profile("b")}}, At(2));
  EXPECT_THAT(shrink.status().message(), HasSubstr("below the 4 units"));
}

TEST_F(PoolServiceTest, ManagersEnforceOnlyAnAcknowledgedGeneration) {
  Publish(8, {Profile("a")});
  PoolOwner a = Claim("a");
  Publish(8, {Profile("a"), Profile("b")}, 2, 1);
  auto g = pools().Acquire("p", "a", "s1", a, absl::ZeroDuration(), At(2));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(g.status().message(), HasSubstr("acknowledge the new generation"));
  EXPECT_EQ(pools().Ack("p", "a", a, 1, At(2)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pools().Ack("p", "a", a, 2, At(2)).ok());
  EXPECT_NE(Acquire("a", "s1", a, 3), 0_token);
}

// ADR-0003: mixed incompatible managers cannot claim a complete coordinated guarantee.
TEST_F(PoolServiceTest, MixedIncompatibleManagersCannotClaimACompleteGuarantee) {
  Publish(8, {Profile("a"), Profile("b")});
  PoolOwner a = Claim("a");
  EXPECT_FALSE(Status(1).complete);  // b has no manager
  PoolOwner b = Claim("b");
  EXPECT_TRUE(Status(1).complete);
  Publish(8, {Profile("a"), Profile("b")}, 2, 2);  // b's manager still enforces 1
  ASSERT_TRUE(pools().Ack("p", "a", a, 2, At(3)).ok());
  PoolView s = Status(3);
  EXPECT_FALSE(s.complete);
  EXPECT_TRUE(ProfileOf(s, "a").compatible);
  EXPECT_FALSE(ProfileOf(s, "b").compatible);
  EXPECT_EQ(ProfileOf(s, "b").acked_generation, 1u);
  ASSERT_TRUE(pools().Ack("p", "b", b, 2, At(4)).ok());
  EXPECT_TRUE(Status(4).complete);
}

// --- Leases ---------------------------------------------------------------------------------

TEST_F(PoolServiceTest, ProvisionalLeaseTakesATokenFromTheOneSequence) {
  auto session = service_.OpenSession(absl::Seconds(10), At(0));
  ASSERT_TRUE(session.ok());
  auto lock = service_.Acquire(session->first, "l", absl::Seconds(10), absl::ZeroDuration(), 1,
                               At(0));
  ASSERT_TRUE(lock.ok());
  Publish(8, {Profile("a")});
  PoolOwner a = Claim("a");
  const FenceToken t = Acquire("a", "s1", a, 1);
  EXPECT_EQ(t, lock->token + 1);
  auto lock2 = service_.Acquire(session->first, "m", absl::Seconds(10), absl::ZeroDuration(), 2,
                                At(1));
  EXPECT_EQ(lock2->token, t + 1);
}

// ADR-0003 confirmation: provisional expiry.
TEST_F(PoolServiceTest, ProvisionalLeaseExpiresAndCannotThenBeActivated) {
  Publish(2, {Profile("a", 2)});
  PoolOwner a = Claim("a");
  const FenceToken t = Acquire("a", "s1", a, 0, absl::Seconds(10));
  ASSERT_NE(t, 0_token);
  EXPECT_EQ(Status(9.999).used_units, 2u);
  auto late = pools().Activate("p", "a", "s1", t, a, At(10));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(late.status().message(), HasSubstr("do not start it"));
  EXPECT_EQ(Status(10).used_units, 0u);
  EXPECT_EQ(pools().stats().provisional_expiries_total, 1u);
}

TEST_F(PoolServiceTest, RenewedProvisionalLeaseLivesAcrossItsFirstDeadline) {
  Publish(2, {Profile("a")});
  PoolOwner a = Claim("a");
  const FenceToken t = Acquire("a", "s1", a, 0, absl::Seconds(10));
  ASSERT_TRUE(pools().Renew("p", "a", "s1", t, a, At(8)).ok());
  ASSERT_TRUE(pools().Activate("p", "a", "s1", t, a, At(15)).ok());
}

TEST_F(PoolServiceTest, ReleasedProvisionalLeaseCannotBeActivated) {
  Publish(2, {Profile("a")});
  PoolOwner a = Claim("a");
  const FenceToken t = Acquire("a", "s1", a, 0);
  ASSERT_TRUE(pools().Release("p", "a", "s1", t, a, At(1)).ok());
  EXPECT_EQ(pools().Activate("p", "a", "s1", t, a, At(1)).status().code(),
            absl::StatusCode::kNotFound);
}

// ADR-0003 confirmation: active-lease persistence (the owner's silence).
TEST_F(PoolServiceTest, ActiveLeaseSurvivesItsOwnersSilenceForever) {
  Publish(2, {Profile("a")});
  PoolOwner a = Claim("a");
  const FenceToken t = Acquire("a", "s1", a, 0, absl::Seconds(1));
  ASSERT_TRUE(pools().Activate("p", "a", "s1", t, a, At(0.5)).ok());
  service_.Advance(At(1e6));  // eleven days without a word from the manager
  PoolView s = Status(1e6);
  ASSERT_EQ(s.leases.size(), 1u);
  EXPECT_TRUE(s.leases[0].active);
  EXPECT_EQ(s.leases[0].token, t.value());
  EXPECT_EQ(ProfileOf(s, "a").active_units, 1u);
}

// ADR-0003 confirmation: exact release.
TEST_F(PoolServiceTest, ReleaseNeedsTheExactSlotAndToken) {
  Publish(4, {Profile("a")});
  PoolOwner a = Claim("a");
  const FenceToken t1 = Acquire("a", "s1", a, 0);
  const FenceToken t2 = Acquire("a", "s2", a, 0);
  ASSERT_TRUE(pools().Activate("p", "a", "s1", t1, a, At(1)).ok());
  ASSERT_TRUE(pools().Activate("p", "a", "s2", t2, a, At(1)).ok());
  EXPECT_EQ(pools().Release("p", "a", "s1", t2, a, At(2)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pools().Release("p", "a", "s3", t1, a, At(2)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Status(2).used_units, 2u);
  ASSERT_TRUE(pools().Release("p", "a", "s1", t1, a, At(2)).ok());
  PoolView s = Status(2);
  ASSERT_EQ(s.leases.size(), 1u);
  EXPECT_EQ(s.leases[0].slot, "s2");
}

// ADR-0003 confirmation: manager handoff (and created-container recovery).
TEST_F(PoolServiceTest, ReplacementManagerListsReconcilesAndKeepsWhatIsStillRunning) {
  Publish(4, {Profile("a")});
  PoolOwner old_manager = Claim("a");
  const FenceToken running = Acquire("a", "run", old_manager, 0);
  const FenceToken created = Acquire("a", "created", old_manager, 0);
  const FenceToken gone = Acquire("a", "gone", old_manager, 0);
  ASSERT_TRUE(pools().Activate("p", "a", "run", running, old_manager, At(1)).ok());
  ASSERT_TRUE(pools().Activate("p", "a", "created", created, old_manager, At(1)).ok());
  ASSERT_TRUE(pools().Activate("p", "a", "gone", gone, old_manager, At(1)).ok());
  // The old manager vanishes; a replacement claims the profile and lists its leases.
  PoolOwner replacement = Claim("a", 1, 100);
  EXPECT_EQ(replacement.epoch, old_manager.epoch + 1);
  PoolView s = Status(100);
  ASSERT_EQ(s.leases.size(), 3u);
  // "gone": the worker is proved absent, so the exact slot is released (reconciled).
  auto released = pools().Release("p", "a", "gone", gone, replacement, At(101));
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(pools().stats().reconciliations_total, 1u);
  // "created": an exact created-not-started worker with a valid active lease may be started;
  // "run" keeps running under its lease. Both stay.
  s = Status(101);
  ASSERT_EQ(s.leases.size(), 2u);
  EXPECT_EQ(s.leases[0].slot, "created");
  EXPECT_EQ(s.leases[1].slot, "run");
}

TEST_F(PoolServiceTest, CreatedWorkerWithAnExpiredLeaseIsNeverStarted) {
  Publish(4, {Profile("a")});
  PoolOwner old_manager = Claim("a");
  const FenceToken created = Acquire("a", "created", old_manager, 0, absl::Seconds(5));
  PoolOwner replacement = Claim("a", 1, 10);
  auto activated = pools().Activate("p", "a", "created", created, replacement, At(10));
  EXPECT_EQ(activated.status().code(), absl::StatusCode::kNotFound);
}

// ADR-0003 confirmation: stale-owner reconciliation.
TEST_F(PoolServiceTest, StaleManagerIsFencedOutOfEverything) {
  Publish(4, {Profile("a")});
  PoolOwner old_manager = Claim("a");
  const FenceToken t = Acquire("a", "s1", old_manager, 0);
  ASSERT_TRUE(pools().Activate("p", "a", "s1", t, old_manager, At(1)).ok());
  const FenceToken p2 = Acquire("a", "s2", old_manager, 1);
  PoolOwner replacement = Claim("a", 1, 2);
  // The old manager wakes up and acts on what it remembers: every request is refused.
  EXPECT_EQ(pools().Release("p", "a", "s1", t, old_manager, At(3)).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(pools().Activate("p", "a", "s2", p2, old_manager, At(3)).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(pools().Acquire("p", "a", "s3", old_manager, absl::ZeroDuration(), At(3))
                .status()
                .code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(pools().SetDemand("p", "a", old_manager, 3, At(3)).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(pools().stats().stale_owner_total, 4u);
  EXPECT_EQ(Status(3).leases.size(), 2u);  // nothing changed
  // A stranger with the right epoch and a guessed key is refused too.
  PoolOwner stranger{replacement.epoch, "guess"};
  EXPECT_EQ(pools().Release("p", "a", "s1", t, stranger, At(3)).status().code(),
            absl::StatusCode::kPermissionDenied);
}

// ADR-0003: fenced operator recovery.
TEST_F(PoolServiceTest, RecoveryWritesATombstoneFirstAndIsRefusedRepeatedOrStale) {
  Publish(4, {Profile("a", 2)});
  PoolOwner a = Claim("a");
  const FenceToken t = Acquire("a", "s1", a, 0);
  ASSERT_TRUE(pools().Activate("p", "a", "s1", t, a, At(1)).ok());
  EXPECT_EQ(pools().Recover("p", "a", "s1", t, "", At(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const size_t before = records_.size();
  auto d = pools().Recover("p", "a", "s1", t, "container gone: docker ps -a shows none", At(2));
  ASSERT_TRUE(d.ok()) << d.status();
  // One record holds both the tombstone and the release: the units are free only once it is
  // durable.
  ASSERT_EQ(records_.size(), before + 1);
  ASSERT_TRUE(std::holds_alternative<record::PoolLeaseRecovered>(records_.back()));
  PoolView s = Status(2);
  EXPECT_EQ(s.used_units, 0u);
  ASSERT_EQ(s.tombstones.size(), 1u);
  EXPECT_EQ(s.tombstones[0].token, t.value());
  EXPECT_EQ(s.tombstones[0].units, 2u);
  EXPECT_EQ(s.tombstones[0].decision, *d);
  auto repeated = pools().Recover("p", "a", "s1", t, "again", At(3));
  EXPECT_THAT(repeated.status().message(), HasSubstr("repeated recovery"));
  const FenceToken t2 = Acquire("a", "s1", a, 3);
  ASSERT_TRUE(pools().Activate("p", "a", "s1", t2, a, At(3)).ok());
  auto stale = pools().Recover("p", "a", "s1", t2 + 7, "wrong token", At(4));
  EXPECT_THAT(stale.status().message(), HasSubstr("stale recovery"));
  EXPECT_EQ(Status(4).used_units, 2u);  // the new lease is untouched
}

TEST_F(PoolServiceTest, RecoveryOfAProvisionalLeaseIsRefused) {
  Publish(4, {Profile("a")});
  PoolOwner a = Claim("a");
  const FenceToken t = Acquire("a", "s1", a, 0);
  EXPECT_THAT(pools().Recover("p", "a", "s1", t, "gone", At(1)).status().message(),
              HasSubstr("expires by itself"));
}

TEST_F(PoolServiceTest, DrainingRefusesNewAdmissionButKeepsLeases) {
  EXPECT_THAT(pools().CheckRetired().message(), HasSubstr("coordinates no pool"));
  Publish(4, {Profile("a")});
  PoolOwner a = Claim("a");
  const FenceToken active = Acquire("a", "s1", a, 0);
  ASSERT_TRUE(pools().Activate("p", "a", "s1", active, a, At(0)).ok());
  const FenceToken provisional = Acquire("a", "s2", a, 0);
  ASSERT_TRUE(pools().SetDrain("p", true, At(1)).ok());
  EXPECT_THAT(pools().Acquire("p", "a", "s3", a, absl::ZeroDuration(), At(1)).status().message(),
              HasSubstr("draining"));
  EXPECT_THAT(pools().Activate("p", "a", "s2", provisional, a, At(1)).status().message(),
              HasSubstr("draining"));
  EXPECT_THAT(pools().CheckRetired().message(), HasSubstr("p (2 leases)"));
  ASSERT_TRUE(pools().Release("p", "a", "s1", active, a, At(2)).ok());
  ASSERT_TRUE(pools().Release("p", "a", "s2", provisional, a, At(2)).ok());
  EXPECT_TRUE(pools().CheckRetired().ok());
  ASSERT_TRUE(pools().SetDrain("p", false, At(3)).ok());
  EXPECT_THAT(pools().CheckRetired().message(), HasSubstr("p (not draining)"));
}

// Issue 35: the table of pools could be filled for good. An operator deletes a pool once it
// drains and holds no lease; its name and place are free, demand goes with it, tokens stay
// above every one it handed out, and a replay of the log deletes it again.
TEST_F(PoolServiceTest, ADrainedPoolWithoutLeasesIsDeletedAndItsPlaceIsFree) {
  Publish(4, {Profile("a")});
  PoolOwner a = Claim("a");
  const FenceToken t = Acquire("a", "s1", a, 0);
  ASSERT_TRUE(pools().SetDemand("p", "a", a, 2, At(0)).ok());
  EXPECT_THAT(pools().Delete("p", At(1)).message(), HasSubstr("it is not draining"));
  ASSERT_TRUE(pools().SetDrain("p", true, At(1)).ok());
  EXPECT_THAT(pools().Delete("p", At(1)).message(), HasSubstr("1 leases remain"));
  EXPECT_TRUE(pools().Delete("p", At(11)).ok());  // the provisional lease expired at 10 s
  EXPECT_EQ(pools().Status("p", At(11)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pools().Delete("p", At(11)).code(), absl::StatusCode::kNotFound);
  // The name is free: a new pool of that name starts from nothing (no demand, epoch 1).
  Publish(4, {Profile("a")}, 1, 12);
  EXPECT_FALSE(ProfileOf(Status(12), "a").pending_units.has_value());
  PoolOwner again = Claim("a", 1, 12);
  EXPECT_EQ(again.epoch, 1u);
  EXPECT_GT(Acquire("a", "s1", again, 12), t);
  // The table: 64 pools at most, and a deleted one's place is free.
  for (int i = 1; i < 64; ++i) {
    ASSERT_TRUE(pools().Publish(absl::StrCat("q", i), PoolPolicy{1, 1, {Profile("a")}}, At(13)).ok());
  }
  const absl::Status full =
      pools().Publish("one-too-many", PoolPolicy{1, 1, {Profile("a")}}, At(13)).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  // Issue 59: the refusal says how to make room.
  EXPECT_THAT(full.message(), HasSubstr("lockctl pool delete --pool=NAME"));
  ASSERT_TRUE(pools().SetDrain("q1", true, At(13)).ok());
  ASSERT_TRUE(pools().Delete("q1", At(13)).ok());
  EXPECT_TRUE(pools().Publish("one-too-many", PoolPolicy{1, 1, {Profile("a")}}, At(13)).ok());
  // Replayed from the log, the deletions happen again.
  StateMachine replayed;
  ASSERT_TRUE(ReplayLog(&replayed).ok());
  EXPECT_EQ(replayed.DebugString(), service_.state().DebugString());
  EXPECT_EQ(replayed.FindPool("q1"), nullptr);
  EXPECT_NE(replayed.FindPool("one-too-many"), nullptr);
}

// --- Fairness, reservations, borrowing -------------------------------------------------------

// ADR-0003 confirmation: concurrent acquisition never exceeds a synthetic host budget.
TEST_F(PoolServiceTest, InterleavedAcquisitionNeverExceedsTheBudget) {
  Publish(10, {Profile("a", 3), Profile("b", 2), Profile("c", 1, 2)});
  PoolOwner a = Claim("a"), b = Claim("b"), c = Claim("c");
  int granted = 0;
  for (int round = 0; round < 20; ++round) {
    granted += Acquire("a", "a" + std::to_string(round), a, round) != FenceToken();
    granted += Acquire("b", "b" + std::to_string(round), b, round) != FenceToken();
    granted += Acquire("c", "c" + std::to_string(round), c, round) != FenceToken();
    ExpectWithinBudget();
  }
  EXPECT_GT(granted, 0);
  EXPECT_LE(Status(20).used_units, 10u);
}

// ADR-0006 confirmation: fresh simultaneous demand still protects each contender's fair share.
TEST_F(PoolServiceTest, FreshSimultaneousDemandProtectsEachContendersFairShare) {
  Publish(9, {Profile("a"), Profile("b"), Profile("c")});
  PoolOwner a = Claim("a"), b = Claim("b"), c = Claim("c");
  ASSERT_TRUE(pools().SetDemand("p", "a", a, 9, At(0)).ok());
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 9, At(0)).ok());
  ASSERT_TRUE(pools().SetDemand("p", "c", c, 9, At(0)).ok());
  // The fastest manager gets its share and no more while the others want theirs.
  EXPECT_EQ(Fill("a", a, 1), 3);
  PoolView s = Status(1);
  EXPECT_EQ(ProfileOf(s, "b").withheld_units, 3u);
  EXPECT_EQ(ProfileOf(s, "c").withheld_units, 3u);
  EXPECT_EQ(Fill("b", b, 2), 3);
  EXPECT_EQ(Fill("c", c, 3), 3);
  EXPECT_EQ(Status(3).used_units, 9u);
}

TEST_F(PoolServiceTest, WithoutOtherContendersOneProfileMayUseEveryFairUnit) {
  Publish(6, {Profile("a"), Profile("b")});
  PoolOwner a = Claim("a");
  Claim("b");
  EXPECT_EQ(Fill("a", a, 1), 6);
}

TEST_F(PoolServiceTest, ExplicitZeroDemandIsKnownZeroAndTakesNoShare) {
  Publish(6, {Profile("a"), Profile("b")});
  PoolOwner a = Claim("a"), b = Claim("b");
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 0, At(0)).ok());
  PoolView s = Status(0);
  EXPECT_EQ(ProfileOf(s, "b").pending_units, 0u);
  EXPECT_EQ(ProfileOf(s, "b").withheld_units, 0u);
  EXPECT_FALSE(ProfileOf(s, "b").demand_expires_in.has_value());
  EXPECT_EQ(Fill("a", a, 1), 6);
}

// ADR-0006 confirmation: refreshed demand remains current across the original deadline.
TEST_F(PoolServiceTest, RefreshedDemandStaysCurrentAcrossTheOriginalDeadline) {
  Publish(4, {Profile("a"), Profile("b")});
  PoolOwner a = Claim("a"), b = Claim("b");
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 4, At(0)).ok());
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 4, At(20)).ok());  // the refresh, inside 30 s
  PoolView s = Status(40);  // past the first deadline (30 s), inside the second (50 s)
  EXPECT_EQ(ProfileOf(s, "b").pending_units, 4u);
  // b is the only contender until a acquires: all 4 fair units are protected for it.
  EXPECT_EQ(ProfileOf(s, "b").withheld_units, 4u);
  EXPECT_EQ(*ProfileOf(s, "b").demand_expires_in, absl::Seconds(10));
  EXPECT_EQ(Fill("a", a, 40), 2);  // b's share stays protected
}

TEST_F(PoolServiceTest, AnAcquireRefreshesItsProfilesDemand) {
  Publish(4, {Profile("a"), Profile("b")});
  Claim("a");
  PoolOwner b = Claim("b");
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 4, At(0)).ok());
  EXPECT_NE(Acquire("b", "b1", b, 25), 0_token);
  PoolView s = Status(50);  // 25 s after the Acquire: still current
  EXPECT_EQ(ProfileOf(s, "b").pending_units, 3u);
  EXPECT_EQ(*ProfileOf(s, "b").demand_expires_in, absl::Seconds(5));
}

// ADR-0006 confirmation: abandoned demand expires and stops withholding available units.
TEST_F(PoolServiceTest, AbandonedDemandExpiresAndStopsWithholdingUnits) {
  Publish(4, {Profile("a"), Profile("b")});
  PoolOwner a = Claim("a"), b = Claim("b");
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 4, At(0)).ok());
  // b's manager stops. a gets its half and is refused the rest while b's demand is current.
  EXPECT_EQ(Fill("a", a, 1), 2);
  EXPECT_EQ(Fill("a", a, 29.9), 0);
  // At the deadline the demand is gone, and the units it withheld are a's to use.
  EXPECT_EQ(Fill("a", a, 30), 2);
  EXPECT_EQ(pools().stats().demand_expiries_total, 1u);
}

// Issue 35: lockd's stall compensation (it did not run for a while: a freeze, a suspend) moves
// demand deadlines with the leases', so that managers whose refreshes could not arrive keep
// their share; known zero stays known zero.
TEST_F(PoolServiceTest, LockdsOwnStallPostponesDemandWithTheLeases) {
  Publish(4, {Profile("a"), Profile("b"), Profile("c")});
  PoolOwner a = Claim("a"), b = Claim("b"), c = Claim("c");
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 4, At(0)).ok());
  ASSERT_TRUE(pools().SetDemand("p", "c", c, 0, At(0)).ok());
  service_.PostponeLeases(absl::Seconds(40));  // lockd frozen from 10 s to 50 s, say
  EXPECT_EQ(ProfileOf(Status(69), "b").pending_units, 4u);
  EXPECT_EQ(ProfileOf(Status(69), "c").pending_units, 0u);
  EXPECT_EQ(Fill("a", a, 69), 2);  // b's share still withheld
  EXPECT_FALSE(ProfileOf(Status(70), "b").pending_units.has_value());
  EXPECT_EQ(ProfileOf(Status(70), "c").pending_units, 0u);
}

// Seed ADR-0006, bullet 2: an Acquire creates demand by itself, before fairness is evaluated.
// b never publishes demand; its refused acquires alone make it a contender whose share is
// then withheld from a, until that demand expires.
TEST_F(PoolServiceTest, AnAcquireAloneCreatesDemand) {
  Publish(4, {Profile("a"), Profile("b", 4)});
  PoolOwner a = Claim("a"), b = Claim("b");
  EXPECT_FALSE(ProfileOf(Status(0), "b").pending_units.has_value());  // never published
  EXPECT_EQ(Acquire("a", "a1", a, 0), FenceToken{1});                   // a alone: any unit
  EXPECT_EQ(Acquire("b", "b1", b, 1), FenceToken{0});                   // 4 units: refused
  PoolView s = Status(1);
  ASSERT_TRUE(ProfileOf(s, "b").pending_units.has_value());
  EXPECT_EQ(*ProfileOf(s, "b").pending_units, 4u);  // one slot of 4 units
  EXPECT_EQ(ProfileOf(s, "b").demand_expires_in, absl::Seconds(30));
  // b's acquire-made demand withholds its fair share (2 of 4) from a: a gets 1 more, not 3.
  EXPECT_EQ(Fill("a", a, 2), 1);
  // Not refreshed, it expires like published demand, and a may use the rest (a1, provisional
  // for 10 s, has expired by then too: 3 units).
  EXPECT_FALSE(ProfileOf(Status(31), "b").pending_units.has_value());
  EXPECT_EQ(Fill("a", a, 31), 3);
}

// ADR-0006 confirmation: expired demand is reported as unavailable rather than zero.
TEST_F(PoolServiceTest, ExpiredDemandReportsUnknownNotZero) {
  Publish(4, {Profile("a"), Profile("b")});
  Claim("a");
  PoolOwner b = Claim("b");
  EXPECT_FALSE(ProfileOf(Status(0), "b").pending_units.has_value());  // never published
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 2, At(0)).ok());
  EXPECT_EQ(ProfileOf(Status(29), "b").pending_units, 2u);
  PoolView s = Status(30);
  EXPECT_FALSE(ProfileOf(s, "b").pending_units.has_value());
  EXPECT_FALSE(ProfileOf(s, "b").withheld_units.has_value());
}

TEST_F(PoolServiceTest, DemandExpiryNeverTouchesALease) {
  Publish(4, {Profile("a")});
  PoolOwner a = Claim("a");
  ASSERT_TRUE(pools().SetDemand("p", "a", a, 3, At(0)).ok());
  const FenceToken t = Acquire("a", "s1", a, 0, absl::Seconds(120));
  const FenceToken u = Acquire("a", "s2", a, 0, absl::Seconds(120));
  ASSERT_TRUE(pools().Activate("p", "a", "s1", t, a, At(1)).ok());
  PoolView s = Status(60);  // the demand expired at 30 s
  EXPECT_FALSE(ProfileOf(s, "a").pending_units.has_value());
  EXPECT_EQ(s.leases.size(), 2u);
  EXPECT_EQ(ProfileOf(s, "a").active_units, 1u);
  EXPECT_EQ(ProfileOf(s, "a").provisional_units, 1u);
  EXPECT_NE(u, 0_token);
}

TEST_F(PoolServiceTest, PolicyReplacementClearsAllDemand) {
  Publish(4, {Profile("a"), Profile("b")});
  Claim("a");
  PoolOwner b = Claim("b");
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 4, At(0)).ok());
  Publish(4, {Profile("a"), Profile("b")}, 2, 1);
  EXPECT_FALSE(ProfileOf(Status(1), "b").pending_units.has_value());
}

TEST_F(PoolServiceTest, NonBorrowableReservationIsNeverLent) {
  Publish(8, {Profile("a", 1, 0, false, true), Profile("r", 1, 3, false)});
  PoolOwner a = Claim("a"), r = Claim("r");
  EXPECT_EQ(Fill("a", a, 1), 5);  // r's 3 units stay r's, though r wants nothing
  EXPECT_EQ(Fill("r", r, 2), 3);
}

TEST_F(PoolServiceTest, BorrowableReservationIsLentOnlyToBorrowers) {
  Publish(8, {Profile("b", 1, 0, false, true), Profile("n"), Profile("r", 1, 2, true)});
  PoolOwner b = Claim("b"), n = Claim("n"), r = Claim("r");
  EXPECT_EQ(Fill("n", n, 1), 6);  // n does not borrow: the 6 unreserved units
  ASSERT_TRUE(pools().SetDemand("p", "n", n, 0, At(1)).ok());
  EXPECT_EQ(Fill("b", b, 2), 2);  // b borrows r's lendable 2
  (void)r;
}

TEST_F(PoolServiceTest, LentUnitsAreNeverTakenBackFromAnActiveLease) {
  Publish(4, {Profile("b", 1, 0, false, true), Profile("r", 1, 2, true)});
  PoolOwner b = Claim("b"), r = Claim("r");
  std::vector<FenceToken> tokens;
  for (int i = 0; i < 4; ++i) {
    const std::string slot = "b" + std::to_string(i);
    tokens.push_back(Acquire("b", slot, b, 0));
    ASSERT_NE(tokens.back(), 0_token);
    ASSERT_TRUE(pools().Activate("p", "b", slot, tokens.back(), b, At(0)).ok());
  }
  // r now wants its reservation: it is refused, and b's leases stay.
  ASSERT_TRUE(pools().SetDemand("p", "r", r, 2, At(1)).ok());
  EXPECT_EQ(Acquire("r", "r1", r, 1), 0_token);
  EXPECT_EQ(Status(1).leases.size(), 4u);
  // Once b releases one, it goes to r's reservation, not back to b.
  ASSERT_TRUE(pools().Release("p", "b", "b0", tokens[0], b, At(2)).ok());
  EXPECT_EQ(Acquire("b", "b9", b, 2), 0_token);
  EXPECT_NE(Acquire("r", "r1", r, 2), 0_token);
}

TEST_F(PoolServiceTest, ReservationIsUsableWithoutCompetingForFairUnits) {
  Publish(6, {Profile("a"), Profile("b"), Profile("r", 1, 2)});
  PoolOwner a = Claim("a"), b = Claim("b"), r = Claim("r");
  ASSERT_TRUE(pools().SetDemand("p", "a", a, 9, At(0)).ok());
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 9, At(0)).ok());
  EXPECT_EQ(Fill("a", a, 1), 2);  // half of the 4 fair units
  EXPECT_EQ(Fill("b", b, 1), 2);
  // r's own 2 units are not fair units: the contenders' demand does not touch them.
  EXPECT_EQ(Fill("r", r, 1), 2);
}

TEST_F(PoolServiceTest, RefusalNamesTheFigures) {
  Publish(2, {Profile("a", 2), Profile("b", 2)});
  PoolOwner a = Claim("a"), b = Claim("b");
  ASSERT_NE(Acquire("a", "a1", a, 0), 0_token);
  auto g = pools().Acquire("p", "b", "b1", b, absl::ZeroDuration(), At(0));
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->granted);
  EXPECT_THAT(g->refusal, HasSubstr("0 of 2 free"));
  EXPECT_EQ(pools().stats().refusals_total, 1u);
}

// --- Bad input ------------------------------------------------------------------------------

TEST_F(PoolServiceTest, BadNamesAndFiguresAreRefusedWithoutChangingAnything) {
  EXPECT_EQ(pools().Publish("", PoolPolicy{1, 8, {Profile("a")}}, At(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pools().Publish("p/q", PoolPolicy{1, 8, {Profile("a")}}, At(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pools().Publish("p", PoolPolicy{1, 0, {Profile("a")}}, At(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pools().Publish("p", PoolPolicy{1, 1u << 30, {Profile("a")}}, At(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pools().Publish("p", PoolPolicy{1, 8, {Profile("a", 0)}}, At(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pools().Publish("p", PoolPolicy{1, 8, {}}, At(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(records_.empty());
  Publish(8, {Profile("a")});
  PoolOwner a = Claim("a");
  EXPECT_EQ(pools().Acquire("p", "a", "", a, absl::ZeroDuration(), At(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pools().Acquire("p", "a", "s", a, absl::Hours(2), At(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pools().Acquire("p", "zz", "s", a, absl::ZeroDuration(), At(0)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pools().Acquire("q", "a", "s", a, absl::ZeroDuration(), At(0)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pools().SetDemand("p", "a", a, uint64_t{1} << 40, At(0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pools().Claim("p", "a", 7, "k", "uid:1000", At(0)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// --- Restart --------------------------------------------------------------------------------

// ADR-0003 confirmation: coordinator restart restores the last valid policy, leases, epochs
// and decision sequence (and tombstones), from the log and from a snapshot.
TEST_F(PoolServiceTest, RestartRestoresPolicyLeasesEpochsTombstonesAndDecisions) {
  Publish(8, {Profile("a", 2, 2, true), Profile("b")});
  PoolOwner a = Claim("a");
  PoolOwner b1 = Claim("b");
  PoolOwner b = Claim("b");
  const FenceToken t1 = Acquire("a", "s1", a, 0);
  const FenceToken t2 = Acquire("a", "s2", a, 0);
  const FenceToken t3 = Acquire("b", "s1", b, 0);
  ASSERT_TRUE(pools().Activate("p", "a", "s1", t1, a, At(1)).ok());
  ASSERT_TRUE(pools().Activate("p", "a", "s2", t2, a, At(1)).ok());
  ASSERT_TRUE(pools().Recover("p", "a", "s2", t2, "gone", At(2)).ok());
  ASSERT_TRUE(pools().SetDemand("p", "b", b, 3, At(2)).ok());
  (void)b1;

  // From the log: every record encoded, then replayed on an empty state.
  StateMachine replayed;
  auto replay = ReplayLog(&replayed);
  ASSERT_TRUE(replay.ok()) << replay.status();
  const uint64_t lsn = *replay;
  // From a snapshot of the state.
  auto snapshotted = DecodeSnapshot("snap", EncodeSnapshot(service_.state(), lsn), lsn, At(100));
  ASSERT_TRUE(snapshotted.ok()) << snapshotted.status();
  for (StateMachine* restored : {&replayed, &*snapshotted}) {
    EXPECT_EQ(restored->DebugString(), service_.state().DebugString());
    LockService after(ServiceOptions{}, std::move(*restored));
    auto s = after.pools().Status("p", At(100));
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->generation, 1u);
    EXPECT_EQ(s->decision, Status(2).decision);
    ASSERT_EQ(s->tombstones.size(), 1u);
    EXPECT_EQ(s->tombstones[0].token, t2.value());
    ASSERT_EQ(s->leases.size(), 2u);
    EXPECT_TRUE(s->leases[0].active);                    // a/s1 survived
    EXPECT_FALSE(s->leases[1].active);                   // b/s1, provisional: full TTL again
    EXPECT_EQ(s->leases[1].expires_in, absl::Seconds(10));
    // Demand does not survive a restart.
    EXPECT_FALSE(s->profiles[1].pending_units.has_value());
    // Who claimed each epoch (ADR 0004) is restored with it.
    ASSERT_NE(after.pools().Owner("p", "b"), nullptr);
    EXPECT_EQ(after.pools().Owner("p", "b")->claimed_by, "uid:1000");
    EXPECT_EQ(after.pools().Owner("p", "b")->epoch, 2u);
    // The epochs: b's first manager is still stale, its second is still the owner.
    EXPECT_EQ(after.pools().SetDemand("p", "b", b1, 1, At(100)).code(),
              absl::StatusCode::kAborted);
    EXPECT_TRUE(after.pools().SetDemand("p", "b", b, 1, At(100)).ok());
    // The next token is above every one handed out.
    auto g = after.pools().Acquire("p", "b", "s9", b, absl::ZeroDuration(), At(100));
    ASSERT_TRUE(g.ok() && g->granted);
    EXPECT_GT(g->token, t3);
  }
}

// The decision sequence (seed ADR-0003): every decision record of a pool (policy, grant,
// activation, release, recovery) must be exactly the pool's last decision plus one; the state
// machine refuses a skip or a repeat of any of them, in service and in replay alike.
TEST(PoolStateTest, EveryDecisionAdvancesTheSequenceByExactlyOne) {
  StateMachine state;
  auto apply = [&](const Record& r) {
    ASSERT_TRUE(state.Check(r).ok()) << state.Check(r);
    state.Apply(r, At(0));
  };
  // For a decision record made from its number: the one after the last applies; a skip and a
  // repeat are refused, naming the sequence.
  auto step = [&](const std::function<Record(uint64_t)>& make) {
    const uint64_t last = state.FindPool("p") == nullptr ? 0 : state.FindPool("p")->decision;
    for (uint64_t wrong : {last + 2, last}) {
      absl::Status s = state.Check(make(wrong));
      EXPECT_FALSE(s.ok()) << "decision " << wrong << " after " << last;
      EXPECT_THAT(s.message(), HasSubstr("does not follow decision")) << s;
    }
    apply(make(last + 1));
    EXPECT_EQ(state.FindPool("p")->decision, last + 1);
  };
  step([](uint64_t d) { return Record(record::PoolPolicyPublished{"p", 1, 4, {Profile("a")}, d}); });
  apply(record::PoolProfileClaimed{"p", "a", 1, "k", 1});  // not a decision
  step([](uint64_t d) {
    return Record(record::PoolLeaseGranted{"p", "a", "s1", 10_token, 1, 1, absl::Seconds(1), d});
  });
  step([](uint64_t d) { return Record(record::PoolLeaseActivated{"p", "a", "s1", 10_token, d}); });
  step([](uint64_t d) {
    return Record(record::PoolLeaseGranted{"p", "a", "s2", 11_token, 1, 1, absl::Seconds(1), d});
  });
  step([](uint64_t d) {
    return Record(
        record::PoolLeaseReleased{"p", "a", "s2", 11_token, PoolReleaseReason::kReleased, d});
  });
  step([](uint64_t d) {
    return Record(record::PoolLeaseRecovered{"p", "a", "s1", 10_token, "gone", d});
  });
  step([](uint64_t d) { return Record(record::PoolPolicyPublished{"p", 2, 4, {Profile("a")}, d}); });
  EXPECT_EQ(state.FindPool("p")->decision, 7u);
}

TEST(PoolStateTest, AReplayedGrantAboveTheBudgetIsRefused) {
  StateMachine state;
  state.Apply(record::PoolPolicyPublished{"p", 1, 2, {Profile("a", 2)}, 1}, At(0));
  state.Apply(record::PoolProfileClaimed{"p", "a", 1, "k", 1}, At(0));
  state.Apply(record::PoolLeaseGranted{"p", "a", "s1", 1_token, 2, 1, absl::Seconds(1), 2}, At(0));
  absl::Status s =
      state.Check(record::PoolLeaseGranted{"p", "a", "s2", 2_token, 2, 1, absl::Seconds(1), 3});
  EXPECT_THAT(s.message(), HasSubstr("0 of 2 free"));
}

TEST(PoolStateTest, AnActiveLeaseCannotBeExpired) {
  StateMachine state;
  state.Apply(record::PoolPolicyPublished{"p", 1, 2, {Profile("a")}, 1}, At(0));
  state.Apply(record::PoolProfileClaimed{"p", "a", 1, "k", 1}, At(0));
  state.Apply(record::PoolLeaseGranted{"p", "a", "s1", 1_token, 1, 1, absl::Seconds(1), 2}, At(0));
  state.Apply(record::PoolLeaseActivated{"p", "a", "s1", 1_token, 3}, At(0));
  EXPECT_THAT(
      state
          .Check(record::PoolLeaseReleased{"p", "a", "s1", 1_token, PoolReleaseReason::kExpired, 4})
          .message(),
      HasSubstr("expiry of active lease"));
  EXPECT_FALSE(state.ExpiredPoolLease(At(1e9)).has_value());
}

TEST(PoolStateTest, ACorruptSnapshotPoolFailsClosed) {
  StateMachine state;
  state.Apply(record::PoolPolicyPublished{"p", 1, 2, {Profile("a")}, 1}, At(0));
  PoolState bad = *state.FindPool("p");
  bad.owners["a"] = PoolOwnerState{1, "k", 1};
  bad.leases[{"a", "s1"}] =
      PoolLeaseState{.token = 1_token, .units = 3, .epoch = 1, .active = true};
  StateMachine fresh;
  ASSERT_TRUE(fresh.RaiseFloors(5_token, 0_session).ok());
  EXPECT_THAT(fresh.RestorePool("p", bad, At(0)).message(), HasSubstr("budget of 2"));
}

}  // namespace
}  // namespace fencelock::server
