// The replicated scenarios (issues 16, 33 and 37, docs/harness.md): lockd's state in a
// 3-member etcd cluster and three lockd replicas on it, with lockd, etcd and the network
// between them faulted while the workers pay.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "clock/clock.h"
#include "harness/fault_proxy.h"
#include "harness/stalled_renewal.h"
#include "scenario_support.h"
#include "fencelock/wire.pb.h"
#include "lock-client/client.h"
#include "lock-server/blocking_connection.h"
#include "payout-demo/cluster.h"
#include "payout-demo/store.h"
#include "process/history.h"
#include "protocol/requests.h"

namespace fencelock::harness {
namespace {

using payout::Cluster;
using payout::ClusterOptions;
using payout::PayoutKey;
using Dir = FaultProxy::Direction;
using Mode = FaultProxy::Mode;
namespace req = protocol::request;

// Replicated runs (issue 16): lockd's state in a 3-member etcd cluster, three lockd replicas on
// it (lockd-a serving, lockd-b and lockd-c standing by), the workers given all three.
constexpr absl::Duration kOwnerTtl = absl::Seconds(2);  // each replica's lease on the prefix
constexpr absl::Duration kOwnerTtlThroughElection = absl::Seconds(5);

// The replicated shape: 3 etcd members (requiring client certificates when the run has
// Env::etcd_tls_dir) and 3 lockd replicas with `owner_ttl` on the prefix.
void Replicas(const Env& env, absl::Duration owner_ttl, ClusterOptions& o) {
  o.etcd_members = 3;
  o.etcd_binary = env.binaries.etcd;
  o.etcd_tls_dir = env.etcd_tls_dir;
  o.lockd_replicas = 3;
  o.etcd_owner_ttl = owner_ttl;
}

enum class HaFault { kLockdKill, kLockdFreeze, kEtcdLeaderKill, kEtcdCut, kOwnerDeleted,
                     kEtcdStranger };

// How long the standbys have stood by before any fault: longer than a long holder's TTL, so
// that a replica that counted restored leases from the start of its wait would expire live
// holders at once (issue 33).
constexpr absl::Duration kStandbyWait = absl::Seconds(7);

// Holders that keep a lock for seconds across whatever the run does (issue 33), checking every
// millisecond that they still hold it (checkStillHeld, the client's local check on its own
// boot-time clock). Each hold is recorded as "acquire" (begin: sent, end: the grant received)
// and "held" (begin: the grant received, end: the last check that passed), so that the
// checker compares every holder's timeline with the others' (client-believed overlaps). Four
// holders, each with a client of its own given every replica, share two locks, so that a lock
// is always wanted by another holder when its holder's lease could be misjudged. One hold in
// three is shared (ADR 0006; its "acquire" says so), which the checker lets overlap only
// another shared hold.
class LongHolders {
 public:
  static constexpr absl::Duration kTtl = absl::Seconds(5);

  LongHolders(const std::string& servers, const std::string& history_dir, uint64_t seed) {
    for (int i = 0; i < 4; ++i) {
      threads_.emplace_back([this, i, servers, history_dir, seed] {
        Run(i, servers, history_dir, seed * 4 + static_cast<uint64_t>(i));
      });
    }
  }
  ~LongHolders() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  // Stops them and judges what they saw: each started, held something, and (from the checker,
  // later) no hold overlapped another. Losses are allowed (a failover can outlast a holder's
  // lease; D5 loses the lock cleanly). `fault_at`: when the run's fault came, for the count of
  // holds across it (0: no single fault).
  void Judge(Outcome& out, int64_t fault_at = 0) {
    Stop();
    out.Expect(error().empty(), "a long holder could not start: " + error());
    out.Expect(holds_ > 0, "the long holders held nothing: the run shows nothing");
    out.Figure("long holders",
               absl::StrCat(holds_.load(), " holds of 2 to 6 s (TTL ", Secs(kTtl), "), ",
                            fault_at > 0 ? absl::StrCat(HeldAcross(fault_at), " held across the fault, ")
                                         : std::string(),
                            lost_.load(), " lost"));
  }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  // Holds whose span [grant received, last check passed] contains `at_ns`.
  int64_t HeldAcross(int64_t at_ns) const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::count_if(spans_.begin(), spans_.end(), [at_ns](const auto& s) {
      return s.first <= at_ns && at_ns <= s.second;
    });
  }

