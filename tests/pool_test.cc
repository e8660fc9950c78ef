// Admission pools against a real lockd: a disk fault blocks new admission but keeps every lease
// granted and visible, and lockd comes back with them (ADR-0003's failure posture); a client
// that speaks only protocol version 1 keeps its locks and is told pools need version 2; a
// stranger who guesses an owner's epoch is refused; the permissions file's manage and operator
// rights.
//
// lockd runs in-process for the disk fault (its file system is wrapped by a fault-injecting
// Env); the rest starts lockd as a process.
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

#include "fencelock/wire.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/pool_client.h"
#include "lock-server/server.h"
#include "lock-server/storage.h"
#include "lock-server/testing/test_envs.h"
#include "lockd_process.h"
#include "metrics/http_get.h"
#include "protocol/session.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using server::Env;
using server::FaultInjectingEnv;
using testing::LockdProcess;
using testing::RawConnection;

// Managers reach pools on lockd's Unix socket (ADR 0004): this lockd listens on one beside
// its state directory, and address() names it.
class InProcessLockd {
 public:
  InProcessLockd(const std::string& dir, Env* env,
                 absl::Duration idle_timeout = absl::Seconds(60))
      : unix_path_(dir + ".sock") {
    server::ServerOptions options;
    options.connections.idle_timeout = idle_timeout;
    options.storage.data_dir = dir;
    options.storage.env = env;
    options.listen.tcp_port = 0;
    options.listen.unix_socket_path = unix_path_;
    options.admission_lock = dir + ".admission.lock";  // this test's host (ADR 0005)
    options.metrics.port = -1;
    auto server = server::Server::Create(options);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    thread_ = std::thread([this] { (void)server_->Run(); });
  }
  ~InProcessLockd() {
    server_->Shutdown();
    thread_.join();
  }
  std::string address() const { return "unix:" + unix_path_; }

 private:
  std::string unix_path_;
  std::unique_ptr<server::Server> server_;
  std::thread thread_;
};

std::unique_ptr<PoolClient> Client(const std::string& address) {
  auto c = PoolClient::Create({.server = address, .timeout = absl::Seconds(5)});
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

TEST(PoolFaultTest, ADiskFaultBlocksAdmissionKeepsLeasesAndRestartRestoresThem) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/state";
  ASSERT_TRUE(server::InitDataDir(Env::Posix(), dir, 1 << 20).ok());
  FaultInjectingEnv disk(Env::Posix());
  PoolOwnerId owner;
  uint64_t active = 0;
  uint64_t decision = 0;
  {
    InProcessLockd lockd(dir, &disk);
    auto c = Client(lockd.address());
    ASSERT_TRUE(c->publish("p", 1, 4, {{.id = "a"}}).ok());
    auto claimed = c->claim("p", "a", 1);
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    owner = *claimed;
    auto g = c->acquire("p", "a", "s1", owner, absl::Seconds(30));
    ASSERT_TRUE(g.ok() && g->granted) << g.status();
    active = g->token;
    auto d = c->activate("p", "a", "s1", active, owner);
    ASSERT_TRUE(d.ok()) << d.status();
    decision = *d;

    disk.SetDiskFull(true);
    auto refused = c->acquire("p", "a", "s2", owner, absl::Seconds(30));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
    disk.SetDiskFull(false);
    // The fault stays until a restart: no new admission, the lease still granted and shown.
    EXPECT_EQ(c->acquire("p", "a", "s3", owner, absl::Seconds(30)).status().code(),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ(c->release("p", "a", "s1", active, owner).status().code(),
              absl::StatusCode::kUnavailable);
    auto view = c->status("p");
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_THAT(view->degraded, HasSubstr("no new admission"));
    ASSERT_GE(view->leases.size(), 1u);
    EXPECT_EQ(view->leases[0].token, active);
    EXPECT_TRUE(view->leases[0].active);
  }
  InProcessLockd restarted(dir, Env::Posix());
  auto c = Client(restarted.address());
  auto view = c->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->degraded.empty());
  ASSERT_EQ(view->leases.size(), 1u);  // s2's grant was never durable, never acknowledged
  EXPECT_EQ(view->leases[0].token, active);
  EXPECT_TRUE(view->leases[0].active);
  EXPECT_EQ(view->decision, decision);
  auto g = c->acquire("p", "a", "s2", owner, absl::Seconds(30));
  ASSERT_TRUE(g.ok() && g->granted) << g.status();
  EXPECT_GT(g->token, active);
}

