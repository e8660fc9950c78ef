// lockd's etcd commit log (lock-server/etcd_commit_log.h) on the simulated etcd, in-process:
// on an Asio event loop as in lockd, with the threads that carry its etcd calls
// (CallOnThreads), under ThreadSanitizer with no gRPC beneath them. What is committed comes
// back; a second log is refused; a reply lost after its commit, and an election, cost nothing;
// a deleted owner key and an ownership that lapses fault the log; and a standby takes over a
// replica cut off from etcd only after that replica's ownership deadline; a replica that
// starts during an election waits it out. The log's timing is on the real clock (owner TTL
// 2 s), and so is the simulated etcd's here.
#include <atomic>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-server/etcd_commit_log.h"
#include "lock-server/etcd_store.h"
#include "lock-server/lock_service.h"
#include "lock-server/storage.h"
#include "net/asio.h"
#include "net/asio_time_source.h"
#include "sim/sim_etcd.h"

namespace fencelock::sim {
namespace {

using ::testing::HasSubstr;
using server::CommitLog;
using server::EtcdCommitLogOptions;
using server::FenceToken;
using server::LockService;

constexpr char kPrefix[] = "/fencelock/sim";

// One lockd replica's core on the etcd log, on an event loop of its own as lockd's, the log's
// etcd calls carried by threads as against a real cluster: the lock service writing through it.
class Replica : public server::CommitLogListener {
 public:
  Replica(SimEtcd& etcd, const std::string& name, absl::Duration owner_wait = absl::ZeroDuration(),
          std::function<void(MonoTime sent, MonoTime until)> on_owned = nullptr,
          absl::Duration hold_off = absl::ZeroDuration()) {
    EtcdCommitLogOptions o{.prefix = kPrefix,
                           .owner_ttl = absl::Seconds(2),
                           .owner_wait = owner_wait,
                           .campaign_hold_off = hold_off,
                           .owner = name};
    o.log = [](const std::string&) {};
    o.on_owned = std::move(on_owned);
    std::optional<absl::StatusOr<server::OpenedCommitLog>> opened;
    auto opening = server::OpenEtcdCommitLogOn(
        o, &time_, server::CallOnThreads(etcd.Connect(name), &time_),
        [&](absl::StatusOr<server::OpenedCommitLog> r) { opened = std::move(r); });
    while (!opened.has_value()) io_.run_one();
    status_ = opened->status();
    if (!opened->ok()) return;
    service_ = std::make_unique<LockService>(server::ServiceOptions{}, std::move((*opened)->state));
    log_ = std::move((*opened)->log);
    log_->SetListener(this);
    service_->set_record_observer([this](const server::Record& r) {
      log_->ReserveFor(service_->state().last_token(), service_->state().last_session_id());
      log_->Append(r);
    });
  }
  ~Replica() override {
    log_.reset();
    service_.reset();
  }
  const absl::Status& status() const { return status_; }
  CommitLog& log() { return *log_; }
  LockService& service() { return *service_; }

  // Takes `n` locks in one new session; their tokens.
  std::vector<FenceToken> Take(int n, const std::string& tag) {
    std::vector<FenceToken> tokens;
    const MonoTime now = Clock::Real()->Now();
    auto session = service_->OpenSession(absl::Seconds(60), now);
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return tokens;
    for (int i = 0; i < n; ++i) {
      auto g = service_->Acquire(session->first, absl::StrCat(tag, i), absl::Seconds(60), {}, 0,
                                 now);
      EXPECT_TRUE(g.ok()) << g.status();
      if (g.ok()) tokens.push_back(g->token);
    }
    return tokens;
  }
  // Commits what is appended; false if the log faulted first (or took 10 s).
  bool Durable() {
    log_->Flush();
    RunUntil([&] { return log_->committed_batch() >= log_->newest_batch() || !fault_.ok(); });
    return fault_.ok() && log_->committed_batch() >= log_->newest_batch();
  }
  // Waits until the log faults; its fault, or OK after 10 s.
  absl::Status AwaitFault() {
    RunUntil([&] { return !fault_.ok() || log_->fault() != nullptr; });
    if (!fault_.ok()) return fault_;
    return log_->fault() != nullptr ? *log_->fault() : absl::OkStatus();
  }
  // Runs the replica's event loop for `d`.
  void RunFor(absl::Duration d) {
    io_.run_for(absl::ToChronoNanoseconds(d));
    io_.restart();
  }

