// Issue 16, the etcd commit log: lockd keeps its state in a real etcd (one member, started by
// the test) instead of a state directory. The state survives a killed lockd, tokens keep
// increasing across lockds, one lockd serves a prefix at a time (a second is refused, naming the
// first; a frozen one that lost its lease answers nothing once it wakes), and snapshots keep
// the prefix small.
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "etcd_process.h"
#include "lockd_process.h"
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
    return {.extra_args = {"--etcd-owner-ttl=2s"},
            .stderr_file = tmp_.path() + "/" + std::to_string(++lockds_) + ".stderr",
            .etcd = etcd_.endpoint(),
            .etcd_prefix = prefix,
            .etcd_init = init};
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
  lockd.Kill();
  lockd.Restart();  // waits for the dead lockd's lease on the prefix to run out
  RawConnection again = RawConnection::Tcp(lockd.port());
  again.Hello();
  ASSERT_EQ(again.Call(request::Resume(session.session_id(), session.secret())).code(), wire::OK);
  EXPECT_EQ(again.Call(request::Validate("payout/1", held, session.session_id())).code(),
            wire::OK);
  const uint64_t next =
      again.Call(request::Acquire(session.session_id(), "payout/3")).acquire().token();
  EXPECT_GT(next, last);
}

TEST_F(EtcdTest, ASecondLockdOnThePrefixIsRefusedNamingTheFirst) {
  LockdProcess first(Options("/fencelock/b"));
  auto [status, err] = testing::RunLockdToExit(
      {"serve", "--etcd=" + etcd_.endpoint(), "--etcd-prefix=/fencelock/b", "--port=0",
       "--metrics-port=-1", "--etcd-owner-ttl=2s"});
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
  LockdProcess a(Options("/fencelock/c"));
  RawConnection to_a = RawConnection::Tcp(a.port());
  const wire::OpenSessionReply session = Open(to_a);
  const uint64_t token =
      to_a.Call(request::Acquire(session.session_id(), "payout/1")).acquire().token();
  ASSERT_GT(token, 0u);
  ASSERT_EQ(kill(a.pid(), SIGSTOP), 0);
  // b takes the prefix once a's lease (2 s) has run out, and restores a's lock.
  LockdProcess b(Options("/fencelock/c", /*init=*/false));
  ASSERT_EQ(kill(a.pid(), SIGCONT), 0);
  // a woke past its ownership deadline: nothing it would answer from its state is answered.
  const wire::Response stale = to_a.Call(request::Validate("payout/1", token));
  EXPECT_EQ(stale.code(), wire::UNAVAILABLE) << stale.ShortDebugString();
  EXPECT_EQ(to_a.Call(request::Acquire(session.session_id(), "payout/9")).code(),
            wire::UNAVAILABLE);
  RawConnection to_b = RawConnection::Tcp(b.port());
  to_b.Hello();
  EXPECT_EQ(to_b.Call(request::Validate("payout/1", token)).code(), wire::OK);
  ASSERT_EQ(to_b.Call(request::Resume(session.session_id(), session.secret())).code(), wire::OK);
  EXPECT_GT(to_b.Call(request::Acquire(session.session_id(), "payout/2")).acquire().token(),
            token);
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
  // cover deleted.
  const std::vector<std::string> keys = etcd_.Keys("/fencelock/d/");
  std::printf("keys under the prefix after 20,000 cycles: %zu; etcd database %lld bytes\n",
              keys.size(), static_cast<long long>(etcd_.DbSize()));
  EXPECT_LT(keys.size(), 40u);
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