 private:
  void Run(int i, const std::string& servers, const std::string& history_dir, uint64_t seed) {
    const std::string name = absl::StrCat("holder-", i + 1);
    auto writer = history::Writer::Open(absl::StrCat(history_dir, "/", name, ".log"), name);
    auto client = Client::Create(
        {.server = servers, .session_ttl = kTtl, .default_lock_ttl = kTtl, .client_name = name});
    if (!writer.ok() || !client.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = absl::StrCat(name, ": ", !writer.ok() ? writer.status().ToString()
                                                     : client.status().ToString());
      return;
    }
    std::mt19937_64 rng(seed);
    const std::string key = absl::StrCat("hold/", i % 2);
    while (!stop_) {
      const int64_t sent = history::NowNanos();
      const bool shared = rng() % 3 == 0;
      auto held = shared ? (*client)->acquireShared(key, absl::Seconds(1))
                         : (*client)->acquire(key, absl::Seconds(1));
      if (!held.ok()) {
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      const int64_t granted = history::NowNanos();
      (*writer)->Append(sent, "acquire", key, held->token(), shared ? "shared" : "", granted);
      const int64_t hold_ns = absl::ToInt64Nanoseconds(absl::Milliseconds(2000 + rng() % 4001));
      int64_t last_ok = granted;
      bool lost = false;
      while (!stop_ && history::NowNanos() - granted < hold_ns) {
        try {
          (*client)->checkStillHeld(*held);
          last_ok = history::NowNanos();
        } catch (const LockLostException&) {
          lost = true;
          break;
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
      (*writer)->Append(granted, "held", key, held->token(), lost ? "lost" : "kept", last_ok);
      {
        std::lock_guard<std::mutex> lock(mu_);
        spans_.emplace_back(granted, last_ok);
      }
      ++holds_;
      if (lost) {
        ++lost_;
      } else {
        (void)(*client)->release(*held);
      }
    }
  }

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> holds_{0}, lost_{0};
  mutable std::mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> spans_;  // guarded by mu_
  std::string error_;                               // guarded by mu_
  std::vector<std::thread> threads_;
};

// Acquires and releases a lock every 10 ms through a client given every replica, noting when
// each grant arrived: the pauses a client sees, on its boot-time clock.
class Prober {
 public:
  explicit Prober(const std::string& servers)
      : thread_([this, servers] { Run(servers); }) {}
  ~Prober() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // The longest time without a grant over [from_ns, to_ns], counting from the last grant
  // before from_ns.
  absl::Duration LongestPause(int64_t from_ns, int64_t to_ns) const {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t previous = from_ns, longest = 0;
    for (int64_t g : grants_) {
      if (g < from_ns) {
        previous = g;
        continue;
      }
      if (g > to_ns) break;
      longest = std::max(longest, g - previous);
      previous = g;
    }
    longest = std::max(longest, std::min(to_ns, history::NowNanos()) - previous);
    return absl::Nanoseconds(longest);
  }
  int64_t grants() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(grants_.size());
  }

 private:
  void Run(const std::string& servers) {
    auto client = Client::Create({.server = servers,
                                  .session_ttl = absl::Seconds(5),
                                  .default_lock_ttl = absl::Seconds(5),
                                  .client_name = "prober"});
    if (!client.ok()) return;
    // A name per acquire: an acquire whose answer was lost in a failover leaves its grant held
    // by the session until its lease runs out, and acquiring that name again is refused
    // meanwhile ("already holds"), which would count as a pause of the lease's length.
    for (uint64_t i = 0; !stop_; ++i) {
      auto held = (*client)->acquire(absl::StrCat("probe/", i), absl::Milliseconds(500));
      if (held.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          grants_.push_back(history::NowNanos());
        }
        (void)(*client)->release(*held);
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<int64_t> grants_;  // guarded by mu_, ascending
  std::thread thread_;
};

// What a stranger who can read etcd would try as session secrets: every 16-byte protobuf field
// with SessionOpened.secret's tag (3) and every 32-byte one with secret_digest's (5), in the
// bytes etcdctl printed.
std::set<std::string> SecretCandidates(const std::string& dump) {
  std::set<std::string> out;
  for (size_t i = 0; i + 2 <= dump.size(); ++i) {
    const auto tag = static_cast<unsigned char>(dump[i]);
    const auto len = static_cast<unsigned char>(dump[i + 1]);
    if (((tag == 0x1a && len == 16) || (tag == 0x2a && len == 32)) && i + 2 + len <= dump.size()) {
      out.insert(dump.substr(i + 2, len));
    }
  }
  return out;
}

// The first grant decided by a replica other than `old` (any, if old < 0) at or after `from_ns`.
std::optional<history::Record> FirstGrantAfter(History& h, const std::string& old, int64_t from_ns) {
  std::optional<history::Record> first;
  h.Find([&](const history::Record& r) {
    if (r.event == "lockd-grant" && r.process != old && r.begin_ns >= from_ns &&
        (!first || r.begin_ns < first->begin_ns)) {
      first = r;
    }
    return false;
  });
  return first;
}

// When `replica` began to serve after `from_ns`, by its own record. lockd writes its port file
// (which is how the cluster learns that it serves) before that record, so the record may come
// a little after the cluster noticed: it is waited for, not merely looked up.
absl::StatusOr<history::Record> AwaitServingRecord(History& h, const std::string& replica,
                                                   int64_t from_ns) {
  std::optional<history::Record> serving;
  absl::Status s = WaitUntil(
      [&] {
        serving = h.Find([&](const history::Record& r) {
          return r.process == replica && r.event == "lockd-serving" && r.begin_ns > from_ns;
        });
        return serving.has_value();
      },
      absl::Seconds(30), absl::StrCat(replica, "'s lockd-serving record"));
  if (!s.ok()) return s;
  return *serving;
}

// The last act of `replica` and the ownership deadline it held for it.
std::optional<history::Record> LastAct(History& h, const std::string& replica) {
  std::optional<history::Record> last;
  h.Find([&](const history::Record& r) {
    if (r.process == replica && absl::StartsWith(r.event, "lockd-") && r.event != "lockd-owned" &&
        r.event != "lockd-deposed" && r.event != "lockd-fenced-out" &&
        (!last || r.begin_ns > last->begin_ns)) {
      last = r;
    }
    return false;
  });
  return last;
}

// One fault proxy per etcd member (made on first use) and the --etcd endpoints through them.
std::string ProxiedEndpoints(std::vector<std::unique_ptr<FaultProxy>>& proxies,
                             payout::EtcdCluster& etcd) {
  if (proxies.empty()) {
    for (int i = 0; i < etcd.size(); ++i) {
      proxies.push_back(std::make_unique<FaultProxy>(etcd.client_port(i)));
    }
  }
  std::string endpoints;
  for (const auto& p : proxies) {
    absl::StrAppend(&endpoints, endpoints.empty() ? "" : ",", "127.0.0.1:", p->port());
  }
  return endpoints;
}

absl::Status Replicated(Env& env, Outcome& out, HaFault fault) {
  const int64_t n = BusyPayouts(env);
  // --etcd-owner-ttl measures failover against other TTLs (issue 37). Killing the etcd leader
  // costs an election (about a second): a lease on the prefix well above that lets lockd-a
  // keep serving through it, as production settings (10 s) would.
  const absl::Duration owner_ttl =
      env.etcd_owner_ttl > absl::ZeroDuration() ? env.etcd_owner_ttl
      : fault == HaFault::kEtcdLeaderKill       ? kOwnerTtlThroughElection
                                                : kOwnerTtl;
  // For kEtcdCut: lockd-a reaches each etcd member through a proxy of its own. Declared before
  // the cluster, which refers to them.
  std::vector<std::unique_ptr<FaultProxy>> proxies;
  auto cluster = StartCluster(env, n, {}, kTtl, [&](ClusterOptions& o) {
    Replicas(env, owner_ttl, o);
    if (fault != HaFault::kEtcdCut) return;
    o.etcd_route = [&proxies](int replica, payout::EtcdCluster& etcd) -> absl::StatusOr<std::string> {
      if (replica != 0) return etcd.endpoints();
      return ProxiedEndpoints(proxies, etcd);
    };
  });
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  // The standbys stand by from here. Long holders hold through everything that follows; the
  // payout workers start once the standbys have waited longer than a holder's TTL.
  const int64_t standing_by = history::NowNanos();
  LongHolders holders(c.lockd_address(), c.Path("history"), env.seed);
  absl::SleepFor(kStandbyWait - absl::Nanoseconds(history::NowNanos() - standing_by));
  // The pause a client sees across the fault: the longest wait between a prober's grants.
  Prober prober(c.lockd_address());
  if (absl::Status s = StartWorkers(c); !s.ok()) return s;
  if (absl::Status s = AwaitSessions(c); !s.ok()) return s;
  History h(c.Path("history"));
  if (absl::Status s = AwaitPaid(h, env.Uniform(n / 8, n / 2)); !s.ok()) return s;
  const int64_t paid_before = h.Count("paid");
  const int old = c.ServingReplica();
  if (old < 0) return absl::InternalError("no lockd replica serves");
  const std::string old_name = c.replica_name(old);
  const int64_t fault_at = history::NowNanos();
  out.Figure("standbys waited", absl::StrCat(Secs(absl::Nanoseconds(fault_at - standing_by)),
                                             " before the fault (long holders' TTL ",
                                             Secs(LongHolders::kTtl), ")"));
  std::string what;
  bool deposed = false;  // the old replica must notice on its own and stand by again
  bool fails_over = true;  // another replica must serve after the fault
  switch (fault) {
    case HaFault::kLockdKill:
      c.replica(old).Signal(SIGKILL);
      c.replica(old).Wait();
      what = absl::StrCat(old_name, " (serving) killed with SIGKILL");
      break;
    case HaFault::kLockdFreeze: {
      const absl::Duration freeze = owner_ttl + absl::Milliseconds(env.Uniform(500, 1500));
      c.replica(old).Signal(SIGSTOP);
      absl::SleepFor(freeze);
      c.replica(old).Signal(SIGCONT);
      what = absl::StrCat(old_name, " (serving) frozen with SIGSTOP for ", Secs(freeze),
                          ", past its ", Secs(owner_ttl), " lease on the prefix");
      deposed = true;
      break;
    }
    case HaFault::kEtcdLeaderKill: {
      auto leader = c.etcd()->Leader(absl::Seconds(5));
      if (!leader.ok()) return leader.status();
      c.etcd()->member(*leader).Signal(SIGKILL);
      c.etcd()->member(*leader).Wait();
      what = absl::StrCat("etcd leader etcd-", *leader, " killed with SIGKILL");
      break;
    }
    case HaFault::kEtcdCut:
      for (const auto& p : proxies) {
        p->Set(Dir::kToServer, Mode::kHold);
        p->Set(Dir::kToClient, Mode::kHold);
      }
      what = absl::StrCat(old_name, " (serving) cut off from every etcd member");
      deposed = true;
      break;
    case HaFault::kOwnerDeleted: {
      // As an operator (or an attacker) with etcdctl would: the serving replica's key goes,
      // while its lease on etcd lives on. The payout workers are stopped meanwhile, so that
      // no commit of theirs makes the serving replica notice (as in issue 33's finding, where
      // only renewals and confirmations reached it); from the harness, a resource confirms a
      // held token with it (Validate) every 10 ms until it refuses.
      for (const char* w : {"w1", "w2", "w3"}) {
        if (process::Child* worker = c.worker(w)) worker->Signal(SIGSTOP);
      }
      auto conn = server::BlockingConnection::Connect(server::BlockingConnectionOptions{
          .server = absl::StrCat("127.0.0.1:", c.replica_port(old)), .timeout = absl::Seconds(2),
          .client_name = "resource", .tls = c.lockd_tls()});
      if (!conn.ok()) return conn.status();
      const wire::Request list = req::ListLocks({.prefix = "hold/"});
      std::optional<wire::LockInfo> held;
      for (int i = 0; i < 300 && !held.has_value(); ++i) {
        auto listed = (*conn)->Call(list);
        if (!listed.ok()) return listed.status();
        if (listed->list().locks_size() > 0) {
          held = listed->list().locks(0);
        } else {
          absl::SleepFor(absl::Milliseconds(10));
        }
      }
      if (!held.has_value()) return absl::InternalError("no long holder held a lock to confirm");
      auto deleted = c.etcd()->Ctl({"del", c.etcd_prefix() + "/owner"});
      if (!deleted.ok()) return deleted.status();
      int64_t last_ok = 0, confirmed = 0;
      const int64_t give_up = history::NowNanos() + absl::ToInt64Nanoseconds(absl::Seconds(5));
      while (history::NowNanos() < give_up) {
        auto reply = (*conn)->Call(req::Validate(held->lock(), held->token()));
        if (!reply.ok() || reply->code() != wire::OK) break;
        last_ok = history::NowNanos();
        ++confirmed;
        absl::SleepFor(absl::Milliseconds(10));
      }
      for (const char* w : {"w1", "w2", "w3"}) {
        if (process::Child* worker = c.worker(w)) worker->Signal(SIGCONT);
      }
      auto next = c.AwaitServingReplica(old, absl::Seconds(30));
      if (!next.ok()) return next.status();
      auto serving = AwaitServingRecord(h, c.replica_name(*next), fault_at);
      if (!serving.ok()) return serving.status();
      out.Expect(last_ok < serving->begin_ns,
                 absl::StrCat(old_name, " confirmed ", held->lock(), " token ", held->token(),
                              " after ", c.replica_name(*next), " began to serve"));
      out.Figure("confirmations after the delete",
                 absl::StrCat(confirmed, " by ", old_name, ", the last ",
                              last_ok == 0 ? std::string("none")
                                           : Secs(absl::Nanoseconds(last_ok - fault_at)),
                              " after the delete",
                              "; ", c.replica_name(*next), " served ",
                              Secs(absl::Nanoseconds(serving->begin_ns - fault_at)), " after it"));
      what = absl::StrCat(c.etcd_prefix(), "/owner deleted with etcdctl while ", old_name,
                          " served");
      deposed = true;
      break;
    }
    case HaFault::kEtcdStranger: {
      // A stranger who can read etcd takes every candidate secret in it and tries each on
      // every session lockd lists.
      auto dump = c.etcd()->Ctl({"get", "--prefix", c.etcd_prefix()});
      if (!dump.ok()) return dump.status();
      const std::set<std::string> candidates = SecretCandidates(*dump);
      auto conn = server::BlockingConnection::Connect(server::BlockingConnectionOptions{
          .server = absl::StrCat("127.0.0.1:", c.replica_port(old)), .timeout = absl::Seconds(2),
          .client_name = "stranger", .tls = c.lockd_tls()});
      if (!conn.ok()) return conn.status();
      auto listed = (*conn)->Call(req::ListLocks({.include_sessions = true}));
      if (!listed.ok()) return listed.status();
      int64_t tries = 0, resumed = 0;
      for (const wire::SessionInfo& s : listed->list().sessions()) {
        for (const std::string& secret : candidates) {
          auto reply = (*conn)->Call(req::Resume(s.session_id(), secret));
          if (!reply.ok()) return reply.status();
          ++tries;
          if (reply->code() == wire::OK) {
            ++resumed;
            out.failures.push_back(absl::StrCat("a stranger resumed session ", s.session_id(),
                                                " with a secret read from etcd"));
          }
        }
      }
      out.Figure("stranger", absl::StrCat(dump->size(), " bytes read from etcd, ",
                                          candidates.size(), " candidate secrets, ",
                                          listed->list().sessions_size(), " sessions, ", tries,
                                          " resumes tried, ", resumed, " accepted"));
      out.Expect(listed->list().sessions_size() > 0 && !candidates.empty(),
                 "the stranger found no session or no candidate: the run shows nothing");
      what = "a stranger read etcd and tried what it found as session secrets";
      fails_over = false;
      break;
    }
  }
  out.Figure("fault", absl::StrCat(what, " after ", paid_before, " payouts"));
  // Payouts go on: the workers finish whichever replica serves.
  if (fault == HaFault::kEtcdStranger) {
    if (absl::Status s = AwaitPaid(h, std::min(n, paid_before + 5)); !s.ok()) return s;
  } else if (fault == HaFault::kEtcdLeaderKill) {
    if (absl::Status s = AwaitPaid(h, paid_before + 5); !s.ok()) return s;
    // etcd elects a new leader among the other two; whether lockd-a kept the prefix depends on
    // how long that took against its own lease.
    std::vector<int64_t> grants;
    h.Find([&](const history::Record& r) {
      if (r.event == "lockd-grant" && r.begin_ns >= fault_at) grants.push_back(r.begin_ns);
      return false;
    });
    std::sort(grants.begin(), grants.end());
    int64_t gap = grants.empty() ? 0 : grants[0] - fault_at;
    for (size_t i = 1; i < grants.size(); ++i) gap = std::max(gap, grants[i] - grants[i - 1]);
    const int serving = c.ServingReplica();
    out.Figure("after the election", absl::StrCat(
        serving < 0 ? std::string("no replica serves") : c.replica_name(serving) + " serves",
        serving == old ? " (kept the prefix)" : " (took over)", "; longest pause in grants ",
        Secs(absl::Nanoseconds(gap))));
  } else {
    auto next = c.AwaitServingReplica(old, absl::Seconds(30));
    if (!next.ok()) return next.status();
    // When it began to serve, by its own record (the harness may notice later).
    auto serving = AwaitServingRecord(h, c.replica_name(*next), fault_at);
    if (!serving.ok()) return serving.status();
    out.Figure("takeover", absl::StrCat(c.replica_name(*next), " serving ",
                                        Secs(absl::Nanoseconds(serving->begin_ns - fault_at)),
                                        " after the fault"));
    if (absl::Status s = WaitUntil([&] { return FirstGrantAfter(h, old_name, fault_at).has_value(); },
                                   absl::Seconds(30), "the first grant by another replica");
        !s.ok()) {
      return s;
    }
    const history::Record first = *FirstGrantAfter(h, old_name, fault_at);
    const absl::Duration failover = absl::Nanoseconds(first.begin_ns - fault_at);
    out.Figure("failover", absl::StrCat(Secs(failover), " from the fault to the first grant by ",
                                        first.process, " (token ", first.token, "; lease on the "
                                        "prefix ", Secs(owner_ttl), ", target TTL + 1 s)"));
  }
  if (fault == HaFault::kEtcdCut) {
    for (const auto& p : proxies) {  // the partition heals
      p->Release(Dir::kToServer);
      p->Release(Dir::kToClient);
    }
  }
  if (deposed) {
    // The old replica saw its ownership deadline pass, refused what it held, gave up its lease
    // and stood by again in the same process, with no supervisor; its last act came before the
    // deadline it held for it (the checker checks every act against it, and against the other
    // replicas).
    const std::string log = absl::StrCat(c.Path("logs/"), old_name, ".log");
    std::string text;
    (void)WaitUntil(
        [&] {
          std::ifstream in(log);
          text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
          return text.find("standing by: etcd prefix", text.find("deposed (")) != std::string::npos;
        },
        absl::Seconds(15), "the deposed replica standing by again");
    const std::optional<int> status = c.replica(old).Wait(absl::ZeroDuration());
    out.Expect(!status.has_value(),
               absl::StrCat(old_name, " ended after losing the prefix instead of standing by again: ",
                            status ? process::DescribeStatus(*status) : ""));
    out.Expect(text.find("standing by again") != std::string::npos &&
                   text.find("standing by: etcd prefix", text.find("deposed (")) != std::string::npos,
               "the deposed replica's log does not say that it was deposed and stands by again: " +
                   log);
    const auto deposed_record = h.Find([&](const history::Record& r) {
      return r.process == old_name && r.event == "lockd-deposed";
    });
    out.Expect(deposed_record.has_value(), "no lockd-deposed record in " + old_name + "'s history");
    if (auto last = LastAct(h, old_name)) {
      int64_t until = 0;
      const std::string margin =
          absl::SimpleAtoi(last->detail, &until)
              ? absl::StrCat(Secs(absl::Nanoseconds(until - last->begin_ns)), " before")
              : absl::StrCat("under \"", last->detail, "\" as");
      out.Figure("deposed replica", absl::StrCat(old_name, " acted last ", margin,
                                                 " its ownership deadline; ",
                                                 status ? process::DescribeStatus(*status)
                                                        : "standing by again"));
    }
  }
  if (fails_over) {
    out.Figure("client pause", absl::StrCat(
                                   Secs(prober.LongestPause(fault_at, history::NowNanos())),
                                   " the longest wait between a prober's grants from the fault on "
                                   "(lease on the prefix ", Secs(owner_ttl), ")"));
  }
  prober.Stop();
  // As a supervisor would: the replica that was killed comes back, as a standby (a deposed one
  // stands by again by itself).
  if (fault != HaFault::kEtcdLeaderKill && fails_over && !deposed) {
    c.replica(old).Wait(absl::Seconds(15));
    if (absl::Status s = c.StartLockd(old); !s.ok()) return s;
  }
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(120)); !s.ok()) return s;
  out.Figure("lost leases (client side)", absl::StrCat(h.Count("lost")));
  holders.Judge(out, fault_at);
  return Finish(c, out, {});
}

// Issue 37: the etcd leader killed again and again (SIGKILL, started again 2 s later), with no
// supervisor for lockd: after each election a replica serves (one that was deposed stands by
// again by itself), payouts are paid once, and no two clients hold one lock at once.
absl::Status Elections(Env& env, Outcome& out) {
  constexpr absl::Duration kInterval = absl::Seconds(8);
  const absl::Duration ttl = env.etcd_owner_ttl > absl::ZeroDuration() ? env.etcd_owner_ttl : kOwnerTtl;
  const int kills = env.elections > 0 ? env.elections : (env.quick ? 3 : 10);
  const int64_t n = BusyPayouts(env);
  auto cluster = StartCluster(env, n, {}, kTtl, [&](ClusterOptions& o) {
    Replicas(env, ttl, o);
  });
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  LongHolders holders(c.lockd_address(), c.Path("history"), env.seed);
  Prober prober(c.lockd_address());
  if (absl::Status s = StartWorkers(c); !s.ok()) return s;
  if (absl::Status s = AwaitSessions(c); !s.ok()) return s;
  std::vector<absl::Duration> pauses;
  int took_over = 0;
  for (int k = 1; k <= kills; ++k) {
    auto leader = c.etcd()->Leader(absl::Seconds(10));
    if (!leader.ok()) return leader.status();
    const int before = c.ServingReplica();
    const int64_t killed_at = history::NowNanos();
    c.etcd()->member(*leader).Signal(SIGKILL);
    c.etcd()->member(*leader).Wait();
    absl::SleepFor(absl::Seconds(2));
    if (absl::Status s = c.etcd()->Restart(*leader); !s.ok()) return s;
    // A replica serves again (the same one, or another after a deposition) and grants.
    auto serving = c.AwaitServingReplica(-1, absl::Seconds(20));
    out.Expect(serving.ok(), absl::StrCat("election ", k, ": no replica served within 20 s"));
    if (!serving.ok()) break;
    absl::SleepFor(kInterval - absl::Nanoseconds(history::NowNanos() - killed_at));
    const absl::Duration pause = prober.LongestPause(killed_at, history::NowNanos());
    pauses.push_back(pause);
    if (*serving != before) ++took_over;
    out.Figure(absl::StrCat("election ", k),
               absl::StrCat("etcd-", *leader, " (leader) killed; ", c.replica_name(*serving),
                            " serves", *serving == before ? "" : " (took over)",
                            "; longest pause between grants ", Secs(pause)));
  }
  // No replica ended: each deposed one stood by again by itself.
  int running = 0;
  for (int i = 0; i < c.replica_count(); ++i) {
    if (!c.replica(i).Wait(absl::ZeroDuration()).has_value()) ++running;
  }
  out.Expect(running == c.replica_count(),
             absl::StrCat(c.replica_count() - running, " lockd replicas ended with no supervisor "
                                                       "to restart them"));
  History h(c.Path("history"));
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(120)); !s.ok()) return s;
  const int64_t depositions = h.Count("lockd-deposed");
  std::sort(pauses.begin(), pauses.end());
  if (!pauses.empty()) {
    out.Figure("pauses", absl::StrCat(pauses.size(), " elections at owner TTL ", Secs(ttl),
                                      ": min ", Secs(pauses.front()), ", median ",
                                      Secs(pauses[pauses.size() / 2]), ", max ",
                                      Secs(pauses.back()), "; ", depositions, " depositions, ",
                                      took_over, " takeovers; ", running, " of ",
                                      c.replica_count(), " replicas running; ", prober.grants(),
                                      " probe grants"));
  }
  prober.Stop();
  holders.Judge(out);
  return Finish(c, out, {});
}

// Issue 37: a slow but live etcd. Every replica reaches each member through a fault proxy that
// holds each chunk of its requests 300 ms, then 700 ms, then 1 s (a phase each) while the
// workers pay, at lockd's default owner TTL (10 s; --etcd-owner-ttl sets another). lockd waits
// for its commits; clients wait for lockd.
absl::Status SlowEtcd(Env& env, Outcome& out) {
  const absl::Duration ttl =
      env.etcd_owner_ttl > absl::ZeroDuration() ? env.etcd_owner_ttl : absl::Seconds(10);
  const absl::Duration phase = env.quick ? absl::Seconds(6) : absl::Seconds(15);
  // One proxy per member, which every replica goes through. Declared before the cluster.
  std::vector<std::unique_ptr<FaultProxy>> proxies;
  // Enough payouts that the workers pay through the phases on this machine (they exit when
  // none is left); the prober tells that grants go on either way.
  auto cluster = StartCluster(env, env.quick ? 100 : 300, {}, kTtl, [&](ClusterOptions& o) {
    Replicas(env, ttl, o);
    o.etcd_route = [&proxies](int, payout::EtcdCluster& etcd) -> absl::StatusOr<std::string> {
      return ProxiedEndpoints(proxies, etcd);
    };
  });
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  LongHolders holders(c.lockd_address(), c.Path("history"), env.seed);
  Prober prober(c.lockd_address());
  if (absl::Status s = StartWorkers(c); !s.ok()) return s;
  if (absl::Status s = AwaitSessions(c); !s.ok()) return s;
  History h(c.Path("history"));
  for (const absl::Duration delay :
       {absl::Milliseconds(300), absl::Milliseconds(700), absl::Seconds(1)}) {
    for (const auto& p : proxies) p->SetDelay(Dir::kToServer, delay);
    const int64_t paid_before = h.Count("paid");
    const int64_t lost_before = h.Count("lost");
    const int64_t granted_before = prober.grants();
    const int64_t from = history::NowNanos();
    absl::SleepFor(phase);
    const int64_t to = history::NowNanos();
    const int64_t paid = h.Count("paid") - paid_before;
    const int64_t granted = prober.grants() - granted_before;
    out.Figure(absl::StrCat("etcd +", absl::FormatDuration(delay)),
               absl::StrCat(Secs(phase), ": ", paid, " paid, ", granted, " probe grants, ",
                            h.Count("lost") - lost_before,
                            " leases lost (client side), longest pause between probe grants ",
                            Secs(prober.LongestPause(from, to))));
    out.Expect(granted > 0, absl::StrCat("nothing was granted with etcd ",
                                         absl::FormatDuration(delay), " late"));
  }
  for (const auto& p : proxies) p->SetDelay(Dir::kToServer, absl::ZeroDuration());
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(120)); !s.ok()) return s;
  const int64_t depositions = h.Count("lockd-deposed");
  out.Figure("depositions", absl::StrCat(depositions, " (owner TTL ", Secs(ttl), ")"));
  out.Expect(ttl < absl::Seconds(10) || depositions == 0,
             absl::StrCat(depositions, " depositions with a slow but live etcd at owner TTL ",
                          Secs(ttl)));
  prober.Stop();
  holders.Judge(out);
  return Finish(c, out, {});
}