  void OnCommitted(uint64_t) override {}
  void OnCommitFault(const absl::Status& s) override { fault_ = s; }
  void OnSnapshotDue() override { log_->Snapshot(service_->state()); }

 private:
  // Runs the event loop until `done` holds, or 10 s.
  void RunUntil(const std::function<bool()>& done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < give_up) {
      io_.run_one_for(std::chrono::milliseconds(50));
    }
  }

  asio::io_context io_{1};
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  AsioTimeSource time_{io_, Clock::Real()};
  absl::Status status_;
  std::unique_ptr<LockService> service_;
  std::unique_ptr<CommitLog> log_;
  absl::Status fault_;
};

class EtcdLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = etcd_.Connect("setup");
    ASSERT_TRUE(server::InitEtcdPrefixOn({.prefix = kPrefix}, *c).ok());
  }
  // The holders a fresh replica restores.
  std::map<std::string, FenceToken> Restored() {
    Replica r(etcd_, "reader");
    EXPECT_TRUE(r.status().ok()) << r.status();
    std::map<std::string, FenceToken> out;
    if (!r.status().ok()) return out;
    for (const server::LockState* h : r.service().state().locks()) {
      if (h->held()) out[std::string(h->name())] = h->holders().front().token;
    }
    return out;
  }

  SimEtcd etcd_{Clock::Real()};
};

TEST_F(EtcdLogTest, WhatIsCommittedComesBackOnTheNextReplica) {
  std::map<std::string, FenceToken> held;
  {
    Replica a(etcd_, "a");
    ASSERT_TRUE(a.status().ok()) << a.status();
    const std::vector<FenceToken> tokens = a.Take(20, "lock-");
    for (size_t i = 0; i < tokens.size(); ++i) held[absl::StrCat("lock-", i)] = tokens[i];
    ASSERT_TRUE(a.Durable());
  }
  EXPECT_EQ(Restored(), held);
}

TEST_F(EtcdLogTest, ASecondReplicaIsRefusedNamingTheFirst) {
  Replica a(etcd_, "lockd pid 1 on host a");
  ASSERT_TRUE(a.status().ok()) << a.status();
  Replica b(etcd_, "b");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.status().message(), HasSubstr("is served by lockd pid 1 on host a"));
}

TEST_F(EtcdLogTest, RepliesLostAfterTheirCommitAndAnElectionCostNothing) {
  std::map<std::string, FenceToken> held;
  {
    Replica a(etcd_, "a");
    ASSERT_TRUE(a.status().ok()) << a.status();
    etcd_.LoseRepliesAfterCommit(3);
    const std::vector<FenceToken> lost = a.Take(5, "lost-");
    for (size_t i = 0; i < lost.size(); ++i) held[absl::StrCat("lost-", i)] = lost[i];
    ASSERT_TRUE(a.Durable()) << "a retried transaction must find its first try applied";
    // No leader for 300 ms, well inside the ownership (2 s x 0.7): commits wait it out.
    etcd_.SetUnavailable(true);
    std::vector<FenceToken> during = a.Take(5, "during-");
    a.log().Flush();
    a.RunFor(absl::Milliseconds(300));
    etcd_.SetUnavailable(false);
    ASSERT_TRUE(a.Durable());
    for (size_t i = 0; i < during.size(); ++i) held[absl::StrCat("during-", i)] = during[i];
  }
  EXPECT_EQ(Restored(), held);
}