// lockd closes a manager's idle connection (here after 200 ms): the next call notices before
// sending anything and goes out on a new connection, as if nothing had happened.
TEST(PoolConnectionTest, ACallAfterLockdClosedTheIdleConnectionGoesOutOnANewOne) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/state";
  ASSERT_TRUE(server::InitDataDir(Env::Posix(), dir, 1 << 20).ok());
  InProcessLockd lockd(dir, Env::Posix(), absl::Milliseconds(200));
  auto c = Client(lockd.address());
  ASSERT_TRUE(c->publish("p", 1, 4, {{.id = "a"}}).ok());
  absl::SleepFor(absl::Seconds(1));
  auto claimed = c->claim("p", "a", 1);
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  auto view = c->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->profiles.size(), 1u);
}

// A replica list whose first entry refuses connections: the call is made on the next one, and
// an address that cannot be parsed is refused by Create, naming it.
TEST(PoolConnectionTest, AReplicaListIsTriedInTurnAndABadOneIsRefusedAtCreate) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/state";
  ASSERT_TRUE(server::InitDataDir(Env::Posix(), dir, 1 << 20).ok());
  InProcessLockd lockd(dir, Env::Posix());
  auto c = Client("127.0.0.1:1," + lockd.address());
  auto view = c->status("p");
  EXPECT_EQ(view.status().code(), absl::StatusCode::kNotFound) << view.status();
  auto bad = PoolClient::Create({.server = "127.0.0.1:99999"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("99999"));
}

class PoolProtocolTest : public ::testing::Test {
 protected:
  PoolProtocolTest()
      : lockd_(std::make_unique<LockdProcess>(LockdProcess::Options{.unix_socket = true})) {}
  std::string unix_address() const { return "unix:" + lockd_->unix_path(); }
  std::unique_ptr<LockdProcess> lockd_;
};

TEST_F(PoolProtocolTest, AVersionOneClientKeepsItsLocksAndIsToldPoolsNeedVersionTwo) {
  RawConnection old = RawConnection::Tcp(lockd_->port());
  const wire::Response greeted = old.Call(protocol::HelloRequest("raw-test", {.min = 1, .max = 1}));
  ASSERT_EQ(greeted.code(), wire::OK) << greeted.message();
  EXPECT_EQ(greeted.hello().version(), 1u);
  const wire::Response session = old.Call(testing::request::OpenSession(absl::Seconds(10)));
  ASSERT_EQ(session.code(), wire::OK);
  const wire::Response granted =
      old.Call(testing::request::Acquire(session.open_session().session_id(), "l"));
  ASSERT_EQ(granted.code(), wire::OK);
  EXPECT_TRUE(granted.acquire().granted());
  const wire::Response refused = old.Call(testing::request::PoolStatus("p"));
  EXPECT_EQ(refused.code(), wire::UNSUPPORTED_VERSION);
  EXPECT_THAT(refused.message(), HasSubstr("need protocol version 2"));
  EXPECT_THAT(refused.message(), HasSubstr("negotiated version 1"));
}

// PoolDelete is protocol version 4: a manager that speaks up to 3 is told so, and its other
// pool requests work.
TEST_F(PoolProtocolTest, AVersionThreeClientIsToldPoolDeleteNeedsVersionFour) {
  RawConnection older = RawConnection::Unix(lockd_->unix_path());
  const wire::Response greeted = older.Call(protocol::HelloRequest("raw-test", {.min = 1, .max = 3}));
  ASSERT_EQ(greeted.code(), wire::OK) << greeted.message();
  EXPECT_EQ(greeted.hello().version(), 3u);
  const wire::Response refused = older.Call(testing::request::PoolDelete("p"));
  EXPECT_EQ(refused.code(), wire::UNSUPPORTED_VERSION);
  EXPECT_THAT(refused.message(), HasSubstr("PoolDelete needs protocol version 4"));
  EXPECT_EQ(older.Call(testing::request::PoolStatus("p")).code(), wire::NOT_FOUND);
}

