// PoolManager (lock-client/pool_manager.h) and its example manager against a real lockd on its
// Unix socket: admission within the budget and exact release, demand kept current across
// lockd's demand TTL and across a lockd restart, a restarted manager that reconciles, a fenced
// one, generations, bad options; and the example killed mid-run and started again, with every
// job run exactly once and never more workers than the budget.
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/pool_client.h"
#include "lock-client/pool_manager.h"
#include "lockd_process.h"
#include "process/process.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::LockdProcess;

std::unique_ptr<PoolClient> Operator(const LockdProcess& lockd) {
  auto c = PoolClient::Create({.server = lockd.unix_address()});
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

PoolManagerOptions Options(const LockdProcess& lockd, const std::string& profile) {
  PoolManagerOptions o;
  o.client.server = lockd.unix_address();
  o.pool = "p";
  o.profile = profile;
  o.acquire_retry = absl::Milliseconds(100);
  o.demand_refresh = absl::Milliseconds(200);
  o.reconcile = [](const PoolLeaseView&) { return PoolWorkerState::kRunning; };
  return o;
}

std::unique_ptr<PoolManager> StartManager(const PoolManagerOptions& o) {
  auto m = PoolManager::Start(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

const PoolProfileView* Profile(const PoolView& v, const std::string& id) {
  for (const PoolProfileView& p : v.profiles) {
    if (p.profile.id == id) return &p;
  }
  return nullptr;
}

// Polls `done` every 20 ms for up to `limit`; whether it came true.
bool Eventually(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(20)) {
  for (absl::Time end = absl::Now() + limit; absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(20))) {
    if (done()) return true;
  }
  return done();
}

TEST(PoolManagerTest, AdmitsWithinTheBudgetWaitsForUnitsAndReleasesExactly) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  auto op = Operator(lockd);
  ASSERT_TRUE(op->publish("p", 1, 2, {{.id = "a"}}).ok());
  auto m = StartManager(Options(lockd, "a"));
  ASSERT_NE(m, nullptr);
  auto s1 = m->acquire("s1", absl::ZeroDuration());
  auto s2 = m->acquire("s2", absl::ZeroDuration());
  ASSERT_TRUE(s1.ok() && s2.ok()) << s1.status() << s2.status();
  EXPECT_NE(s1->token, s2->token);
  // The budget is used up: a try that may not wait is told the figures.
  auto s3 = m->acquire("s3", absl::ZeroDuration());
  EXPECT_EQ(s3.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s3.status().message(), HasSubstr("no units for p/a/s3"));
  // A slot it holds already is refused as lockd refuses it.
  EXPECT_EQ(m->acquire("s1", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m->activate(*s1).ok());
  EXPECT_TRUE(s1->active);
  // A waiting acquire gets the units once s2 is released.
  absl::StatusOr<PoolAdmission> waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = m->acquire("s3", absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(m->release(*s2).ok());
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  auto leases = m->leases();
  ASSERT_EQ(leases.size(), 2u);
  EXPECT_EQ(leases[0].slot, "s1");
  EXPECT_TRUE(leases[0].active);
  EXPECT_EQ(leases[1].slot, "s3");
  EXPECT_FALSE(leases[1].active);
  // A released lease released again is gone already, which is what the caller wanted.
  EXPECT_TRUE(m->release(*s2).ok());
  ASSERT_TRUE(m->release(*s1).ok());
  ASSERT_TRUE(m->release(*waited).ok());
  auto view = op->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->leases.empty());
  EXPECT_TRUE(m->leases().empty());
  EXPECT_TRUE(m->health().ok()) << m->health();
}

// ADR-0006: the manager's refresh keeps its demand current past lockd's demand TTL (3 s here),
// and tells a restarted lockd (which forgot all demand) again; provisional leases are renewed
// past their TTL. Without the refresh the demand would read "unknown" after 3 s.
TEST(PoolManagerTest, KeepsDemandCurrentAcrossTheDemandTtlAndALockdRestart) {
  LockdProcess lockd(LockdProcess::Options{
      .unix_socket = true,
      .extra_args = {"--pool-demand-ttl=3s", "--pool-provisional-ttl=1s"}});
  auto op = Operator(lockd);
  ASSERT_TRUE(op->publish("p", 1, 4, {{.id = "a"}, {.id = "b"}}).ok());
  auto m = StartManager(Options(lockd, "a"));
  ASSERT_NE(m, nullptr);
  m->setDemand(3);
  auto lease = m->acquire("s1", absl::ZeroDuration());
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::SleepFor(absl::Seconds(4));
  auto view = op->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  const PoolProfileView* a = Profile(*view, "a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->pending_units.has_value()) << "demand lapsed";
  EXPECT_EQ(*a->pending_units, 3u);
  // The provisional lease (1 s TTL) is still there, and activates.
  ASSERT_EQ(view->leases.size(), 1u);
  ASSERT_TRUE(m->activate(*lease).ok());

  lockd.Kill();
  lockd.Restart();
  ASSERT_TRUE(Eventually([&] {
    auto v = op->status("p");
    return v.ok() && Profile(*v, "a")->pending_units == 3u;
  })) << "the restarted lockd was not told the demand again";
  EXPECT_TRUE(Eventually([&] { return m->health().ok(); })) << m->health();
  // The active lease survived the restart and is released exactly.
  ASSERT_TRUE(m->release(*lease).ok());
  // A manager that stops says it no longer contends: known zero, not unknown.
  m.reset();
  view = op->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(Profile(*view, "a")->pending_units, 0u);
}

// ADR-0003's manager handoff: a restarted manager claims the profile, keeps the leases of
// workers that run or were created under an active lease, and frees exactly the others; the
// earlier manager is fenced out of everything from then on.
TEST(PoolManagerTest, ARestartedManagerReconcilesAndTheEarlierOneIsFencedOut) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  auto op = Operator(lockd);
  ASSERT_TRUE(op->publish("p", 1, 5, {{.id = "a"}}).ok());
  auto first = StartManager(Options(lockd, "a"));
  ASSERT_NE(first, nullptr);
  std::map<std::string, PoolAdmission> held;
  for (const char* slot : {"running", "gone", "created", "provisional", "started-early"}) {
    auto l = first->acquire(slot, absl::ZeroDuration());
    ASSERT_TRUE(l.ok()) << l.status();
    held[slot] = *l;
  }
  for (const char* slot : {"running", "gone", "created"}) ASSERT_TRUE(first->activate(held[slot]).ok());

  PoolManagerOptions o = Options(lockd, "a");
  std::map<std::string, bool> asked;
  o.reconcile = [&](const PoolLeaseView& l) {
    asked[l.slot] = l.active;
    if (l.slot == "running" || l.slot == "started-early") return PoolWorkerState::kRunning;
    if (l.slot == "created" || l.slot == "provisional") return PoolWorkerState::kCreated;
    return PoolWorkerState::kAbsent;
  };
  auto second = StartManager(o);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(asked.size(), 5u);
  EXPECT_GT(second->owner().epoch, first->owner().epoch);
  std::set<std::string> kept, released;
  for (const PoolAdmission& a : second->reconciliation().kept) {
    kept.insert(a.slot);
    EXPECT_TRUE(a.active) << a.slot;
  }
  for (const PoolAdmission& a : second->reconciliation().released) released.insert(a.slot);
  EXPECT_EQ(kept, (std::set<std::string>{"running", "created", "started-early"}));
  EXPECT_EQ(released, (std::set<std::string>{"gone", "provisional"}));
  auto view = op->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->leases.size(), 3u);
  for (const PoolLeaseView& l : view->leases) EXPECT_TRUE(l.active) << l.slot;

  // The first manager can do nothing more, and says why.
  auto late = first->acquire("late", absl::ZeroDuration());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_THAT(late.status().message(), HasSubstr("stale manager"));
  EXPECT_EQ(first->release(held["running"]).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(first->health().code(), absl::StatusCode::kAborted);
  view = op->status("p");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->leases.size(), 3u);
  // The second releases what it kept when those workers end.
  for (const PoolAdmission& a : second->leases()) ASSERT_TRUE(second->release(a).ok());
  view = op->status("p");
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(view->leases.empty());
}

TEST(PoolManagerTest, FollowsANewGenerationThatKeepsItsProfileUnlessPinned) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  auto op = Operator(lockd);
  ASSERT_TRUE(op->publish("p", 1, 4, {{.id = "a"}, {.id = "b"}}).ok());
  auto follows = StartManager(Options(lockd, "a"));
  PoolManagerOptions pinned_options = Options(lockd, "b");
  pinned_options.generation = 1;
  auto pinned = StartManager(pinned_options);
  ASSERT_TRUE(follows && pinned);
  ASSERT_TRUE(op->publish("p", 2, 4, {{.id = "a"}, {.id = "b"}}).ok());
  auto l = follows->acquire("s1", absl::ZeroDuration());
  EXPECT_TRUE(l.ok()) << l.status();
  auto refused = pinned->acquire("s1", absl::ZeroDuration());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("generation"));
  // A generation without the profile is not followed either.
  ASSERT_TRUE(follows->release(*l).ok());
  ASSERT_TRUE(op->publish("p", 3, 4, {{.id = "b"}}).ok());
  EXPECT_FALSE(follows->acquire("s2", absl::ZeroDuration()).ok());
}