TEST_F(EtcdLogTest, ADeletedOwnerKeyEndsTheReplicaAndNothingMoreIsCommitted) {
  Replica a(etcd_, "a");
  ASSERT_TRUE(a.status().ok()) << a.status();
  a.Take(2, "before-");
  ASSERT_TRUE(a.Durable());
  ASSERT_TRUE(etcd_.Delete(std::string(kPrefix) + "/owner"));
  const absl::Status fault = a.AwaitFault();
  EXPECT_FALSE(fault.ok());
  // Taken away, not lapsed: lockd holds off before it campaigns again.
  EXPECT_TRUE(server::OwnershipTakenAway(fault)) << fault;
  a.Take(2, "after-");
  EXPECT_FALSE(a.Durable());
}

// A replica standing by again after its ownership was taken away holds off its campaign: a
// standby that starts after it, without one, takes the prefix first; it takes over only once
// that one goes.
TEST_F(EtcdLogTest, AStandbyThatHoldsOffLetsAnotherTakeOverFirst) {
  std::unique_ptr<Replica> held_off;
  std::atomic<bool> took{false};
  std::thread waiting([&] {
    held_off = std::make_unique<Replica>(etcd_, "held-off", absl::InfiniteDuration(), nullptr,
                                         absl::Seconds(1));
    took = true;
  });
  // Joined on every way out, an ASSERT's too (the held-off one takes the prefix by then).
  absl::Cleanup join = [&] {
    if (waiting.joinable()) waiting.join();
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto other = std::make_unique<Replica>(etcd_, "other", absl::Seconds(3));
  ASSERT_TRUE(other->status().ok()) << other->status();
  std::vector<FenceToken> tokens = other->Take(1, "held-");
  ASSERT_TRUE(other->Durable());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past the hold-off
  EXPECT_FALSE(took) << "the replica holding off took the prefix while another served it";
  other.reset();  // gives its lease back
  std::move(join).Invoke();
  ASSERT_TRUE(held_off->status().ok()) << held_off->status();
  const server::HolderState* h = held_off->service().state().FindHolder("held-0");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->token, tokens[0]);
}

TEST_F(EtcdLogTest, AReplicaCutOffFromEtcdFaultsBeforeAStandbyTakesOver) {
  std::atomic<int64_t> a_until{0};
  auto a = std::make_unique<Replica>(etcd_, "a", absl::ZeroDuration(),
                                     [&](MonoTime, MonoTime until) { a_until = until.nanos(); });
  ASSERT_TRUE(a->status().ok()) << a->status();
  std::vector<FenceToken> tokens = a->Take(3, "held-");
  ASSERT_TRUE(a->Durable());

  std::unique_ptr<Replica> b;
  MonoTime b_ready;
  std::thread standby([&] {
    b = std::make_unique<Replica>(etcd_, "b", absl::InfiniteDuration());
    b_ready = Clock::Real()->Now();
  });
  etcd_.Partition("a", true);  // a's renewals fail from now on
  const absl::Status fault = a->AwaitFault();
  EXPECT_FALSE(fault.ok());
  EXPECT_THAT(fault.message(), HasSubstr("ownership of etcd prefix"));
  EXPECT_FALSE(server::OwnershipTakenAway(fault)) << fault;
  standby.join();
  ASSERT_TRUE(b->status().ok()) << b->status();
  // b serves only after a's own deadline has passed: never two owners at once.
  EXPECT_GT(b_ready.nanos(), a_until.load());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const server::HolderState* h = b->service().state().FindHolder(absl::StrCat("held-", i));
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->token, tokens[i]);
  }
  // Tokens keep rising across the takeover.
  std::vector<FenceToken> next = b->Take(1, "next-");
  ASSERT_EQ(next.size(), 1u);
  EXPECT_GT(next[0], tokens.back());
  ASSERT_TRUE(b->Durable());
  etcd_.Partition("a", false);
  a.reset();
}