TEST_F(PoolProtocolTest, AStrangerWithTheEpochButNotTheKeyIsRefused) {
  auto c = Client(unix_address());
  ASSERT_TRUE(c->publish("p", 1, 4, {{.id = "a"}}).ok());
  auto owner = c->claim("p", "a", 1);
  ASSERT_TRUE(owner.ok());
  auto g = c->acquire("p", "a", "s1", *owner, absl::ZeroDuration());
  ASSERT_TRUE(g.ok() && g->granted);
  PoolOwnerId guess{owner->epoch, std::string(16, '\0')};
  auto stranger = Client(unix_address());
  EXPECT_EQ(stranger->release("p", "a", "s1", g->token, guess).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(stranger->activate("p", "a", "s1", g->token, guess).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto view = c->status("p");
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->leases.size(), 1u);
  EXPECT_FALSE(view->leases[0].active);
}

TEST_F(PoolProtocolTest, MetricsShowEachPoolAndProfileAndUnknownDemandAsNaN) {
  auto c = Client(unix_address());
  ASSERT_TRUE(c->publish("p", 1, 4, {{.id = "a", .cost = 2}, {.id = "b"}}).ok());
  auto a = c->claim("p", "a", 1);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(c->setDemand("p", "a", *a, 1).ok());
  auto g = c->acquire("p", "a", "s1", *a, absl::ZeroDuration());
  ASSERT_TRUE(g.ok() && g->granted);
  ASSERT_TRUE(c->activate("p", "a", "s1", g->token, *a).ok());
  // NaN as the text format spells it (prometheus-cpp wrote "Nan").
  const std::vector<std::string> expected = {
      "lockd_pool_budget_units{pool=\"p\"} 4",
      "lockd_pool_used_units{pool=\"p\"} 2",
      "lockd_pool_active_units{pool=\"p\",profile=\"a\"} 2",
      "lockd_pool_pending_units{pool=\"p\",profile=\"a\"} 0",
      "lockd_pool_pending_units{pool=\"p\",profile=\"b\"} NaN",
      "lockd_pool_complete{pool=\"p\"} 0",
      "lockd_pool_grants_total 1"};
  auto missing = [&](const std::string& page) {
    return std::count_if(expected.begin(), expected.end(), [&](const std::string& line) {
      return page.find(line) == std::string::npos;
    });
  };
  // lockd exports its figures every 250 ms, one metric after the other: a scrape in the middle
  // of an export may show one figure of the grant and not yet another.
  std::string page;
  for (int i = 0; i < 200; ++i) {
    auto got = metrics::HttpGet("127.0.0.1", lockd_->metrics_port(), "/metrics");
    ASSERT_TRUE(got.ok()) << got.status();
    page = got->body;
    if (missing(page) == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  for (const std::string& line : expected) EXPECT_THAT(page, HasSubstr(line));
  // Never a slot name or a token.
  EXPECT_THAT(page, ::testing::Not(HasSubstr("s1")));
}

TEST_F(PoolProtocolTest, BadOwnerTextAndProfilesAreRefusedBeforeSending) {
  EXPECT_FALSE(PoolOwnerId::Parse("").ok());
  EXPECT_FALSE(PoolOwnerId::Parse("0:ab").ok());
  EXPECT_FALSE(PoolOwnerId::Parse("3:xyz").ok());
  EXPECT_FALSE(PoolOwnerId::Parse("3:abc").ok());
  auto round = PoolOwnerId::Parse(PoolOwnerId{7, "\x01\xff"}.ToString());
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->epoch, 7u);
  EXPECT_EQ(round->key, "\x01\xff");
  EXPECT_FALSE(PoolProfileDef::Parse(":cost=1").ok());
  EXPECT_FALSE(PoolProfileDef::Parse("a:cost=x").ok());
  EXPECT_FALSE(PoolProfileDef::Parse("a:lend").ok());
  auto def = PoolProfileDef::Parse("a:cost=2:reserve=3:lendable:borrow");
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->cost, 2u);
  EXPECT_EQ(def->reserved, 3u);
  EXPECT_TRUE(def->lendable && def->borrow);
}

TEST(PoolFlagsTest, AbsurdPoolTimingsAreRefusedNamingTheFlag) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/state";
  ASSERT_EQ(testing::InitDataDir(dir), 0);
  for (const std::string flag : {"--pool-demand-ttl=0s", "--pool-demand-ttl=2s",
                                 "--pool-demand-ttl=1000h",
                                 "--pool-provisional-ttl=1ms", "--pool-provisional-ttl=-5s"}) {
    auto [status, err] = testing::RunLockdToExit(
        {"serve", "--data-dir=" + dir, "--port=0", "--metrics-port=-1", flag});
    EXPECT_NE(status, 0) << flag;
    const std::string name = flag.substr(0, flag.find('='));
    EXPECT_THAT(err, HasSubstr(name)) << flag;
    // Below the managers' cadences (seed ADR-0006), the refusal names both.
    if (flag == "--pool-demand-ttl=2s") {
      EXPECT_THAT(err, HasSubstr("at least 3s")) << err;
      EXPECT_THAT(err, HasSubstr("every 1s")) << err;
      EXPECT_THAT(err, HasSubstr("every 2s")) << err;
    }
  }
}