// Issue 37: the serving replica's wall clock stepped an hour ahead, then an hour behind
// (libfaketime; its boot-time and monotonic clocks are left alone), each for longer than its
// lease on the prefix, while the workers pay. Its ownership and every lease run on the
// boot-time clock: no deposition, no lease lost.
absl::Status ReplicaClockStep(Env& env, Outcome& out) {
  const std::string offset_file = env.dir + "/lockd-a-wall-clock";
  auto faketime = FaketimeEnvironment(offset_file);
  if (!faketime.ok()) return faketime.status();
  const std::vector<std::string> environment = std::move(*faketime);
  auto cluster = StartCluster(env, BusyPayouts(env), {}, kTtl, [&](ClusterOptions& o) {
    Replicas(env, kOwnerTtl, o);
    o.lockd_environment = [environment](int replica) {
      return replica == 0 ? environment : std::vector<std::string>{};
    };
  });
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  // Grants go on through each step (the prober's); the workers pay as the run begins.
  Prober prober(c.lockd_address());
  if (absl::Status s = StartWorkers(c); !s.ok()) return s;
  if (absl::Status s = AwaitSessions(c); !s.ok()) return s;
  History h(c.Path("history"));
  if (absl::Status s = AwaitPaid(h, 5); !s.ok()) return s;
  const absl::Duration hold = 2 * kOwnerTtl + absl::Milliseconds(env.Uniform(1000, 2000));
  std::string steps;
  for (const char* offset : {"+1h", "-1h"}) {
    const int64_t granted_before = prober.grants();
    const int64_t from = history::NowNanos();
    SetWallClockOffset(offset_file, offset);
    absl::SleepFor(hold);
    const int64_t granted = prober.grants() - granted_before;
    absl::StrAppend(&steps, steps.empty() ? "" : "; ", offset, " for ", Secs(hold), ": ",
                    granted, " probe grants, longest pause ",
                    Secs(prober.LongestPause(from, history::NowNanos())));
    out.Expect(granted > 0, absl::StrCat("nothing was granted with lockd-a's wall clock at ", offset));
  }
  SetWallClockOffset(offset_file, "+0");
  out.Figure("lockd-a's wall clock", steps + "; then back to +0");
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(120)); !s.ok()) return s;
  const int64_t depositions = h.Count("lockd-deposed");
  out.Figure("depositions", absl::StrCat(depositions));
  out.Expect(depositions == 0, "the serving replica was deposed when its wall clock stepped");
  out.Expect(c.ServingReplica() == 0, "lockd-a does not serve after its wall clock stepped");
  out.Figure("lost leases (client side)", absl::StrCat(h.Count("lost")));
  prober.Stop();
  return Finish(c, out, {});
}