// A lockd that starts as owner (lockd waits its owner TTL plus 2 s) rides out an election
// that began before it: its reads and its take are asked again, and it serves once etcd
// answers. An etcd away for longer than that wait fails the start, naming etcd's answer.
TEST_F(EtcdLogTest, AStartingReplicaWaitsOutAnElectionButNotForever) {
  etcd_.SetUnavailable(true);
  std::thread leader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    etcd_.SetUnavailable(false);
  });
  const absl::Duration wait = absl::Seconds(4);
  {
    Replica a(etcd_, "a", wait);
    leader.join();
    ASSERT_TRUE(a.status().ok()) << a.status();
    a.Take(1, "x-");
    ASSERT_TRUE(a.Durable());
  }
  etcd_.SetUnavailable(true);
  const absl::Time before = absl::Now();
  Replica b(etcd_, "b", absl::Seconds(1));
  EXPECT_FALSE(b.status().ok());
  EXPECT_TRUE(absl::IsUnavailable(b.status()) || absl::IsDeadlineExceeded(b.status()))
      << b.status();
  EXPECT_GE(absl::Now() - before, absl::Seconds(1));
  etcd_.SetUnavailable(false);
}

// A prefix whose reserved token mark is above 2^63 (damaged, or written by hand) is refused by
// name before the replica serves: its tokens would wrap to 0 within a few grants.
TEST_F(EtcdLogTest, APrefixWhoseTokenMarkWouldWrapIsRefused) {
  etcd_.Put(absl::StrCat(kPrefix, "/sequences"),
            server::EncodeSequences({FenceToken(~uint64_t{0} - 2), server::SessionId(4)}));
  Replica a(etcd_, "a");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(a.status().message(),
              HasSubstr("etcd prefix /fencelock/sim: the next fencing token would be above "
                        "18446744073709551613"));
}