// Every pool request of a client, each answered with its status (ADR 0004's tests try them all).
std::vector<std::pair<std::string, absl::Status>> EveryPoolRequest(PoolClient& c,
                                                                     const PoolOwnerId& owner,
                                                                     uint64_t token) {
  return {
      {"publish", c.publish("p", 2, 8, {{.id = "a"}, {.id = "b"}}).status()},
      {"claim", c.claim("p", "a", 1).status()},
      {"ack", c.ack("p", "a", owner, 1)},
      {"set-demand", c.setDemand("p", "a", owner, 1)},
      {"acquire", c.acquire("p", "a", "s2", owner, absl::ZeroDuration()).status()},
      {"renew", c.renew("p", "a", "s1", token, owner).status()},
      {"activate", c.activate("p", "a", "s1", token, owner).status()},
      {"release", c.release("p", "a", "s1", token, owner).status()},
      {"recover", c.recover("p", "a", "s1", token, "trust-me").status()},
      {"drain", c.drain("p", true)},
      {"status", c.status("p").status()},
      {"stop", c.stop()},
  };
}

// ADR 0004: without a permissions file, pools are served on the Unix socket only. A client on
// loopback TCP is refused every pool request, naming the rule, even with the manager's owner
// key; the manager on the Unix socket goes on as if nothing had happened.
TEST(PoolTransportTest, OverTcpWithoutAFileEveryPoolRequestIsRefusedNamingTheRule) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  auto manager = Client("unix:" + lockd.unix_path());
  ASSERT_TRUE(manager->publish("p", 1, 4, {{.id = "a"}, {.id = "b"}}).ok());
  auto owner = manager->claim("p", "a", 1);
  ASSERT_TRUE(owner.ok()) << owner.status();
  auto g = manager->acquire("p", "a", "s1", *owner, absl::ZeroDuration());
  ASSERT_TRUE(g.ok() && g->granted) << g.status();
  auto tcp = Client("127.0.0.1:" + std::to_string(lockd.port()));
  for (const auto& [what, status] : EveryPoolRequest(*tcp, *owner, g->token)) {
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << what << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("served only on lockd's Unix socket (ADR 0004)"))
        << what;
    EXPECT_THAT(status.message(), HasSubstr("anonymous came over TCP")) << what;
  }
  // Nothing changed: the lease is the manager's, still provisional, and it goes on.
  auto view = manager->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->generation, 1u);
  ASSERT_EQ(view->leases.size(), 1u);
  EXPECT_FALSE(view->leases[0].active);
  EXPECT_FALSE(view->draining);
  EXPECT_TRUE(manager->activate("p", "a", "s1", g->token, *owner).ok());
  EXPECT_TRUE(manager->release("p", "a", "s1", g->token, *owner).ok());
  // Locks on TCP are unchanged.
  RawConnection raw = RawConnection::Tcp(lockd.port());
  ASSERT_EQ(raw.Call(protocol::HelloRequest("raw-test")).code(), wire::OK);
  EXPECT_EQ(raw.Call(testing::request::OpenSession(absl::Seconds(10))).code(), wire::OK);
}

