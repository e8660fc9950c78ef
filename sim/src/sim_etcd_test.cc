// The simulated etcd answers as etcd does where the etcd commit log depends on it: revisions,
// compares, a put on a missing lease, lease expiry on its clock, compaction, watches and the
// faults. On simulated time.
#include "sim/sim_etcd.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::sim {
namespace {

using etcdserverpb::Compare;
using etcdserverpb::RangeRequest;
using etcdserverpb::TxnRequest;
using ::testing::HasSubstr;

TxnRequest PutIfAbsent(const std::string& key, const std::string& value, int64_t lease = 0) {
  TxnRequest t;
  Compare* c = t.add_compare();
  c->set_key(key);
  c->set_target(Compare::VERSION);
  c->set_result(Compare::EQUAL);
  c->set_version(0);
  auto* put = t.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  t.add_failure()->mutable_request_range()->set_key(key);
  return t;
}

RangeRequest Prefix(const std::string& p) {
  RangeRequest r;
  r.set_key(p);
  std::string end = p;
  end.back() = static_cast<char>(end.back() + 1);
  r.set_range_end(end);
  return r;
}

TEST(SimEtcdTest, TransactionsCompareAndRevisionsRise) {
  SimulatedClock clock(MonoTime::FromNanos(1));
  SimEtcd etcd(&clock);
  auto c = etcd.Connect("a");
  auto first = c->Txn(PutIfAbsent("/p/k", "one"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->succeeded());
  const int64_t created = first->header().revision();
  auto second = c->Txn(PutIfAbsent("/p/k", "two"));
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->succeeded());
  ASSERT_EQ(second->responses(0).response_range().kvs_size(), 1);
  EXPECT_EQ(second->responses(0).response_range().kvs(0).value(), "one");
  EXPECT_EQ(second->responses(0).response_range().kvs(0).create_revision(), created);
  EXPECT_EQ(second->header().revision(), created);  // nothing changed
  etcd.Put("/p/l", "x");
  etcd.Put("/q", "outside");
  RangeRequest all = Prefix("/p/");
  all.set_limit(1);
  auto page = c->Range(all);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->kvs_size(), 1);
  EXPECT_TRUE(page->more());
  EXPECT_EQ(page->count(), 2);
  EXPECT_EQ(etcd.revision(), created + 2);
}

TEST(SimEtcdTest, LeasesExpireOnTheClockWithTheirKeys) {
  SimulatedClock clock(MonoTime::FromNanos(1));
  SimEtcd etcd(&clock);
  auto c = etcd.Connect("a");
  auto lease = c->LeaseGrant(absl::Seconds(2));
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(c->Txn(PutIfAbsent("/p/owner", "a", *lease)).ok());
  // A put on a lease that does not exist fails the whole transaction.
  auto bad = c->Txn(PutIfAbsent("/p/other", "b", 999));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(etcd.Dump("/p/other").empty());
  clock.Advance(absl::Milliseconds(1500));
  ASSERT_TRUE(c->LeaseKeepAlive(*lease).ok());
  clock.Advance(absl::Milliseconds(1500));
  auto life = c->LeaseTimeToLive(*lease);
  ASSERT_TRUE(life.ok());
  EXPECT_EQ(life->granted, absl::Seconds(2));
  EXPECT_EQ(etcd.Dump("/p/").size(), 1u);
  clock.Advance(absl::Seconds(1));
  etcd.Tick();
  EXPECT_TRUE(etcd.Dump("/p/").empty());
  EXPECT_EQ(c->LeaseKeepAlive(*lease).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(etcd.leases(), 0u);
}

TEST(SimEtcdTest, WatchesSeeChangesAndBreakOnFaults) {
  SimulatedClock clock(MonoTime::FromNanos(1));
  SimEtcd etcd(&clock);
  auto c = etcd.Connect("a");
  etcd.Put("/p/owner", "a");
  const int64_t from = etcd.revision() + 1;
  auto w = c->Watch("/p/owner", from);
  ASSERT_TRUE(w.ok());
  std::thread deleter([&] { etcd.Delete("/p/owner"); });
  auto changes = (*w)->Next();
  deleter.join();
  ASSERT_TRUE(changes.ok()) << changes.status();
  ASSERT_EQ(changes->events.size(), 1u);
  EXPECT_EQ(changes->events[0].type(), etcdserverpb::Event::DELETE);
  std::thread partition([&] { etcd.Partition("a", true); });
  EXPECT_EQ((*w)->Next().status().code(), absl::StatusCode::kUnavailable);
  partition.join();
  EXPECT_EQ(c->Range(Prefix("/p/")).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(etcd.Connect("b")->Range(Prefix("/p/")).ok());  // only "a" is cut off
  etcd.Partition("a", false);
  etcd.Put("/p/later", "x");
  ASSERT_TRUE(c->Compact(etcd.revision()).ok());  // `from` is gone from the history
  auto old = c->Watch("/p/owner", from);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ((*old)->Next().status().code(), absl::StatusCode::kOutOfRange);
}

TEST(SimEtcdTest, ALostReplyWasAppliedAndNoSpaceRefusesWrites) {
  SimulatedClock clock(MonoTime::FromNanos(1));
  SimEtcd etcd(&clock);
  auto c = etcd.Connect("a");
  etcd.LoseRepliesAfterCommit(1);
  auto lost = c->Txn(PutIfAbsent("/p/k", "v"));
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(etcd.Dump("/p/").size(), 1u);  // applied all the same
  auto again = c->Txn(PutIfAbsent("/p/k", "v"));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->succeeded());
  etcd.SetNoSpace(true);
  auto full = c->Txn(PutIfAbsent("/p/m", "v"));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("database space exceeded"));
  EXPECT_TRUE(c->Range(Prefix("/p/")).ok());  // reads still work
}

}  // namespace
}  // namespace fencelock::sim