TEST(PoolManagerTest, BadOptionsAreRefusedNamingTheOption) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  auto op = Operator(lockd);
  ASSERT_TRUE(op->publish("p", 1, 4, {{.id = "a"}}).ok());
  struct Case {
    std::function<void(PoolManagerOptions&)> change;
    const char* named;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {[](PoolManagerOptions& o) { o.reconcile = nullptr; }, "reconcile",
       absl::StatusCode::kInvalidArgument},
      {[](PoolManagerOptions& o) { o.profile.clear(); }, "profile",
       absl::StatusCode::kInvalidArgument},
      {[](PoolManagerOptions& o) { o.demand_refresh = absl::Seconds(30); }, "demand_refresh",
       absl::StatusCode::kInvalidArgument},
      {[](PoolManagerOptions& o) { o.demand_refresh = absl::ZeroDuration(); }, "demand_refresh",
       absl::StatusCode::kInvalidArgument},
      {[](PoolManagerOptions& o) { o.acquire_retry = absl::Hours(1); }, "acquire_retry",
       absl::StatusCode::kInvalidArgument},
      {[](PoolManagerOptions& o) { o.release_patience = -absl::Seconds(1); }, "release_patience",
       absl::StatusCode::kInvalidArgument},
      {[](PoolManagerOptions& o) { o.profile = "nope"; }, "no profile \"nope\"",
       absl::StatusCode::kNotFound},
      {[](PoolManagerOptions& o) { o.pool = "nope"; }, "nope", absl::StatusCode::kNotFound},
      {[](PoolManagerOptions& o) { o.generation = 7; }, "generation",
       absl::StatusCode::kFailedPrecondition},
  };
  for (const Case& c : cases) {
    PoolManagerOptions o = Options(lockd, "a");
    c.change(o);
    auto m = PoolManager::Start(o);
    EXPECT_EQ(m.status().code(), c.code) << c.named << ": " << m.status();
    EXPECT_THAT(m.status().message(), HasSubstr(c.named));
  }
  PoolManagerOptions unreachable = Options(lockd, "a");
  unreachable.client.server = "unix:" + lockd.unix_path() + ".nobody";
  unreachable.client.timeout = absl::Milliseconds(500);
  EXPECT_EQ(PoolManager::Start(unreachable).status().code(), absl::StatusCode::kUnavailable);
}