// With a permissions file, its rules open pools to network identities (here plaintext TCP's
// `anonymous`; a TLS certificate's identity works the same way, tls_test).
TEST(PoolTransportTest, APermissionsFileOpensPoolsToANamedNetworkIdentity) {
  testing::TempDir tmp;
  const std::string file = tmp.path() + "/permissions";
  std::ofstream(file) << "anonymous operator\nanonymous manage p/a\n";
  LockdProcess lockd(LockdProcess::Options{.extra_args = {"--permissions=" + file}});
  auto tcp = Client("127.0.0.1:" + std::to_string(lockd.port()));
  ASSERT_TRUE(tcp->publish("p", 1, 4, {{.id = "a"}, {.id = "b"}}).ok());
  auto owner = tcp->claim("p", "a", 1);
  ASSERT_TRUE(owner.ok()) << owner.status();
  auto g = tcp->acquire("p", "a", "s1", *owner, absl::ZeroDuration());
  ASSERT_TRUE(g.ok() && g->granted) << g.status();
  EXPECT_TRUE(tcp->release("p", "a", "s1", g->token, *owner).ok());
  auto b = tcp->claim("p", "b", 1);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(b.status().message(), HasSubstr("may not manage p/b"));
}

// ADR 0005: one admission namespace per host. A lockd that coordinates pools holds the host's
// admission lock; a second one on another state directory serves locks but its publish is
// refused naming the first, one whose state holds a pool does not start, and once the first
// is gone the second may coordinate.
TEST(AdmissionNamespaceTest, ASecondCoordinatorOnTheHostIsRefusedNamingTheFirst) {
  testing::TempDir tmp;
  const std::string host_lock = "--admission-lock=" + tmp.path() + "/admission.lock";
  const std::string b_dir = tmp.path() + "/b";
  ASSERT_EQ(testing::InitDataDir(b_dir), 0);
  {  // b coordinates a pool first, then stops: its state holds the pool.
    LockdProcess b(LockdProcess::Options{
        .unix_socket = true, .extra_args = {host_lock}, .data_dir = b_dir});
    ASSERT_TRUE(Client("unix:" + b.unix_path())->publish("q", 1, 4, {{.id = "x"}}).ok());
  }
  LockdProcess a(LockdProcess::Options{.unix_socket = true, .extra_args = {host_lock}});
  auto first = Client("unix:" + a.unix_path());
  ASSERT_TRUE(first->publish("p", 1, 4, {{.id = "a"}}).ok());
  const std::string holder = "locked by lockd pid " + std::to_string(a.pid()) + " on host ";

  // A lockd without pools starts, serves locks, and may not publish.
  LockdProcess c(LockdProcess::Options{.unix_socket = true, .extra_args = {host_lock}});
  auto second = Client("unix:" + c.unix_path());
  auto refused = second->publish("r", 1, 4, {{.id = "a"}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr(holder));
  EXPECT_THAT(refused.status().message(), HasSubstr("one host has one admission namespace"));
  EXPECT_THAT(refused.status().message(), HasSubstr(a.data_dir()));
  RawConnection raw = RawConnection::Tcp(c.port());
  ASSERT_EQ(raw.Call(protocol::HelloRequest("raw-test")).code(), wire::OK);
  EXPECT_EQ(raw.Call(testing::request::OpenSession(absl::Seconds(10))).code(), wire::OK);

  // A lockd whose state holds a pool refuses to start, naming the holder.
  auto [status, err] = testing::RunLockdToExit({"serve", "--data-dir=" + b_dir, "--port=0",
                                                "--metrics-port=-1", host_lock});
  EXPECT_NE(status, 0);
  EXPECT_THAT(err, HasSubstr("this state holds 1 admission pool"));
  EXPECT_THAT(err, HasSubstr(holder));

  // The first coordinator gone (the kernel lets go of its lock), the second may publish. A
  // mistaken publish on yet another lockd (refused: a duplicate profile) does not keep it out.
  EXPECT_EQ(WEXITSTATUS(a.Stop()), 0);
  LockdProcess d(LockdProcess::Options{.unix_socket = true, .extra_args = {host_lock}});
  auto mistaken = Client("unix:" + d.unix_path())->publish("r", 1, 4, {{.id = "a"}, {.id = "a"}});
  EXPECT_EQ(mistaken.status().code(), absl::StatusCode::kInvalidArgument) << mistaken.status();
  auto taken = second->publish("r", 1, 4, {{.id = "a"}});
  EXPECT_TRUE(taken.ok()) << taken.status();
}

// Issue 59: the admission lock lives in a world-writable directory (/run/lock). A symbolic link
// put there (by another user, with fs.protected_symlinks off) made lockd truncate and write
// into the file it pointed at. lockd now locks only a regular file of its own, with one link,
// and writes nothing before the lock is held; whatever else is at the path is refused by name
// and left as it was.
TEST(AdmissionNamespaceTest, AnAdmissionLockThatIsNotLockdsOwnFileIsRefused) {
  testing::TempDir tmp;
  const std::string path = tmp.path() + "/admission.lock";
  const std::string victim = tmp.path() + "/precious";
  std::ofstream(victim) << "do not touch\n";
  auto publish_refused = [&](const std::string& why) {
    LockdProcess lockd(LockdProcess::Options{.unix_socket = true,
                                             .extra_args = {"--admission-lock=" + path}});
    auto refused = Client("unix:" + lockd.unix_path())->publish("p", 1, 4, {{.id = "a"}});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << why;
    EXPECT_THAT(refused.status().message(), HasSubstr(path)) << why;
    EXPECT_THAT(refused.status().message(), HasSubstr(why));
    EXPECT_EQ(testing::ReadTextFile(victim), "do not touch\n") << why;
  };
  ASSERT_EQ(symlink(victim.c_str(), path.c_str()), 0);
  publish_refused("is a symbolic link");
  ASSERT_EQ(unlink(path.c_str()), 0);
  ASSERT_EQ(link(victim.c_str(), path.c_str()), 0);
  publish_refused("has 2 hard links");
  ASSERT_EQ(unlink(path.c_str()), 0);
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  publish_refused("is not a regular file");
  ASSERT_EQ(unlink(path.c_str()), 0);
  if (geteuid() == 0) {
    std::ofstream(path) << "someone's\n";
    ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
    publish_refused("belongs to uid 65534");
    EXPECT_EQ(testing::ReadTextFile(path), "someone's\n");
    ASSERT_EQ(unlink(path.c_str()), 0);
  }
  // Its own file: taken, and it names the holder.
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true,
                                           .extra_args = {"--admission-lock=" + path}});
  EXPECT_TRUE(Client("unix:" + lockd.unix_path())->publish("p", 1, 4, {{.id = "a"}}).ok());
  EXPECT_THAT(testing::ReadTextFile(path), HasSubstr("lockd pid " + std::to_string(lockd.pid())));
}

