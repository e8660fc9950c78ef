// The client core's indices (indices.h): what they answer stays right through puts, renewals,
// releases, losses marked from another thread and replacement under the same name.
#include "lock-client/core/indices.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace fencelock::client_core {
namespace {

const MonoTime kT0 = MonoTime::FromNanos(1'000'000'000'000);

std::shared_ptr<LeaseState> Lease(const std::string& lock, absl::Duration ttl, MonoTime deadline) {
  return std::make_shared<LeaseState>(lock, 1, ttl, deadline);
}

TEST(HeldLeasesTest, TheShortestTtlAndTheEarliestDeadlineFollowEveryChange) {
  HeldLeases held;
  EXPECT_EQ(held.ShortestTtl(), absl::InfiniteDuration());
  EXPECT_EQ(held.EarliestDeadline(), MonoTime::Max());
  auto a = Lease("a", absl::Seconds(30), kT0 + absl::Seconds(20));
  auto b = Lease("b", absl::Seconds(5), kT0 + absl::Seconds(3));
  held.Put("a", {a, a->deadline()});
  held.Put("b", {b, b->deadline()});
  EXPECT_EQ(held.ShortestTtl(), absl::Seconds(5));
  EXPECT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(3));
  // b renewed past a: a is the earliest now.
  ASSERT_TRUE(b->Extend(kT0 + absl::Seconds(25), kT0));
  held.Touch(b);
  EXPECT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(20));
  // Replaced under the same name by a lease of another TTL.
  auto b2 = Lease("b", absl::Seconds(60), kT0 + absl::Seconds(40));
  held.Put("b", {b2, b2->deadline()});
  EXPECT_EQ(held.size(), 2u);
  EXPECT_EQ(held.ShortestTtl(), absl::Seconds(30));
  // a marked lost from outside the core (the loss watcher): due at once.
  a->MarkLost(LossReason::kDeadlinePassed);
  EXPECT_EQ(held.EarliestDeadline(), MonoTime::Min());
  EXPECT_EQ(held.NextDue(kT0), a);
  EXPECT_EQ(held.NextDue(kT0), nullptr);  // b2's deadline is still ahead
  held.Erase(held.find("a"));
  EXPECT_EQ(held.ShortestTtl(), absl::Seconds(60));
  EXPECT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(40));
  EXPECT_EQ(held.NextDue(kT0 + absl::Seconds(40)), b2);
  held.Clear();
  EXPECT_EQ(held.EarliestDeadline(), MonoTime::Max());
}

// Renewals leave older entries behind; they never answer for a lease, and they do not pile up.
TEST(HeldLeasesTest, RenewalsLeaveNothingThatAnswersOrPilesUp) {
  HeldLeases held;
  std::vector<std::shared_ptr<LeaseState>> leases;
  for (int i = 0; i < 100; ++i) {
    leases.push_back(Lease("l" + std::to_string(i), absl::Seconds(30), kT0 + absl::Seconds(10)));
    held.Put(leases.back()->lock(), {leases.back(), leases.back()->deadline()});
  }
  for (int round = 1; round <= 1000; ++round) {
    for (auto& l : leases) {
      ASSERT_TRUE(l->Extend(kT0 + absl::Seconds(10 + round), kT0));
      held.Touch(l);
    }
    ASSERT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(10 + round));
  }
  EXPECT_EQ(held.NextDue(kT0 + absl::Seconds(1009)), nullptr);
  int due = 0;
  while (held.NextDue(kT0 + absl::Seconds(1010)) != nullptr) ++due;
  EXPECT_EQ(due, 100);
}

struct Request {
  MonoTime timeout_at = MonoTime::Max();
};