// Issue 37: etcd out of space. Every member runs with a small backend quota and someone fills it
// with other keys while the workers pay: etcd raises its NOSPACE alarm and refuses every write.
// The serving replica's next commit is refused, so it is deposed and stands by; no replica
// serves while the alarm is raised, and none exits. After the operator's recovery as etcd's
// documentation gives it (delete, compact, defrag, disarm) a replica serves by itself, every
// payout is paid once, and the checker finds every grant above the ones acknowledged before.
absl::Status EtcdNoSpace(Env& env, Outcome& out) {
  constexpr int64_t kQuota = 8 << 20;
  // Enough payouts that the workers still pay when etcd fills up; the prober acquires all along,
  // so that a commit meets the alarm either way.
  auto cluster = StartCluster(env, env.quick ? 100 : 300, {}, kTtl, [&](ClusterOptions& o) {
    Replicas(env, kOwnerTtl, o);
    o.etcd_extra_args = {absl::StrCat("--quota-backend-bytes=", kQuota)};
  });
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  payout::EtcdCluster& etcd = *c.etcd();
  Prober prober(c.lockd_address());
  if (absl::Status s = StartWorkers(c); !s.ok()) return s;
  if (absl::Status s = AwaitSessions(c); !s.ok()) return s;
  History h(c.Path("history"));
  if (absl::Status s = AwaitPaid(h, env.Uniform(3, 10)); !s.ok()) return s;
  const int64_t paid_before = h.Count("paid");
  // 1 MiB values under another prefix until etcd refuses one.
  const std::string filler = c.Path("filler");
  std::ofstream(filler, std::ios::binary) << std::string(1 << 20, 'x');
  const int64_t filling = history::NowNanos();
  int puts = 0;  // accepted
  std::string refusal;
  for (int i = 0; i < 4 * kQuota / (1 << 20) && refusal.empty(); ++i) {
    auto put = etcd.Ctl({"put", absl::StrCat("/filler/", i)}, filler);
    if (put.ok()) {
      ++puts;
    } else {
      refusal = std::string(put.status().message());
    }
  }
  out.Expect(absl::StrContains(refusal, "database space exceeded"),
             absl::StrCat("etcd did not run out of space after ", puts, " MiB: ", refusal));
  if (!absl::StrContains(refusal, "database space exceeded")) return absl::OkStatus();
  // The serving replica stops at its next commit; nobody serves while the alarm is raised.
  if (absl::Status s = WaitUntil([&] { return c.ServingReplica() < 0; }, absl::Seconds(20),
                                 "the serving replica to stop once etcd was full");
      !s.ok()) {
    return s;
  }
  const absl::Duration stopped = Since(filling);
  const int64_t paid_full = h.Count("paid");
  absl::SleepFor(2 * kOwnerTtl + absl::Seconds(1));
  out.Expect(c.ServingReplica() < 0, "a replica served while etcd's NOSPACE alarm was raised");
  int running = 0;
  std::string said;
  for (int i = 0; i < c.replica_count(); ++i) {
    if (!c.replica(i).Wait(absl::ZeroDuration()).has_value()) ++running;
    std::ifstream log(c.Path("logs/" + c.replica_name(i) + ".log"));
    said.append(std::istreambuf_iterator<char>(log), std::istreambuf_iterator<char>());
  }
  out.Expect(running == c.replica_count(),
             absl::StrCat(c.replica_count() - running, " replicas ended while etcd was full"));
  out.Expect(absl::StrContains(said, "etcd is out of space: its NOSPACE alarm refuses writes"),
             "no replica's log names the NOSPACE alarm and its remedy");
  out.Expect(h.Count("paid") == paid_full,
             absl::StrCat(h.Count("paid") - paid_full, " payouts paid while no replica served"));
  out.Figure("etcd full", absl::StrCat(puts, " MiB put beside lockd's keys, the next refused (quota ",
                                       kQuota >> 20, " MiB) after ", paid_before,
                                       " payouts; no replica served ", Secs(stopped),
                                       " after the filling began; ", h.Count("lockd-deposed"),
                                       " depositions, ", running, " of ", c.replica_count(),
                                       " replicas running"));
  // The operator's recovery.
  if (auto deleted = etcd.Ctl({"del", "--prefix", "/filler/"}); !deleted.ok()) {
    return deleted.status();
  }
  auto status = etcd.Ctl({"endpoint", "status", "--write-out=json"});
  if (!status.ok()) return status.status();
  const size_t at = status->find("\"revision\":");
  int64_t revision = 0;
  if (at == std::string::npos ||
      !absl::SimpleAtoi(status->substr(at + 11, status->find_first_of(",}", at) - at - 11),
                        &revision)) {
    return absl::InternalError("no revision in etcdctl endpoint status: " + *status);
  }
  for (const std::vector<std::string>& step :
       {std::vector<std::string>{"compact", absl::StrCat(revision)}, {"defrag"},
        {"alarm", "disarm"}}) {
    if (auto done = etcd.Ctl(step); !done.ok()) return done.status();
  }
  const int64_t disarmed = history::NowNanos();
  auto serving = c.AwaitServingReplica(-1, absl::Seconds(30));
  if (!serving.ok()) return serving.status();
  out.Figure("recovery", absl::StrCat("compacted at revision ", revision, ", defragmented, "
                                      "alarm disarmed; ", c.replica_name(*serving), " served ",
                                      Secs(Since(disarmed)), " later, by itself"));
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(120)); !s.ok()) return s;
  out.Figure("client pause", absl::StrCat(Secs(prober.LongestPause(filling, history::NowNanos())),
                                          " the longest wait between a prober's grants"));
  prober.Stop();
  return Finish(c, out, {});
}