// Runs `body` in a child process as user `uid` (group `uid` too) and returns what it wrote;
// "" when the child failed to drop its privileges or died.
std::string RunAs(uid_t uid, const std::function<std::string()>& body) {
  int fds[2];
  if (pipe(fds) != 0) return "";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
        setresuid(uid, uid, uid) != 0) {
      _exit(1);
    }
    const std::string out = body();
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out : "";
}

// ADR 0004, without a permissions file: the operator is the owner of lockd's state, and a
// profile's manager is the identity that claimed it. Another user on the Unix socket (nobody)
// cannot claim root's profile, act for it with root's owner key, publish, recover, drain or
// stop; it may claim a profile nobody holds and manage it, and the operator may take it over.
TEST(PoolRightsTest, WithoutAFileOnlyTheClaimerManagesAndOnlyTheStateOwnerOperates) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to act as another user";
  constexpr uid_t kNobody = 65534;
  LockdProcess lockd(
      LockdProcess::Options{.unix_socket = true, .extra_args = {"--unix-socket-mode=0666"}});
  const std::string socket_dir = lockd.unix_path().substr(0, lockd.unix_path().rfind('/'));
  ASSERT_EQ(chmod(socket_dir.c_str(), 0755), 0);
  const std::string address = "unix:" + lockd.unix_path();
  auto root = Client(address);
  ASSERT_TRUE(root->publish("p", 1, 4, {{.id = "a"}, {.id = "b"}}).ok());
  auto owner = root->claim("p", "a", 1);
  ASSERT_TRUE(owner.ok()) << owner.status();
  auto g = root->acquire("p", "a", "s1", *owner, absl::ZeroDuration());
  ASSERT_TRUE(g.ok() && g->granted) << g.status();
  ASSERT_TRUE(root->activate("p", "a", "s1", g->token, *owner).ok());

  // As nobody, with everything root's manager knows (its owner key included).
  const std::string refused = RunAs(kNobody, [&] {
    auto c = PoolClient::Create({.server = address, .timeout = absl::Seconds(5)});
    if (!c.ok()) return "create: " + c.status().ToString() + "\n";
    std::string out;
    for (const auto& [what, status] : EveryPoolRequest(**c, *owner, g->token)) {
      absl::StrAppend(&out, what, " ", absl::StatusCodeToString(status.code()), " ",
                      status.message(), "\n");
    }
    return out;
  });
  ASSERT_FALSE(refused.empty()) << "the child could not run as nobody";
  const std::vector<std::string> lines = absl::StrSplit(refused, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 12u) << refused;
  for (const std::string& line : lines) {
    const std::string what = line.substr(0, line.find(' '));
    if (what == "status") {  // listing stays open to every local identity
      EXPECT_THAT(line, HasSubstr(" OK")) << line;
      continue;
    }
    EXPECT_THAT(line, HasSubstr("PERMISSION_DENIED")) << line;
    if (what == "claim") {
      EXPECT_THAT(line, HasSubstr("uid:0 manages it")) << line;
    } else if (what == "publish" || what == "recover" || what == "drain" || what == "stop") {
      EXPECT_THAT(line, HasSubstr("only the owner of lockd's state (uid:0) is the operator"))
          << line;
    } else {
      EXPECT_THAT(line, HasSubstr("only the identity that claimed a profile manages it"))
          << line;
    }
  }
  // Root's lease is untouched, and root still manages it.
  auto view = root->status("p");
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->leases.size(), 1u);
  EXPECT_TRUE(view->leases[0].active);
  EXPECT_EQ(view->profiles[0].owner_epoch, owner->epoch);
  EXPECT_FALSE(view->draining);

  // nobody may claim the profile no one holds, and manage it.
  const std::string managed = RunAs(kNobody, [&] {
    auto c = PoolClient::Create({.server = address, .timeout = absl::Seconds(5)});
    if (!c.ok()) return c.status().ToString();
    auto b = (*c)->claim("p", "b", 1);
    if (!b.ok()) return "claim: " + b.status().ToString();
    auto t = (*c)->acquire("p", "b", "s1", *b, absl::ZeroDuration());
    if (!t.ok() || !t->granted) return std::string("acquire failed");
    auto r = (*c)->release("p", "b", "s1", t->token, *b);
    return r.ok() ? std::string("managed") : "release: " + r.status().ToString();
  });
  EXPECT_EQ(managed, "managed");
  // The operator may take a profile over from another identity (a manager moved to another
  // user); the identity that claimed it last manages it from then on.
  auto taken = root->claim("p", "b", 1);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_TRUE(root->setDemand("p", "b", *taken, 1).ok());
  // And the state's owner may stop lockd once nothing is leased and every pool drains.
  EXPECT_TRUE(root->release("p", "a", "s1", g->token, *owner).ok());
  EXPECT_TRUE(root->drain("p", true).ok());
  EXPECT_TRUE(root->stop().ok());
}