TEST(TimedRequestsTest, TimeoutsComeDueInOrderAndFollowSetTimeout) {
  TimedRequests<Request> requests;
  EXPECT_EQ(requests.NextTimeout(), MonoTime::Max());
  requests.Emplace(1, {kT0 + absl::Seconds(5)});
  requests.Emplace(2, {kT0 + absl::Seconds(1)});
  requests.Emplace(3, {});  // none
  EXPECT_EQ(requests.NextTimeout(), kT0 + absl::Seconds(1));
  EXPECT_EQ(requests.Due(kT0 + absl::Seconds(5)), (std::vector<uint64_t>{2, 1}));
  requests.SetTimeout(requests.find(2), MonoTime::Max());
  EXPECT_EQ(requests.Due(kT0 + absl::Seconds(5)), (std::vector<uint64_t>{1}));
  requests.Erase(requests.find(1));
  EXPECT_EQ(requests.NextTimeout(), MonoTime::Max());
  EXPECT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests.TakeAll().size(), 2u);
  EXPECT_TRUE(requests.empty());
  EXPECT_EQ(requests.NextTimeout(), MonoTime::Max());
}

TEST(HeldLeasesTest, LeasesARenewCoversLeaveTheHeapAndComeDueByTheirTtl) {
  auto renewal = std::make_shared<client_internal::SessionRenewal>();
  auto lease = [&](const std::string& lock, absl::Duration ttl) {
    // Published at kT0, its own deadline 10 s later; a Renew gives it 0.7 of its TTL.
    return std::make_shared<LeaseState>(lock, 1, ttl, kT0 + absl::Seconds(10), 0,
                                        LockMode::kExclusive, renewal, ttl * 0.7, kT0);
  };
  HeldLeases held;
  auto a = lease("a", absl::Seconds(30));
  auto b = lease("b", absl::Seconds(20));
  auto c = lease("c", absl::Seconds(20));
  for (const auto& l : {a, b, c}) held.Put(l->lock(), HeldLeases::Held{l, l->deadline()});
  // A Renew sent at kT0 itself does not cover them (it may have gone before they were known).
  renewal->Advance(kT0, kT0 + absl::Seconds(100));
  EXPECT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(10));
  // One sent after does: each is due at base + 0.7 × its TTL, no later than the session's.
  renewal->Advance(kT0 + absl::Seconds(5), kT0 + absl::Seconds(100));
  EXPECT_EQ(held.NextDue(kT0 + absl::Seconds(10)), nullptr);  // they leave the heap here
  EXPECT_EQ(held.covered_total(), 3u);
  EXPECT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(19));
  // Renewed again: nothing to move, the earliest moves with it.
  renewal->Advance(kT0 + absl::Seconds(15), kT0 + absl::Seconds(100));
  EXPECT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(29));
  EXPECT_EQ(held.covered_total(), 3u);
  // c renewed by name past the Renews: when its TTL's turn comes it goes back to the heap.
  ASSERT_TRUE(c->Extend(kT0 + absl::Seconds(50), kT0 + absl::Seconds(16)));
  held.Touch(c);
  auto due = held.NextDue(kT0 + absl::Seconds(29));
  ASSERT_NE(due, nullptr);
  EXPECT_EQ(due, b);
  EXPECT_EQ(held.NextDue(kT0 + absl::Seconds(29)), nullptr);
  held.Erase(held.find("b"));
  EXPECT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(36));  // a: 15 + 21
  EXPECT_EQ(held.NextDue(kT0 + absl::Seconds(36)), a);
  held.Erase(held.find("a"));
  EXPECT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(50));  // c, in the heap again
  // The session's deadline caps them all.
  auto d = lease("d", absl::Seconds(30));
  held.Put("d", HeldLeases::Held{d, d->deadline()});
  EXPECT_EQ(held.NextDue(kT0 + absl::Seconds(10)), nullptr);
  EXPECT_EQ(held.EarliestDeadline(), kT0 + absl::Seconds(36));
  // The session's deadline caps what a Renew gives.
  auto capped = std::make_shared<client_internal::SessionRenewal>();
  capped->Advance(kT0 + absl::Seconds(5), kT0 + absl::Seconds(12));
  LeaseState e("e", 2, absl::Seconds(30), kT0 + absl::Seconds(10), 0, LockMode::kExclusive,
               capped, absl::Seconds(21), kT0);
  EXPECT_EQ(e.deadline(), kT0 + absl::Seconds(12));
  EXPECT_EQ(e.Check(kT0 + absl::Seconds(12)), LossReason::kDeadlinePassed);
}

}  // namespace
}  // namespace fencelock::client_core