// A listening socket on 127.0.0.1:`port`, as another program that took the port would hold it;
// closed with the object. ok() is false if the port could not be taken.
class TakenPort {
 public:
  explicit TakenPort(int port) : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    // As servers do (and lockd): the replica's closed connections on the port do not keep it.
    const int one = 1;
    if (fd_ >= 0) setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd_ >= 0 && (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
                     listen(fd_, 1) != 0)) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~TakenPort() {
    if (fd_ >= 0) close(fd_);
  }
  TakenPort(const TakenPort&) = delete;
  TakenPort& operator=(const TakenPort&) = delete;
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Whether replica `i` ended with exit status 1 and a log that names `port` as taken.
bool EndedNamingPort(Cluster& c, int i, int port) {
  const std::optional<int> status = c.replica(i).Wait(absl::Seconds(15));
  std::ifstream in(c.Path("logs/" + c.replica_name(i) + ".log"));
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 1 &&
         absl::StrContains(log, absl::StrCat("cannot listen on tcp 127.0.0.1:", port));
}

// Issue 37: another program holds a replica's port. lockd-b, restarted (as after an upgrade)
// while something else took its port, exits 1 naming the port, and lockd-a serves on. Then
// lockd-a is deposed (cut off from etcd) and finds its port taken when it stands by again: it
// exits 1 naming it, and another replica serves. A supervisor (here the harness) starts
// both again once the ports are free. Payouts are paid once.
absl::Status PortTaken(Env& env, Outcome& out) {
  // lockd-a reaches etcd through fault proxies. Declared before the cluster.
  std::vector<std::unique_ptr<FaultProxy>> proxies;
  // Enough payouts that the workers still pay when lockd-a is deposed.
  auto cluster = StartCluster(env, env.quick ? 100 : 300, {}, kTtl, [&](ClusterOptions& o) {
    Replicas(env, kOwnerTtl, o);
    o.etcd_route = [&proxies](int replica, payout::EtcdCluster& etcd) -> absl::StatusOr<std::string> {
      return replica == 0 ? ProxiedEndpoints(proxies, etcd) : etcd.endpoints();
    };
  });
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  if (absl::Status s = StartWorkers(c); !s.ok()) return s;
  if (absl::Status s = AwaitSessions(c); !s.ok()) return s;
  History h(c.Path("history"));
  if (absl::Status s = AwaitPaid(h, env.Uniform(2, 10)); !s.ok()) return s;
  // A standby restarted onto a taken port.
  const int b_port = c.replica_port(1);
  c.replica(1).Stop();
  {
    TakenPort taken(b_port);
    if (!taken.ok()) return absl::InternalError(absl::StrCat("cannot take port ", b_port));
    absl::Status started = c.StartLockd(1);
    out.Expect(!started.ok() && EndedNamingPort(c, 1, b_port),
               absl::StrCat("lockd-b, started on its taken port ", b_port,
                            ", did not exit 1 naming it: ", started.ToString()));
    out.Expect(c.ServingReplica() == 0, "lockd-a stopped serving when lockd-b could not start");
  }
  if (absl::Status s = c.StartLockd(1); !s.ok()) return s;
  const int64_t paid_b = h.Count("paid");
  // A deposed replica whose port is taken while it stands down: lockd-a, cut off from etcd,
  // loses the prefix when its lease runs out, closes its listener, and tries to give its lease
  // back (which etcd, unreachable, cannot take until the request times out) before it binds
  // the port again as a standby: the harness takes the port in between.
  const int a_port = c.replica_port(0);
  const int64_t cut_at = history::NowNanos();
  for (const auto& p : proxies) {
    p->Set(Dir::kToServer, Mode::kHold);
    p->Set(Dir::kToClient, Mode::kHold);
  }
  if (absl::Status s = WaitUntil([&] { return !std::filesystem::exists(c.Path("lockd-a.port")); },
                                 absl::Seconds(15), "lockd-a to stop serving once cut off");
      !s.ok()) {
    return s;
  }
  std::optional<TakenPort> taken;
  for (const MonoTime give_up = Clock::Real()->Now() + absl::Seconds(10);
       Clock::Real()->Now() < give_up && !c.replica(0).Wait(absl::ZeroDuration()).has_value();) {
    taken.emplace(a_port);
    if (taken->ok()) break;
    taken.reset();
    absl::SleepFor(absl::Microseconds(200));
  }
  if (!taken.has_value()) {
    return absl::InternalError(absl::StrCat(
        "lockd-a stood by on port ", a_port, " again before the harness could take it"));
  }
  for (const auto& p : proxies) {  // the partition heals
    p->Release(Dir::kToServer);
    p->Release(Dir::kToClient);
  }
  out.Expect(EndedNamingPort(c, 0, a_port),
             absl::StrCat("lockd-a, deposed with its port ", a_port,
                          " taken, did not exit 1 naming it; see ", c.Path("logs/lockd-a.log")));
  auto next = c.AwaitServingReplica(0, absl::Seconds(30));
  if (!next.ok()) return next.status();
  out.Figure("port taken", absl::StrCat(
                               "lockd-b restarted onto its taken port ", b_port,
                               ": exit 1 naming it, lockd-a served on (", paid_b,
                               " paid by then); lockd-a cut off from etcd, deposed, its port ", a_port,
                               " taken: exit 1 naming it, ", c.replica_name(*next), " served ",
                               Secs(Since(cut_at)), " after the cut"));
  taken.reset();
  if (absl::Status s = c.StartLockd(0); !s.ok()) return s;  // a standby again
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(120)); !s.ok()) return s;
  return Finish(c, out, {});
}

}  // namespace