TEST(PoolPermissionsTest, ManageAndOperatorRightsAreEnforced) {
  testing::TempDir tmp;
  const std::string file = tmp.path() + "/permissions";
  const std::string me = "uid:" + std::to_string(getuid());
  std::ofstream(file) << me << " manage p/a\n";
  auto lockd = std::make_unique<LockdProcess>(
      LockdProcess::Options{.unix_socket = true, .extra_args = {"--permissions=" + file}});
  auto c = Client("unix:" + lockd->unix_path());
  auto publish = c->publish("p", 1, 4, {{.id = "a"}, {.id = "b"}});
  EXPECT_EQ(publish.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(publish.status().message(), HasSubstr("no \"operator\" rule"));
  std::ofstream(file) << me << " manage p/a\n" << me << " operator\n";
  kill(lockd->pid(), SIGHUP);
  absl::Status published = absl::UnknownError("not yet");
  for (int i = 0; i < 200 && !published.ok(); ++i) {
    published = c->publish("p", 1, 4, {{.id = "a"}, {.id = "b"}}).status();
    if (!published.ok()) usleep(10'000);
  }
  ASSERT_TRUE(published.ok()) << published;
  std::ofstream(file) << me << " manage p/a\n";
  kill(lockd->pid(), SIGHUP);
  absl::Status recover = absl::OkStatus();
  for (int i = 0; i < 200; ++i) {
    recover = c->recover("p", "a", "s", 1, "gone").status();
    if (recover.code() == absl::StatusCode::kPermissionDenied) break;
    usleep(10'000);
  }
  EXPECT_EQ(recover.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(c->claim("p", "a", 1).ok());
  auto b = c->claim("p", "b", 1);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(b.status().message(), HasSubstr("may not manage p/b"));
}

}  // namespace
}  // namespace fencelock