// The example manager (lock-client/examples/pool_manager_demo.cc), killed with SIGKILL while
// two workers run and started again: it adopts both, waits for them, releases their leases,
// and runs the rest. Every job runs exactly once, never more than the budget's 2 workers at a
// time though the manager has 3 slots, and no lease is left.
TEST(PoolManagerDemoTest, AManagerKilledMidRunAdoptsItsWorkersAndEveryJobRunsOnce) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  auto op = Operator(lockd);
  ASSERT_TRUE(op->publish("hosts", 1, 2, {{.id = "build"}}).ok());
  testing::TempDir tmp;
  const std::string dir = tmp.path();
  ASSERT_EQ(::mkdir((dir + "/running").c_str(), 0755), 0);
  // Each worker marks itself running, counts the running ones, and waits for the test's go (or
  // 30 s, so that a failed test leaves nothing behind).
  const std::string command = absl::StrCat(
      "echo ran >> ", dir, "/runs-$JOB; touch ", dir, "/running/$JOB; ls ", dir,
      "/running | wc -l >> ", dir, "/concurrency; i=0; while [ ! -e ", dir,
      "/go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; rm ", dir, "/running/$JOB");
  const std::vector<std::string> args = {
      "--server=" + lockd.unix_address(), "--pool=hosts", "--profile=build", "--slots=3",
      "--jobs=6", "--state-dir=" + dir + "/state", "--command=" + command};
  const std::string first_out = dir + "/first.out";
  auto first = process::Child::Spawn(POOL_MANAGER_DEMO, args,
                                     {.stdout_file = first_out, .stderr_file = first_out});
  ASSERT_TRUE(first.ok()) << first.status();
  auto running = [&] {
    int n = 0;
    for (int job = 0; job < 6; ++job) {
      n += ::access((dir + "/running/" + std::to_string(job)).c_str(), F_OK) == 0;
    }
    return n;
  };
  ASSERT_TRUE(Eventually([&] { return running() == 2; })) << testing::ReadTextFile(first_out);
  first->Signal(SIGKILL);
  first->Wait();
  ASSERT_EQ(running(), 2);  // the workers outlive their manager

  const std::string second_out = dir + "/second.out";
  auto second = process::Child::Spawn(POOL_MANAGER_DEMO, args,
                                      {.stdout_file = second_out, .stderr_file = second_out});
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(Eventually([&] {
    return testing::ReadTextFile(second_out).find("claimed") != std::string::npos;
  })) << testing::ReadTextFile(second_out);
  EXPECT_THAT(testing::ReadTextFile(second_out), HasSubstr("2 leases kept, 0 released"));
  std::ofstream(dir + "/go") << "go\n";
  auto status = second->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << testing::ReadTextFile(second_out);
  EXPECT_EQ(*status, 0) << testing::ReadTextFile(second_out);
  const std::string out = testing::ReadTextFile(second_out);
  EXPECT_THAT(out, HasSubstr("adopted job"));
  EXPECT_THAT(out, HasSubstr("every job has run"));
  for (int job = 0; job < 6; ++job) {
    EXPECT_EQ(testing::ReadTextFile(absl::StrCat(dir, "/runs-", job)), "ran\n") << "job " << job;
    EXPECT_EQ(testing::ReadTextFile(absl::StrCat(dir, "/state/exit-", job)), "0\n")
        << "job " << job;
  }
  int most = 0;
  for (absl::string_view line : absl::StrSplit(testing::ReadTextFile(dir + "/concurrency"), '\n',
                                               absl::SkipWhitespace())) {
    int n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line, &n)) << line;
    most = std::max(most, n);
  }
  EXPECT_GE(most, 1);
  EXPECT_LE(most, 2) << "more workers ran at once than the budget admits";
  auto view = op->status("hosts");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->leases.empty());
  EXPECT_EQ(view->used_units, 0u);
}

}  // namespace
}  // namespace fencelock