std::vector<Scenario> ReplicatedScenarios() {
  return {
      {"ha-lockd-kill", "replicated: the serving lockd is killed; a standby takes over, paid once",
       [](Env& e, Outcome& o) { return Replicated(e, o, HaFault::kLockdKill); }, true},
      {"ha-lockd-freeze",
       "replicated: the serving lockd frozen past its lease wakes, acts no more, stands by again",
       [](Env& e, Outcome& o) { return Replicated(e, o, HaFault::kLockdFreeze); }, true},
      {"ha-etcd-leader-kill", "replicated: the etcd leader is killed; payouts go on",
       [](Env& e, Outcome& o) { return Replicated(e, o, HaFault::kEtcdLeaderKill); }, true},
      {"ha-etcd-cut",
       "replicated: the serving lockd is cut off from etcd; it stops and stands by, another serves",
       [](Env& e, Outcome& o) { return Replicated(e, o, HaFault::kEtcdCut); }, true},
      {"ha-owner-deleted",
       "replicated: the serving lockd's owner key is deleted in etcd; it stops before another serves",
       [](Env& e, Outcome& o) { return Replicated(e, o, HaFault::kOwnerDeleted); }, true},
      {"ha-etcd-elections",
       "replicated, no supervisor: the etcd leader killed again and again; a replica serves after "
       "each",
       Elections, true},
      {"ha-etcd-slow",
       "replicated: etcd answers 300 ms, 700 ms, then 1 s late; payouts go on, nobody deposed",
       SlowEtcd, true},
      {"ha-clock-step",
       "replicated: the serving lockd's wall clock stepped an hour either way: nothing changes",
       ReplicaClockStep, true},
      {"ha-etcd-nospace",
       "replicated: etcd runs out of space; nobody serves until the operator frees it, paid once",
       EtcdNoSpace, true},
      {"ha-port-taken",
       "replicated: a restarted standby and a deposed replica find their ports taken: each exits 1 "
       "naming it",
       PortTaken, true},
      {"ha-etcd-stranger",
       "replicated: a stranger reads etcd and tries what it finds as session secrets: all refused",
       [](Env& e, Outcome& o) { return Replicated(e, o, HaFault::kEtcdStranger); }, true},
  };
}

}  // namespace fencelock::harness
