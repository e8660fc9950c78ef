// Issue 16, the etcd commit log: lockd keeps its state in a real etcd (one member, started by
// the test) instead of a state directory. The state survives a killed lockd, tokens keep
// increasing across lockds, one lockd serves a prefix at a time (a second is refused, naming the
// first; a frozen one that lost its lease answers nothing once it wakes), and snapshots keep
// the prefix small.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "clock/clock.h"
#include "etcd_process.h"
#include "lock-client/client.h"
#include "lock-client/pool_client.h"
#include "lock-server/testing/legacy_state.h"
#include "lockd_process.h"
#include "net/blocking_connection.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::EtcdProcess;
using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

class EtcdTest : public ::testing::Test {
 protected:
  LockdProcess::Options Options(const std::string& prefix, bool init = true) {
    return {.extra_args = {testing::OwnerTtlFlag()},
            .stderr_file = tmp_.path() + "/" + std::to_string(++lockds_) + ".stderr",
            .etcd = etcd_.endpoint(),
            .etcd_prefix = prefix,
            .etcd_init = init};
  }
  // A standby replica on `prefix` (owner TTL kOwnerTtlSeconds) on TCP `port`; it writes that port
  // to PortFile(name) once it serves, its output to <name>.out and <name>.err in the test's
  // directory.
  absl::StatusOr<process::Child> Standby(const std::string& prefix, int port,
                                         const std::string& name) {
    return process::Child::Spawn(
        LOCKD_BINARY,
        {"serve", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=" + prefix, "--etcd-standby",
         testing::OwnerTtlFlag(), absl::StrCat("--port=", port), "--port-file=" + PortFile(name),
         "--metrics-port=-1"},
        {.stdout_file = tmp_.path() + "/" + name + ".out",
         .stderr_file = tmp_.path() + "/" + name + ".err"});
  }
  std::string PortFile(const std::string& name) const { return tmp_.path() + "/" + name + ".port"; }
  // Waits (up to 5 s) until standby `name` says it stands by; false if it never did.
  bool AwaitStandingBy(const std::string& name) const {
    const std::string err = tmp_.path() + "/" + name + ".err";
    for (int i = 0; i < 100; ++i) {
      if (testing::ReadTextFile(err).find("standing by") != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }
  static wire::OpenSessionReply Open(RawConnection& c) {
    c.Hello();
    const wire::Response r = c.Call(request::OpenSession(absl::Minutes(5)));
    EXPECT_EQ(r.code(), wire::OK) << r.message();
    return r.open_session();
  }

  EtcdProcess etcd_;
  testing::TempDir tmp_;
  int lockds_ = 0;
};

TEST_F(EtcdTest, StateSurvivesAKilledLockdAndTokensKeepIncreasing) {
  LockdProcess lockd(Options("/fencelock/a"));
  RawConnection c = RawConnection::Tcp(lockd.port());
  const wire::OpenSessionReply session = Open(c);
  const uint64_t held = c.Call(request::Acquire(session.session_id(), "payout/1")).acquire().token();
  ASSERT_GT(held, 0u);
  uint64_t last = held;
  for (int i = 0; i < 50; ++i) {
    last = c.Call(request::Acquire(session.session_id(), "payout/2")).acquire().token();
    ASSERT_EQ(c.Call(request::Release(session.session_id(), "payout/2", last)).code(), wire::OK);
  }
  // lockctl status shows where the state is and how long this lockd still owns it.
  const wire::StatsReply stats = c.Call(request::GetStats()).stats();
  EXPECT_EQ(stats.storage(), "etcd prefix /fencelock/a on " + etcd_.endpoint());
  EXPECT_GT(stats.ownership_left_ms(), 0u);
  EXPECT_LE(stats.ownership_left_ms(), testing::kOwnerTtlSeconds * 700u);  // TTL x (1 - 0.30)
  EXPECT_EQ(stats.term(), 1u);  // the first lockd to serve the prefix
  // The member's health, polled once a second: reachable, and the leader of its cluster of one.
  wire::StatsReply health = stats;
  for (int i = 0; i < 50 && health.store_members_size() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    health = c.Call(request::GetStats()).stats();
  }
  ASSERT_EQ(health.store_members_size(), 1);
  EXPECT_EQ(health.store_members(0).endpoint(), etcd_.endpoint());
  EXPECT_TRUE(health.store_members(0).reachable()) << health.store_members(0).error();
  EXPECT_TRUE(health.store_members(0).leader());
  EXPECT_GT(health.store_members(0).raft_index(), 0u);
  lockd.Kill();
  lockd.Restart();  // waits for the dead lockd's lease on the prefix to run out
  RawConnection again = RawConnection::Tcp(lockd.port());
  again.Hello();
  EXPECT_EQ(again.Call(request::GetStats()).stats().term(), 2u);  // one leadership change
  ASSERT_EQ(again.Call(request::Resume(session.session_id(), session.secret())).code(), wire::OK);
  EXPECT_EQ(again.Call(request::Validate("payout/1", held, session.session_id())).code(),
            wire::OK);
  const uint64_t next =
      again.Call(request::Acquire(session.session_id(), "payout/3")).acquire().token();
  EXPECT_GT(next, last);
}

// Admission pools keep their state in etcd like locks: a killed lockd's successor restores the
// policy, the active lease, the owner epoch and the decision sequence, and never reissues a
// token.
TEST_F(EtcdTest, PoolLeasesSurviveAKilledLockdOnEtcd) {
  LockdProcess::Options options = Options("/fencelock/pools");
  options.unix_socket = true;  // managers reach pools there (ADR 0004)
  LockdProcess lockd(options);
  auto c = PoolClient::Create({.server = "unix:" + lockd.unix_path()});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->publish("p", 1, 4, {{.id = "a"}}).ok());
  auto owner = (*c)->claim("p", "a", 1);
  ASSERT_TRUE(owner.ok()) << owner.status();
  auto g = (*c)->acquire("p", "a", "s1", *owner, absl::ZeroDuration());
  ASSERT_TRUE(g.ok() && g->granted) << g.status();
  auto decision = (*c)->activate("p", "a", "s1", g->token, *owner);
  ASSERT_TRUE(decision.ok()) << decision.status();
  lockd.Kill();
  lockd.Restart();
  auto again = PoolClient::Create({.server = "unix:" + lockd.unix_path()});
  ASSERT_TRUE(again.ok());
  auto view = (*again)->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->leases.size(), 1u);
  EXPECT_TRUE(view->leases[0].active);
  EXPECT_EQ(view->leases[0].token, g->token);
  EXPECT_EQ(view->decision, *decision);
  auto next = (*again)->acquire("p", "a", "s2", *owner, absl::ZeroDuration());
  ASSERT_TRUE(next.ok() && next->granted) << next.status();
  EXPECT_GT(next->token, g->token);
}