// A prefix inside or around an initialized one is refused, in either order, naming it: their
// key ranges overlap, so destroying the outer one would delete the inner one's state (a token
// sequence started again). A sibling whose name merely begins the same way is not nested.
TEST_F(EtcdLogTest, InitRefusesAPrefixInsideOrAroundAnInitializedOne) {
  auto c = etcd_.Connect("init");
  absl::Status inside = server::InitEtcdPrefixOn({.prefix = "/fencelock/sim/inner"}, *c);
  EXPECT_EQ(inside.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(inside.message(), HasSubstr("etcd prefix /fencelock/sim/inner lies inside etcd "
                                          "prefix /fencelock/sim"));
  absl::Status around = server::InitEtcdPrefixOn({.prefix = "/fencelock"}, *c);
  EXPECT_EQ(around.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(around.message(),
              HasSubstr("etcd prefix /fencelock/sim lies inside etcd prefix /fencelock"));
  EXPECT_FALSE(etcd_.Get("/fencelock/sim/inner/format").has_value());
  EXPECT_FALSE(etcd_.Get("/fencelock/format").has_value());
  EXPECT_TRUE(server::InitEtcdPrefixOn({.prefix = "/fencelock/sim2"}, *c).ok());
  EXPECT_EQ(server::InitEtcdPrefixOn({.prefix = "/fencelock//x"}, *c).code(),
            absl::StatusCode::kInvalidArgument);
}

// A nested layout made before init refused it (or by hand) is refused by the start of either
// prefix, naming the other: the outer one's range holds the inner one's keys.
TEST_F(EtcdLogTest, AReplicaRefusesToServeANestedLayout) {
  for (const auto& [key, value] : etcd_.Dump(std::string(kPrefix) + "/")) {
    etcd_.Put(absl::StrCat(kPrefix, "/log", key.substr(std::string(kPrefix).size())), value);
  }
  Replica outer(etcd_, "outer");
  EXPECT_EQ(outer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(outer.status().message(),
              HasSubstr("etcd prefix /fencelock/sim/log lies inside etcd prefix /fencelock/sim"));
  EXPECT_FALSE(etcd_.Get(absl::StrCat(kPrefix, "/owner")).has_value());
}

// lockd destroy deletes the keys lockd wrote and leaves (and lists) what someone else put under
// the prefix; it refuses, deleting nothing, while a state is nested inside.
TEST_F(EtcdLogTest, DestroyDeletesExactlyLockdsOwnKeys) {
  {
    Replica a(etcd_, "a");
    ASSERT_TRUE(a.status().ok()) << a.status();
    a.Take(3, "x");
    ASSERT_TRUE(a.Durable());
  }
  etcd_.Put(absl::StrCat(kPrefix, "/notes"), "the operator's");
  etcd_.Put(absl::StrCat(kPrefix, "/inner/format"), "somebody's state");
  auto destroy = [&] {
    asio::io_context io(1);
    AsioTimeSource time(io, Clock::Real());
    auto work = asio::make_work_guard(io);
    std::optional<absl::StatusOr<server::EtcdDestroyOutcome>> outcome;
    auto destroying = server::DestroyEtcdPrefixOn(
        {.prefix = kPrefix, .owner_ttl = absl::Seconds(2), .owner_wait = absl::Seconds(5)}, &time,
        server::CallOnThreads(etcd_.Connect("destroy"), &time),
        [](const server::StateMachine&) { return std::vector<std::string>(); },
        [&](absl::StatusOr<server::EtcdDestroyOutcome> out) { outcome = std::move(out); });
    while (!outcome.has_value()) io.run_one();
    destroying.reset();
    io.poll();
    return std::move(*outcome);
  };
  const size_t before = etcd_.Dump(std::string(kPrefix) + "/").size();
  auto refused = destroy();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("/fencelock/sim/inner lies inside"));
  EXPECT_EQ(etcd_.Dump(std::string(kPrefix) + "/").size(), before);

  ASSERT_TRUE(etcd_.Delete(absl::StrCat(kPrefix, "/inner/format")));
  auto out = destroy();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->left, ::testing::ElementsAre("/fencelock/sim/notes"));
  EXPECT_GE(out->deleted, static_cast<int64_t>(before) - 2);  // and the destroy's own P/owner
  std::vector<std::string> remaining;
  for (const auto& kv : etcd_.Dump(std::string(kPrefix) + "/")) remaining.push_back(kv.first);
  EXPECT_THAT(remaining, ::testing::ElementsAre("/fencelock/sim/notes"));
}

// The ownership's deadline counts from a lease renewal sent after P/owner-lease was recorded,
// not from the renewal before the take: that one may be most of the deadline ago once the take's
// four round trips are done on a slow etcd (CI, stop 51: a lockd that took over lapsed 50 ms
// after it began to serve).
TEST(EtcdOwnershipTest, TheDeadlineCountsFromARenewalAfterTheTakeIsRecorded) {
  SimEtcd etcd(Clock::Real());
  std::atomic<int64_t> recorded{0};
  const std::string owner_lease = absl::StrCat(kPrefix, "/owner-lease");
  etcd.SetObserver([&](const etcdserverpb::Event* e) {
    if (e != nullptr && e->kv().key() == owner_lease) recorded = Clock::Real()->Now().nanos();
  });
  ASSERT_TRUE(server::InitEtcdPrefixOn({.prefix = kPrefix}, *etcd.Connect("setup")).ok());
  std::atomic<int64_t> first_sent{0};
  Replica a(etcd, "a", absl::ZeroDuration(), [&](MonoTime sent, MonoTime) {
    int64_t none = 0;
    first_sent.compare_exchange_strong(none, sent.nanos());
  });
  ASSERT_TRUE(a.status().ok()) << a.status();
  ASSERT_GT(recorded.load(), 0);
  EXPECT_GT(first_sent.load(), recorded.load());
}

}  // namespace
}  // namespace fencelock::sim