// ADR-0003's exact cleanup on etcd: `lockd destroy --etcd` is refused while a lockd serves the
// prefix (naming it) and while a pool lease remains (exit 4, listing it); once the lease is
// released it deletes every key under the prefix, and nothing beside it.
TEST_F(EtcdTest, DestroyDeletesExactlyThePrefixOnceNoLeaseRemains) {
  auto [init, init_err] = testing::RunLockdToExit(
      {"init", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=/fencelock/dx"});
  ASSERT_EQ(init, 0) << init_err;
  ASSERT_TRUE(etcd_.Put("/fencelock/d", "a key beside the prefix"));
  const std::vector<std::string> neighbours = etcd_.Keys("/fencelock/dx/");
  ASSERT_FALSE(neighbours.empty());

  LockdProcess::Options options = Options("/fencelock/d");
  options.unix_socket = true;
  auto lockd = std::make_unique<LockdProcess>(options);
  auto c = PoolClient::Create({.server = lockd->unix_address()});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->publish("p", 1, 4, {{.id = "a"}}).ok());
  auto owner = (*c)->claim("p", "a", 1);
  ASSERT_TRUE(owner.ok()) << owner.status();
  auto g = (*c)->acquire("p", "a", "s1", *owner, absl::ZeroDuration());
  ASSERT_TRUE(g.ok() && g->granted) << g.status();
  ASSERT_TRUE((*c)->activate("p", "a", "s1", g->token, *owner).ok());

  const std::vector<std::string> destroy = {"destroy", "--etcd=" + etcd_.endpoint(),
                                            "--etcd-prefix=/fencelock/d", testing::OwnerTtlFlag()};
  auto [served, served_err] = testing::RunLockdToExit(destroy);
  EXPECT_EQ(WEXITSTATUS(served), 1) << served_err;
  EXPECT_THAT(served_err, HasSubstr("is served by lockd pid"));
  EXPECT_THAT(served_err, HasSubstr("nothing removed"));
  lockd.reset();  // a clean stop: the prefix is free at once

  auto [held, held_err] = testing::RunLockdToExit(destroy);
  EXPECT_EQ(WEXITSTATUS(held), 4) << held_err;
  EXPECT_THAT(held_err, HasSubstr(absl::StrCat("pool p: a/s1 token ", g->token, " active")));
  EXPECT_FALSE(etcd_.Keys("/fencelock/d/").empty());

  lockd = std::make_unique<LockdProcess>([&] {
    LockdProcess::Options again = Options("/fencelock/d", /*init=*/false);
    again.unix_socket = true;
    return again;
  }());
  auto c2 = PoolClient::Create({.server = lockd->unix_address()});
  ASSERT_TRUE(c2.ok());
  ASSERT_TRUE((*c2)->release("p", "a", "s1", g->token, *owner).ok());
  lockd.reset();

  auto [done, done_err] = testing::RunLockdToExit(destroy);
  EXPECT_EQ(done, 0) << done_err;
  EXPECT_TRUE(etcd_.Keys("/fencelock/d/").empty());
  EXPECT_EQ(etcd_.Keys("/fencelock/dx/"), neighbours);
  EXPECT_EQ(etcd_.Get("/fencelock/d"), "a key beside the prefix");
  // Nothing is left to destroy, or to serve.
  auto [again, again_err] = testing::RunLockdToExit(destroy);
  EXPECT_EQ(WEXITSTATUS(again), 1);
  EXPECT_THAT(again_err, HasSubstr("holds no lockd state"));
}

// Issue 59: `lockd init` refuses a prefix inside or around an initialized one, in either
// order, on a real etcd: destroying the outer one would have deleted the inner one's state, and
// its tokens would have started again at 1.
TEST_F(EtcdTest, InitRefusesNestedPrefixesInEitherOrder) {
  auto init = [&](const std::string& prefix) {
    return testing::RunLockdToExit({"init", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=" + prefix});
  };
  ASSERT_EQ(init("/fencelock/nx").first, 0);
  auto [inside, inside_err] = init("/fencelock/nx/y");
  EXPECT_EQ(WEXITSTATUS(inside), 1);
  EXPECT_THAT(inside_err,
              HasSubstr("etcd prefix /fencelock/nx/y lies inside etcd prefix /fencelock/nx"));
  EXPECT_TRUE(etcd_.Keys("/fencelock/nx/y/").empty());
  ASSERT_EQ(init("/fencelock/ny/a/b").first, 0);
  auto [around, around_err] = init("/fencelock/ny");
  EXPECT_EQ(WEXITSTATUS(around), 1);
  EXPECT_THAT(around_err,
              HasSubstr("etcd prefix /fencelock/ny/a/b lies inside etcd prefix /fencelock/ny"));
}

TEST_F(EtcdTest, ASecondLockdOnThePrefixIsRefusedNamingTheFirst) {
  LockdProcess first(Options("/fencelock/b"));
  auto [status, err] =
      testing::RunLockdToExit({"serve", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=/fencelock/b",
                               "--port=0", "--metrics-port=-1", testing::OwnerTtlFlag()});
  EXPECT_NE(status, 0);
  EXPECT_THAT(err, HasSubstr("is served by lockd pid"));
  // A prefix that was never initialized, and one initialized twice.
  auto [fresh, why] = testing::RunLockdToExit(
      {"serve", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=/fencelock/none", "--port=0",
       "--metrics-port=-1"});
  EXPECT_NE(fresh, 0);
  EXPECT_THAT(why, HasSubstr("holds no lockd state; run lockd init"));
  auto [twice, again] = testing::RunLockdToExit(
      {"init", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=/fencelock/b"});
  EXPECT_NE(twice, 0);
  EXPECT_THAT(again, HasSubstr("lockd init needs an empty prefix"));
}

TEST_F(EtcdTest, AFrozenLockdThatLostThePrefixAnswersNothingWhenItWakes) {
  LockdProcess::Options options = Options("/fencelock/c");
  options.extra_args.push_back("--exit-on-depose");  // for a supervisor: it exits 3
  LockdProcess a(options);
  RawConnection to_a = RawConnection::Tcp(a.port());
  const wire::OpenSessionReply session = Open(to_a);
  const uint64_t token =
      to_a.Call(request::Acquire(session.session_id(), "payout/1")).acquire().token();
  ASSERT_GT(token, 0u);
  ASSERT_EQ(kill(a.pid(), SIGSTOP), 0);
  // b takes the prefix once a's lease (kOwnerTtlSeconds) has run out, and restores a's lock.
  LockdProcess b(Options("/fencelock/c", /*init=*/false));
  ASSERT_EQ(kill(a.pid(), SIGCONT), 0);
  // a woke past its ownership deadline: nothing it would answer from its state is answered
  // (UNAVAILABLE, or the connection closed if a noticed it first), and it ends its service so
  // that clients move on: it gives up its lease, closes its connections and exits with 3.
  ASSERT_TRUE(to_a.SendRequest(request::Validate("payout/1", token)));
  if (std::optional<wire::Response> stale = to_a.ReadResponse()) {
    EXPECT_EQ(stale->code(), wire::UNAVAILABLE) << stale->ShortDebugString();
  }
  EXPECT_TRUE(to_a.ClosedByPeer());
  const std::optional<int> ended = a.WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(ended.has_value());
  EXPECT_TRUE(WIFEXITED(*ended) && WEXITSTATUS(*ended) == 3) << *ended;
  EXPECT_THAT(testing::ReadTextFile(tmp_.path() + "/1.stderr"),
              HasSubstr("exiting so that another replica takes over"));
  RawConnection to_b = RawConnection::Tcp(b.port());
  to_b.Hello();
  EXPECT_EQ(to_b.Call(request::Validate("payout/1", token)).code(), wire::OK);
  ASSERT_EQ(to_b.Call(request::Resume(session.session_id(), session.secret())).code(), wire::OK);
  EXPECT_GT(to_b.Call(request::Acquire(session.session_id(), "payout/2")).acquire().token(),
            token);
}

TEST_F(EtcdTest, AStandbyTakesOverAndTheClientKeepsItsLockAcrossTheFailover) {
  const int first_port = testing::FreeLoopbackPort();
  const int standby_port = testing::FreeLoopbackPort();
  LockdProcess::Options options = Options("/fencelock/f");
  options.port = first_port;
  LockdProcess first(options);
  // The standby waits, not listening, until the prefix is free.
  const std::string port_file = PortFile("standby");
  auto standby = Standby("/fencelock/f", standby_port, "standby");
  ASSERT_TRUE(standby.ok()) << standby.status();
  auto client = Client::Create({.server = absl::StrCat("127.0.0.1:", first_port, ",127.0.0.1:",
                                                       standby_port),
                                .session_ttl = absl::Seconds(10),
                                .default_lock_ttl = absl::Seconds(10)});
  ASSERT_TRUE(client.ok()) << client.status();
  auto held = (*client)->acquire("payout/1", absl::Seconds(1), absl::ZeroDuration());
  ASSERT_TRUE(held.ok()) << held.status();
  const uint64_t token = held->token();

  first.Kill();
  const MonoTime killed = Clock::Real()->Now();
  auto bound = process::AwaitPortFile(port_file, *standby, absl::Seconds(20));
  ASSERT_TRUE(bound.ok()) << bound.status();
  const absl::Duration failover = Clock::Real()->Now() - killed;
  EXPECT_THAT(testing::ReadTextFile(tmp_.path() + "/standby.err"), HasSubstr("standing by"));
  // The client reconnects to the new lockd and resumes its session there; the lock it held is
  // still its own, confirmed by the new lockd (until it has reconnected, a confirmation cannot
  // be made: unconfirmed, which is not a loss), and its lease was never extended by the
  // failover.
  bool confirmed = false;
  for (int i = 0; i < 100 && !confirmed; ++i) {
    try {
      (*client)->checkStillHeld(*held, Confirm::kWithServer);
      confirmed = true;
    } catch (const LockLostException& e) {
      if (e.reason() != LossReason::kUnconfirmed) {
        ADD_FAILURE() << "lost the lock across the failover: " << e.what();
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  std::printf("failover: the standby served %s after the first lockd was killed (owner TTL %ds)\n",
              absl::FormatDuration(failover).c_str(), testing::kOwnerTtlSeconds);
  EXPECT_TRUE(confirmed);
  RawConnection to_standby = RawConnection::Tcp(standby_port);
  to_standby.Hello();
  EXPECT_EQ(to_standby.Call(request::Validate("payout/1", token)).code(), wire::OK);
  auto next = (*client)->acquire("payout/2", absl::Seconds(1), absl::ZeroDuration());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_GT(next->token(), token);
  standby->Stop();
}

// ADR 0006: a lock delay pending when the serving lockd dies is given in full again by the
// standby that takes over, from when it begins to serve: never shorter.
TEST_F(EtcdTest, ALockDelaySurvivesAFailoverInFull) {
  constexpr absl::Duration kDelay = absl::Seconds(3);
  const int first_port = testing::FreeLoopbackPort();
  const int standby_port = testing::FreeLoopbackPort();
  LockdProcess::Options options = Options("/fencelock/d");
  options.port = first_port;
  LockdProcess first(options);
  const std::string port_file = PortFile("delayed");
  auto standby = Standby("/fencelock/d", standby_port, "delayed");
  ASSERT_TRUE(standby.ok()) << standby.status();
  // A holder that never renews its 200 ms lease: lost, it starts a 3 s delay.
  RawConnection holder = RawConnection::Tcp(first_port);
  const wire::OpenSessionReply session = Open(holder);
  ASSERT_EQ(holder.Call(request::Acquire(session.session_id(), "ledger", absl::ZeroDuration(),
                                         absl::Milliseconds(200), wire::EXCLUSIVE, kDelay))
                .code(),
            wire::OK);
  absl::SleepFor(absl::Milliseconds(500));
  const MonoTime killed = Clock::Real()->Now();
  first.Kill();
  auto bound = process::AwaitPortFile(port_file, *standby, absl::Seconds(20));
  ASSERT_TRUE(bound.ok()) << bound.status();
  RawConnection other = RawConnection::Tcp(standby_port);
  const wire::OpenSessionReply next = Open(other);
  // The first lockd's delay would have ended 2.7 s after the kill. The standby cannot serve
  // before the first one's lease on the prefix (2 s, or 4 s under a sanitizer, renewed every
  // third of it) has run out, at least 1.3 s after the kill, and gives the delay its 3 s from
  // there.
  const wire::Response granted = other.Call(request::Acquire(
      next.session_id(), "ledger", absl::Seconds(10), absl::ZeroDuration()));
  const absl::Duration after_kill = Clock::Real()->Now() - killed;
  ASSERT_EQ(granted.code(), wire::OK) << granted.message();
  std::printf(
      "lock delay across a failover: granted %s after the kill (3 s delay, %d s owner TTL)\n",
      absl::FormatDuration(after_kill).c_str(), testing::kOwnerTtlSeconds);
  EXPECT_GE(after_kill, kDelay + absl::Seconds(1));
  EXPECT_EQ(other.Call(request::GetStats()).stats().lock_delay_blocked_acquires_total(), 1u);
  standby->Stop();
}

// Issue 33: a standby that had stood by for longer than a holder's TTL took over, counted
// every restored lease from the start of its wait, expired the holder's session at once and
// granted its lock to another, 2 s before the holder's own deadline. Every restored lease now
// runs its full TTL from the moment the standby serves.
TEST_F(EtcdTest, AStandbyThatWaitedLongKeepsEveryRestoredLeaseItsFullTtl) {
  LockdProcess::Options options = Options("/fencelock/w");
  options.port = testing::FreeLoopbackPort();
  LockdProcess first(options);
  const int standby_port = testing::FreeLoopbackPort();
  const std::string port_file = PortFile("w");
  auto standby = Standby("/fencelock/w", standby_port, "w");
  ASSERT_TRUE(standby.ok()) << standby.status();
  const MonoTime standing_by = Clock::Real()->Now();
  RawConnection v = RawConnection::Tcp(first.port());
  v.Hello();
  const wire::Response opened = v.Call(request::OpenSession(absl::Seconds(5)));
  ASSERT_EQ(opened.code(), wire::OK) << opened.message();
  const uint64_t session = opened.open_session().session_id();
  const wire::Response granted =
      v.Call(request::Acquire(session, "payout/1", absl::ZeroDuration(), absl::Seconds(5)));
  ASSERT_TRUE(granted.acquire().granted()) << granted.ShortDebugString();
  const uint64_t token = granted.acquire().token();
  // V renews every second; the standby has waited 7 s, longer than V's TTL, when V renews for
  // the last time and the serving lockd dies.
  MonoTime renewed;
  do {
    absl::SleepFor(absl::Seconds(1));
    renewed = Clock::Real()->Now();
    ASSERT_EQ(v.Call(request::KeepAlive(session, "payout/1", token)).code(), wire::OK);
  } while (renewed - standing_by < absl::Seconds(7));
  first.Kill();
  auto bound = process::AwaitPortFile(port_file, *standby, absl::Seconds(20));
  ASSERT_TRUE(bound.ok()) << bound.status();
  // V's own deadline runs to its renewal + 5 s x 0.7; the standby must not grant before it.
  RawConnection w = RawConnection::Tcp(standby_port);
  w.Hello();
  const wire::Response w_opened = w.Call(request::OpenSession(absl::Seconds(30)));
  ASSERT_EQ(w_opened.code(), wire::OK) << w_opened.message();
  const uint64_t w_session = w_opened.open_session().session_id();
  while (Clock::Real()->Now() - renewed < absl::Seconds(5) * 0.7) {
    const wire::Response tried = w.Call(request::Acquire(w_session, "payout/1"));
    ASSERT_FALSE(tried.acquire().granted())
        << "the standby granted V's lock to W "
        << absl::FormatDuration(Clock::Real()->Now() - renewed)
        << " after V's renewal, before V's own deadline";
    absl::SleepFor(absl::Milliseconds(100));
  }
  // And V, resuming on the standby, still holds it.
  RawConnection v2 = RawConnection::Tcp(standby_port);
  v2.Hello();
  ASSERT_EQ(v2.Call(request::Resume(session, opened.open_session().secret())).code(), wire::OK);
  EXPECT_EQ(v2.Call(request::Validate("payout/1", token, session)).code(), wire::OK);
  standby->Stop();
}

// Issue 33: the serving replica kept answering from its state for 7 s after someone deleted
// P/owner, while the standby, which took over 0.2 s later, confirmed another holder. Now the
// serving replica stops at the first sign (its watch on P/owner): its last answer from its
// state comes before the standby's first. (It then exits and gives its lease back, so the
// standby may find the lease gone and serve at once; the next test holds the other case.)
// Issue 37: with no supervisor, the deposed replica stands by again in the same process (a
// fresh lease; its port file gone until it serves) and serves again once the other replica
// goes, with the deposition in its status. Since stop 54 it campaigns only after its owner TTL
// (its key was taken away): campaigning at once, it now and then re-took the prefix itself
// before the waiting standby looked again, and the standby never served.
TEST_F(EtcdTest, DeletingTheOwnerKeyEndsTheServingReplicaBeforeAnotherServes) {
  LockdProcess::Options options = Options("/fencelock/o");
  options.port = testing::FreeLoopbackPort();
  options.stderr_file = tmp_.path() + "/o-first.err";
  LockdProcess first(options);
  const int standby_port = testing::FreeLoopbackPort();
  const std::string port_file = PortFile("o");
  auto standby = Standby("/fencelock/o", standby_port, "o");
  ASSERT_TRUE(standby.ok()) << standby.status();
  RawConnection v = RawConnection::Tcp(first.port());
  const wire::OpenSessionReply session = Open(v);
  const wire::Response granted = v.Call(request::Acquire(session.session_id(), "payout/1"));
  ASSERT_TRUE(granted.acquire().granted()) << granted.ShortDebugString();
  const uint64_t token = granted.acquire().token();
  ASSERT_TRUE(AwaitStandingBy("o"));

  ASSERT_TRUE(etcd_.Delete("/fencelock/o/owner"));
  // The first replica's answers from its state: OK until it notices, then never again.
  MonoTime last_ok = Clock::Real()->Now();
  for (int i = 0; i < 200; ++i) {
    if (!v.SendRequest(request::Validate("payout/1", token))) break;
    std::optional<wire::Response> r = v.ReadResponse();
    if (!r.has_value() || r->code() != wire::OK) break;
    last_ok = Clock::Real()->Now();
    absl::SleepFor(absl::Milliseconds(10));
  }
  auto bound = process::AwaitPortFile(port_file, *standby, absl::Seconds(20));
  ASSERT_TRUE(bound.ok()) << bound.status();
  const MonoTime standby_served = Clock::Real()->Now();
  EXPECT_LT(last_ok, standby_served) << "both replicas answered from their state";
  std::printf("the first replica answered last %s before the standby served\n",
              absl::FormatDuration(standby_served - last_ok).c_str());
  // The standby restored V's lock.
  RawConnection w = RawConnection::Tcp(standby_port);
  w.Hello();
  EXPECT_EQ(w.Call(request::Validate("payout/1", token)).code(), wire::OK);

  // The first one did not exit: it stands by again on its port, saying why.
  const std::string first_err = tmp_.path() + "/o-first.err";
  for (int i = 0; i < 100 && testing::ReadTextFile(first_err).find("standing by: etcd prefix") ==
                                 std::string::npos;
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(first.WaitForExit(absl::ZeroDuration()).has_value());
  const std::string said = testing::ReadTextFile(first_err);
  EXPECT_THAT(said, HasSubstr("/fencelock/o/owner was deleted"));
  EXPECT_THAT(said, HasSubstr("deposed (1 time in this process)"));
  // Its key was taken away: it campaigns only after its owner TTL, so that the standby that
  // was waiting takes over (campaigning at once, it re-took the prefix first now and then).
  EXPECT_THAT(said, HasSubstr(absl::StrCat("standing by: not taking etcd prefix /fencelock/o for ",
                                           testing::kOwnerTtlSeconds, "s")));
  EXPECT_THAT(said, HasSubstr("standing by: etcd prefix /fencelock/o is served by"));
  EXPECT_FALSE(std::filesystem::exists(first.port_file())) << "a standby's port file says it serves";
  auto refused = net::BlockingConnection::Connect(
      {.server = absl::StrCat("127.0.0.1:", first.port()), .timeout = absl::Seconds(5)});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("this replica served and was deposed 1 time in this process, last: "));
  EXPECT_TRUE(refused.status().GetPayload(net::kStandbyLeaderPayload).has_value());

  // The other replica goes: the first serves again, its deposition in its figures.
  standby->Stop();
  auto again = process::AwaitPortFile(first.port_file(), first.child(), absl::Seconds(20));
  ASSERT_TRUE(again.ok()) << again.status();
  RawConnection x = RawConnection::Tcp(first.port());
  x.Hello();
  EXPECT_EQ(x.Call(request::Validate("payout/1", token)).code(), wire::OK);
  const wire::Response stats = x.Call(request::GetStats());
  EXPECT_EQ(stats.stats().depositions_total(), 1u);
  EXPECT_THAT(stats.stats().last_deposition(), HasSubstr("/fencelock/o/owner was deleted"));
}

// Listens on loopback `port` (as another program that took it would); -1 if it cannot.
int TakePort(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 4) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Issue 37: a standby whose port another process holds does not start (exit 1, naming the
// port), and neither does a deposed replica that finds its port taken when it stands by again:
// a supervisor sees it, instead of a replica that stands by where no client can reach it.
TEST_F(EtcdTest, AStandbyWhosePortIsTakenExitsNamingIt) {
  LockdProcess::Options options = Options("/fencelock/t");
  options.port = testing::FreeLoopbackPort();
  options.stderr_file = tmp_.path() + "/t-first.err";
  LockdProcess first(options);
  const int taken = testing::FreeLoopbackPort();
  const int holder = TakePort(taken);
  ASSERT_GE(holder, 0);
  auto standby = Standby("/fencelock/t", taken, "t");
  ASSERT_TRUE(standby.ok()) << standby.status();
  const std::optional<int> refused = standby->Wait(absl::Seconds(20));
  ASSERT_TRUE(refused.has_value());
  EXPECT_TRUE(WIFEXITED(*refused) && WEXITSTATUS(*refused) == 1) << *refused;
  EXPECT_THAT(testing::ReadTextFile(tmp_.path() + "/t.err"),
              HasSubstr(absl::StrCat("cannot listen on tcp 127.0.0.1:", taken)));
  ::close(holder);
  // A deposed replica that finds its port taken when it stands by again: the harness's
  // ha-port-taken, which cuts the replica off from etcd so that the port is free for as long
  // as giving its lease back takes.
}

// The other half of the rule: when P/owner goes while the lease it was on still lives (here
// its replica is frozen, so it can neither notice nor give its lease back), the standby
// revokes that lease and waits its TTL before it serves; the frozen replica, woken, answers
// nothing from its state and exits 3.
TEST_F(EtcdTest, AStandbyWaitsOutTheLeaseOfADeletedOwnerKey) {
  LockdProcess::Options options = Options("/fencelock/p");
  options.port = testing::FreeLoopbackPort();
  options.stderr_file = tmp_.path() + "/p-first.err";
  options.extra_args.push_back("--exit-on-depose");
  LockdProcess first(options);
  const int standby_port = testing::FreeLoopbackPort();
  auto standby = Standby("/fencelock/p", standby_port, "p");
  ASSERT_TRUE(standby.ok()) << standby.status();
  RawConnection v = RawConnection::Tcp(first.port());
  const wire::OpenSessionReply session = Open(v);
  const wire::Response granted = v.Call(request::Acquire(session.session_id(), "payout/1"));
  ASSERT_TRUE(granted.acquire().granted()) << granted.ShortDebugString();
  ASSERT_TRUE(AwaitStandingBy("p"));
  ASSERT_EQ(kill(first.pid(), SIGSTOP), 0);
  ASSERT_TRUE(etcd_.Delete("/fencelock/p/owner"));
  auto bound = process::AwaitPortFile(PortFile("p"), *standby, absl::Seconds(20));
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_THAT(testing::ReadTextFile(tmp_.path() + "/p.err"),
              HasSubstr(absl::StrCat("was deleted by hand and the lockd that held it may still "
                                     "think it serves; revoking that lease and waiting ",
                                     testing::kOwnerTtlSeconds, "s before taking over")));
  ASSERT_EQ(kill(first.pid(), SIGCONT), 0);
  if (v.SendRequest(request::Validate("payout/1", granted.acquire().token()))) {
    std::optional<wire::Response> r = v.ReadResponse();
    EXPECT_TRUE(!r.has_value() || r->code() == wire::UNAVAILABLE) << r->ShortDebugString();
  }
  const std::optional<int> ended = first.WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(ended.has_value());
  EXPECT_TRUE(WIFEXITED(*ended) && WEXITSTATUS(*ended) == 3) << *ended;
  standby->Stop();
}

// Issue 33: a local user read a session's secret from etcd (`etcdctl get --prefix`), resumed
// the session on the serving lockd and released its lock. etcd holds only digests.
TEST_F(EtcdTest, EtcdHoldsNoSessionSecret) {
  LockdProcess::Options options = Options("/fencelock/s");
  options.unix_socket = true;
  LockdProcess lockd(options);
  RawConnection c = RawConnection::Tcp(lockd.port());
  const wire::OpenSessionReply session = Open(c);
  ASSERT_EQ(session.secret().size(), 16u);
  ASSERT_TRUE(c.Call(request::Acquire(session.session_id(), "payout/1")).acquire().granted());
  // A pool manager's owner key is a secret too: whoever has it acts for the manager.
  wire::PoolProfile build;
  build.set_id("build");
  build.set_cost(1);
  RawConnection manager = RawConnection::Unix(lockd.unix_path());  // pools: ADR 0004
  manager.Hello();
  ASSERT_EQ(manager.Call(request::PoolPublish("hosts", 1, 4, {build})).code(), wire::OK);
  const wire::Response claimed = manager.Call(request::PoolClaim("hosts", "build", 1));
  ASSERT_EQ(claimed.code(), wire::OK) << claimed.message();
  const std::string owner_key = claimed.pool_claim().owner().key();
  ASSERT_FALSE(owner_key.empty());
  const std::string dump = etcd_.Dump("/fencelock/s");
  ASSERT_THAT(dump, HasSubstr("/fencelock/s/log/"));
  EXPECT_EQ(dump.find(session.secret()), std::string::npos)
      << "a session's secret is readable in etcd";
  EXPECT_EQ(dump.find(owner_key), std::string::npos)
      << "a pool manager's owner key is readable in etcd";
  // The session still resumes with its secret on a lockd that restored it from etcd.
  lockd.Kill();
  LockdProcess::Options again_options = Options("/fencelock/s", /*init=*/false);
  LockdProcess again(again_options);
  RawConnection d = RawConnection::Tcp(again.port());
  d.Hello();
  EXPECT_EQ(d.Call(request::Resume(session.session_id(), std::string(16, 'x'))).code(),
            wire::PERMISSION_DENIED);
  EXPECT_EQ(d.Call(request::Resume(session.session_id(), session.secret())).code(), wire::OK);
}

// The upgrade on etcd: a prefix whose snapshot an older lockd wrote with a session's secret in
// clear is read (the session resumes with its secret) and rewritten at once, at the same lsn,
// its chunks after the old ones: afterwards nothing under the prefix holds the secret.
TEST_F(EtcdTest, APrefixWithASecretInClearIsRewrittenWithItsDigest) {
  auto [init_status, init_out] = testing::RunLockdToExit(
      {"init", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=/fencelock/u"});
  ASSERT_EQ(WEXITSTATUS(init_status), 0) << init_out;
  const std::string secret = "an-old-secret-16";
  ASSERT_TRUE(
      etcd_.Put("/fencelock/u/snapshot/00000000000000000000/000000",
                server::SnapshotWithASecretInClear(SessionId(1), absl::Minutes(5), secret)));
  ASSERT_NE(etcd_.Dump("/fencelock/u").find(secret), std::string::npos);
  LockdProcess lockd(Options("/fencelock/u", /*init=*/false));
  std::string dump = etcd_.Dump("/fencelock/u");
  for (int i = 0; i < 100 && dump.find(secret) != std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    dump = etcd_.Dump("/fencelock/u");
  }
  EXPECT_EQ(dump.find(secret), std::string::npos) << "the secret is still in etcd";
  EXPECT_EQ(etcd_.Get("/fencelock/u/snapshot-head"), "0 1 1");
  RawConnection c = RawConnection::Tcp(lockd.port());
  c.Hello();
  EXPECT_EQ(c.Call(request::Resume(1, std::string(16, 'x'))).code(), wire::PERMISSION_DENIED);
  EXPECT_EQ(c.Call(request::Resume(1, secret)).code(), wire::OK);
  // A restart reads the rewritten snapshot: the session is still there, nothing to upgrade.
  lockd.Stop();
  LockdProcess again(Options("/fencelock/u", /*init=*/false));
  RawConnection d = RawConnection::Tcp(again.port());
  d.Hello();
  EXPECT_EQ(d.Call(request::Resume(1, secret)).code(), wire::OK);
}

// lockctl with `args`; its exit status and everything it printed.
std::pair<int, std::string> Lockctl(const std::string& args) {
  FILE* pipe = popen((std::string(LOCKCTL_BINARY) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// A standby listens and answers everything NOT_LEADER, naming the serving replica; lockctl
// shows its role, and a client that reaches it first follows it to the serving replica. Once
// the serving lockd is gone the standby serves on the same port.
TEST_F(EtcdTest, AStandbyRedirectsToTheServingReplicaAndLaterServesOnItsPort) {
  LockdProcess::Options options = Options("/fencelock/g");
  options.port = testing::FreeLoopbackPort();
  LockdProcess first(options);
  const int standby_port = testing::FreeLoopbackPort();
  const std::string port_file = PortFile("standby");
  auto standby = Standby("/fencelock/g", standby_port, "standby");
  ASSERT_TRUE(standby.ok()) << standby.status();
  const std::string leader = absl::StrCat("127.0.0.1:", first.port());
  // Until it has read the owner from etcd, a standby names nobody: wait for the name.
  wire::Response hello;
  for (int i = 0; i < 100 && hello.hello().leader().empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    const int fd = testing::ConnectLoopback(standby_port);
    if (fd < 0) continue;
    close(fd);
    auto conn = net::BlockingConnection::Connect(
        {.server = absl::StrCat("127.0.0.1:", standby_port), .timeout = absl::Seconds(2),
         .hello = false});
    if (!conn.ok()) continue;
    auto reply = (*conn)->Call(request::Hello());
    if (reply.ok()) hello = *reply;
  }
  EXPECT_EQ(hello.code(), wire::NOT_LEADER) << hello.ShortDebugString();
  EXPECT_EQ(hello.hello().leader(), leader);
  EXPECT_THAT(hello.message(), HasSubstr("stands by; the serving replica is lockd pid"));
  // Any other request gets the same answer, and the connection is closed.
  RawConnection raw = RawConnection::Tcp(standby_port);  // no Hello: RawConnection sends none
  ASSERT_TRUE(raw.SendRequest(request::OpenSession(absl::Seconds(10))));
  std::optional<wire::Response> refused = raw.ReadResponse();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), wire::NOT_LEADER);
  EXPECT_TRUE(raw.ClosedByPeer());
  auto [status, out] = Lockctl(absl::StrCat("--server=127.0.0.1:", standby_port, " status"));
  EXPECT_EQ(status, 0) << out;
  EXPECT_THAT(out, HasSubstr("role              standby"));
  EXPECT_THAT(out, HasSubstr("leader            " + leader));

  // A client whose list has the standby first, then a replica that would swallow its connect
  // (it listens but never answers), then the serving one: the standby's answer sends it
  // straight to the serving replica, past the silent one.
  const int silent = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(silent, 8), 0);
  ASSERT_EQ(getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  auto client = Client::Create({.server = absl::StrCat("127.0.0.1:", standby_port, ",127.0.0.1:",
                                                       ntohs(addr.sin_port), ",", leader),
                                .session_ttl = absl::Seconds(10),
                                .default_lock_ttl = absl::Seconds(10)});
  ASSERT_TRUE(client.ok()) << client.status();
  auto held = (*client)->acquire("payout/1", absl::Seconds(1), absl::ZeroDuration());
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_LT(accept(silent, nullptr, nullptr), 0) << "the client tried the silent replica";
  close(silent);

  // The serving lockd goes away: the standby serves on the port it stood by on.
  first.Kill();
  auto bound = process::AwaitPortFile(port_file, *standby, absl::Seconds(20));
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_EQ(*bound, standby_port);
  RawConnection serving = RawConnection::Tcp(standby_port);
  EXPECT_EQ(serving.Hello().code(), wire::OK);
  auto [now_status, now_out] = Lockctl(absl::StrCat("--server=127.0.0.1:", standby_port, " status"));
  EXPECT_EQ(now_status, 0) << now_out;
  EXPECT_THAT(now_out, HasSubstr("role              serving the prefix (leader), term 2"));
  standby->Stop();
}

// The serving lockd freezes (SIGSTOP) with a client connected to it. The client leaves the
// silent replica after half a heartbeat period, not after its 30 s request timeout, and
// resumes on the standby that took over, keeping its lock (usable for 10.5 s), all while the
// first is still frozen.
TEST_F(EtcdTest, AClientLeavesAFrozenReplicaForTheOneThatTookOver) {
  LockdProcess::Options options = Options("/fencelock/h");
  options.port = testing::FreeLoopbackPort();
  LockdProcess first(options);
  const int standby_port = testing::FreeLoopbackPort();
  auto standby = Standby("/fencelock/h", standby_port, "h");
  ASSERT_TRUE(standby.ok()) << standby.status();
  auto client = Client::Create({.server = absl::StrCat("127.0.0.1:", first.port(), ",127.0.0.1:",
                                                       standby_port),
                                .session_ttl = absl::Seconds(15),
                                .default_lock_ttl = absl::Seconds(15),
                                .request_timeout = absl::Seconds(30)});
  ASSERT_TRUE(client.ok()) << client.status();
  auto held = (*client)->acquire("payout/1", absl::Seconds(1), absl::ZeroDuration());
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_EQ(kill(first.pid(), SIGSTOP), 0);
  const MonoTime frozen = Clock::Real()->Now();
  bool confirmed = false;
  while (!confirmed && Clock::Real()->Now() - frozen < absl::Seconds(15)) {
    try {
      (*client)->checkStillHeld(*held, Confirm::kWithServer);
      confirmed = true;
    } catch (const LockLostException& e) {
      if (e.reason() != LossReason::kUnconfirmed) {
        ADD_FAILURE() << "lost the lock while the serving replica was frozen: " << e.what();
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  const absl::Duration took = Clock::Real()->Now() - frozen;
  EXPECT_TRUE(confirmed) << "no confirmation from the standby within 15 s";
  std::printf("confirmed by the standby %s after the serving lockd froze\n",
              absl::FormatDuration(took).c_str());
  ASSERT_EQ(kill(first.pid(), SIGCONT), 0);
  // Woken, the first replica finds itself deposed and stands by again, without exiting.
  bool stands_by = false;
  for (int i = 0; i < 200 && !stands_by; ++i) {
    const std::string said = testing::ReadTextFile(options.stderr_file);
    stands_by = said.find("standing by: etcd prefix", said.find("deposed (1 time")) !=
                std::string::npos;
    if (!stands_by) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(stands_by) << testing::ReadTextFile(options.stderr_file);
  EXPECT_FALSE(first.WaitForExit(absl::ZeroDuration()).has_value());
  client->reset();
  standby->Stop();
}

// Issue 37: etcd out of space (its NOSPACE alarm, here from a 4 MiB quota filled by someone
// else's keys). The serving replica's next commit fails: a clean fault, the request refused,
// the replica deposed; nobody serves while etcd refuses writes, and no replica exits. Once an
// operator frees space, compacts, defragments and disarms the alarm, a replica takes over by
// itself and everything acknowledged before is there.
TEST(EtcdNoSpaceTest, NothingAcknowledgedIsLostAndAReplicaServesOnceTheAlarmIsDisarmed) {
  testing::TempDir tmp;
  EtcdProcess etcd(EtcdProcess::Options{.extra_args = {"--quota-backend-bytes=4194304"}});
  LockdProcess first({.extra_args = {testing::OwnerTtlFlag()},
                      .stderr_file = tmp.path() + "/first.err",
                      .etcd = etcd.endpoint(),
                      .etcd_prefix = "/fencelock/n"});
  auto standby =
      process::Child::Spawn(LOCKD_BINARY,
                            {"serve", "--etcd=" + etcd.endpoint(), "--etcd-prefix=/fencelock/n",
                             "--etcd-standby", testing::OwnerTtlFlag(), "--port=0",
                             "--port-file=" + tmp.path() + "/standby.port", "--metrics-port=-1"},
                            {.stderr_file = tmp.path() + "/standby.err"});
  ASSERT_TRUE(standby.ok()) << standby.status();
  RawConnection v = RawConnection::Tcp(first.port());
  const uint64_t session = v.HelloAndOpenSession(absl::Minutes(5));
  const wire::Response granted = v.Call(request::Acquire(session, "payout/1"));
  ASSERT_TRUE(granted.acquire().granted()) << granted.ShortDebugString();

  // Someone fills etcd: 1 MiB values until it raises the alarm.
  const std::string big = tmp.path() + "/big";
  std::ofstream(big, std::ios::binary) << std::string(1 << 20, 'x');
  bool full = false;
  for (int i = 0; i < 12 && !full; ++i) {
    auto [ok, out] = etcd.Etcdctl(absl::StrCat("put /filler/", i, " < ", big));
    full = !ok && out.find("database space exceeded") != std::string::npos;
  }
  ASSERT_TRUE(full) << etcd.Etcdctl("alarm list").second;
  const wire::Response refused = v.Call(request::Acquire(session, "payout/2"));
  EXPECT_NE(refused.code(), wire::OK) << refused.ShortDebugString();
  EXPECT_FALSE(refused.acquire().granted());
  // Deposed; it stands by again, as the other does, and nobody serves while etcd is full.
  for (int i = 0; i < 200 && std::filesystem::exists(first.port_file()); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_FALSE(std::filesystem::exists(first.port_file()));
  // Past the owner TTL: a lease that was not revoked is gone.
  absl::SleepFor(absl::Seconds(2 * testing::kOwnerTtlSeconds));
  EXPECT_FALSE(std::filesystem::exists(first.port_file()));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/standby.port"));
  EXPECT_FALSE(first.WaitForExit(absl::ZeroDuration()).has_value());
  EXPECT_FALSE(standby->Wait(absl::ZeroDuration()).has_value());
  const std::string said = testing::ReadTextFile(tmp.path() + "/first.err") +
                           testing::ReadTextFile(tmp.path() + "/standby.err");
  EXPECT_THAT(said, HasSubstr("database space exceeded"));
  EXPECT_THAT(said, HasSubstr("etcd is out of space: its NOSPACE alarm refuses writes"));

  // The operator's recovery, as etcd's documentation gives it.
  ASSERT_TRUE(etcd.Etcdctl("del --prefix /filler/").first);
  const std::string status = etcd.Etcdctl("endpoint status --write-out=fields").second;
  const size_t at = status.find("\"Revision\"");
  ASSERT_NE(at, std::string::npos) << status;
  const long revision = std::strtol(status.c_str() + status.find(':', at) + 1, nullptr, 10);
  ASSERT_TRUE(etcd.Etcdctl(absl::StrCat("compact ", revision)).first);
  ASSERT_TRUE(etcd.Etcdctl("defrag").first);
  ASSERT_TRUE(etcd.Etcdctl("alarm disarm").first);

  // A replica takes over by itself, with the lock acknowledged before the fault.
  std::optional<int> serving_port;
  for (int i = 0; i < 400 && !serving_port; ++i) {
    for (const std::string& file : {first.port_file(), tmp.path() + "/standby.port"}) {
      std::ifstream in(file);
      int port = 0;
      if (in >> port && port > 0) serving_port = port;
    }
    if (!serving_port) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(serving_port.has_value()) << "no replica served after the alarm was disarmed";
  RawConnection w = RawConnection::Tcp(*serving_port);
  w.Hello();
  EXPECT_EQ(w.Call(request::Validate("payout/1", granted.acquire().token())).code(), wire::OK);
  const uint64_t other = w.Call(request::OpenSession(absl::Minutes(1))).open_session().session_id();
  const wire::Response second = w.Call(request::Acquire(other, "payout/2"));
  ASSERT_TRUE(second.acquire().granted()) << second.ShortDebugString();
  EXPECT_GT(second.acquire().token(), granted.acquire().token());
  standby->Stop();
}

TEST_F(EtcdTest, SnapshotsKeepThePrefixSmall) {
  LockdProcess::Options options = Options("/fencelock/d");
  options.extra_args.push_back("--etcd-snapshot-bytes=65536");
  LockdProcess lockd(options);
  RawConnection c = RawConnection::Tcp(lockd.port());
  const uint64_t session = Open(c).session_id();
  uint64_t last = 0;
  for (int round = 0; round < 20; ++round) {
    std::vector<wire::Request> acquires;
    for (int i = 0; i < 500; ++i) {
      acquires.push_back(request::Acquire(session, absl::StrCat("lock/", round, "/", i)));
    }
    std::vector<wire::Request> releases;
    for (const wire::Response& r : c.Pipeline(acquires)) {
      ASSERT_TRUE(r.acquire().granted()) << r.ShortDebugString();
      last = std::max(last, r.acquire().token());
      releases.push_back(request::Release(session, r.acquire().lock(), r.acquire().token()));
    }
    for (const wire::Response& r : c.Pipeline(releases)) ASSERT_EQ(r.code(), wire::OK);
  }
  // 20,000 grants and releases, about 800 KB of log: snapshots every 64 KiB, and the log they
  // cover deleted. lockd asks for a snapshot once a batch commits, so one may still be on its
  // way after the last reply; its head and the deletion of the log it covers are one
  // transaction. The check reads a listing that no snapshot moved: the head read before and
  // after it is the same.
  std::vector<std::string> keys;
  uint64_t snapshot_lsn = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string before = etcd_.Get("/fencelock/d/snapshot-head");
    keys = etcd_.Keys("/fencelock/d/");
    const std::string after = etcd_.Get("/fencelock/d/snapshot-head");
    snapshot_lsn = std::strtoull(after.c_str(), nullptr, 10);
    if (before == after) break;
    snapshot_lsn = 0;
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::printf("keys under the prefix after 20,000 cycles: %zu; etcd database %lld bytes\n",
              keys.size(), static_cast<long long>(etcd_.DbSize()));
  // What stays is the snapshot in force and the log after it: every log key it covers is
  // gone (how many remain depends on how batches formed, so their number is not the check).
  EXPECT_GT(snapshot_lsn, 10000u) << "of about 20,000 records (0: no snapshot, or its head "
                                     "moved during each of 100 listings)";
  for (const std::string& key : keys) {
    if (key.rfind("/fencelock/d/log/", 0) != 0) continue;
    EXPECT_GT(std::strtoull(key.c_str() + sizeof("/fencelock/d/log/") - 1, nullptr, 10),
              snapshot_lsn)
        << key << " is covered by the snapshot";
  }
  lockd.Kill();
  lockd.Restart();
  RawConnection again = RawConnection::Tcp(lockd.port());
  const uint64_t fresh = Open(again).session_id();
  EXPECT_GT(again.Call(request::Acquire(fresh, "after")).acquire().token(), last);
}

TEST_F(EtcdTest, AnEtcdThatDoesNotAnswerIsReported) {
  auto [status, err] = testing::RunLockdToExit(
      {"serve", absl::StrCat("--etcd=127.0.0.1:", testing::FreeLoopbackPort()),
       "--etcd-prefix=/fencelock/e", "--port=0", "--metrics-port=-1"});
  EXPECT_NE(status, 0);
  EXPECT_THAT(err, HasSubstr("etcd at 127.0.0.1:"));
  auto [bad, why] = testing::RunLockdToExit(
      {"serve", "--etcd=nohostport", "--etcd-prefix=/fencelock/e", "--port=0"});
  EXPECT_NE(bad, 0);
  EXPECT_THAT(why, HasSubstr("each endpoint must be host:port"));
}

}  // namespace
}  // namespace fencelock
