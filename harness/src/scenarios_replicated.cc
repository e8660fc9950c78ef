// The replicated scenarios with one fault (issues 16, 33 and 37, docs/harness.md): the serving
// lockd killed, frozen or cut off from etcd, the etcd leader killed, the owner key deleted by
// hand, a stranger reading etcd; while the workers pay and long holders hold. The longer etcd
// faults are in scenarios_etcd_faults.cc, the parts they share in replicated.h.
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "fencelock/wire.pb.h"
#include "net/blocking_connection.h"
#include "process/history.h"
#include "protocol/requests.h"
#include "replicated.h"

namespace fencelock::harness {
namespace replicated {
namespace {

using payout::Cluster;
using payout::ClusterOptions;
using Dir = FaultProxy::Direction;
using Mode = FaultProxy::Mode;
namespace req = protocol::request;

// A run at its fault: the parts that make the fault and judge what followed.
struct Faulted {
  Cluster& c;
  History& h;
  Outcome& out;
  int old;               // the replica that served when the fault came
  std::string old_name;  // and its name
  int64_t fault_at;      // when, on the history's clock

  absl::Status DeleteOwnerKey();
  absl::Status TrySecretsFromEtcd();
  void JudgeElection();
  absl::Status JudgeTakeover(absl::Duration owner_ttl);
  void JudgeDeposed();
};

// As an operator (or an attacker) with etcdctl would: the serving replica's key goes, while
// its lease on etcd lives on. The payout workers are stopped meanwhile, so that no commit of
// theirs makes the serving replica notice (as in issue 33's finding, where only renewals and
// confirmations reached it); from the harness, a resource confirms a held token with it
// (Validate) every 10 ms until it refuses. No confirmation may come after another replica
// began to serve.
absl::Status Faulted::DeleteOwnerKey() {
  for (const char* w : {"w1", "w2", "w3"}) {
    if (process::Child* worker = c.worker(w)) worker->Signal(SIGSTOP);
  }
  auto conn = net::BlockingConnection::Connect(net::BlockingConnectionOptions{
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
  return absl::OkStatus();
}

// A stranger who can read etcd takes every candidate secret in it and tries each on every
// session lockd lists: none may resume one.
absl::Status Faulted::TrySecretsFromEtcd() {
  auto dump = c.etcd()->Ctl({"get", "--prefix", c.etcd_prefix()});
  if (!dump.ok()) return dump.status();
  const std::set<std::string> candidates = SecretCandidates(*dump);
  auto conn = net::BlockingConnection::Connect(net::BlockingConnectionOptions{
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
  return absl::OkStatus();
}

// After the etcd leader was killed: etcd elects a new leader among the other two; whether the
// serving replica kept the prefix depends on how long that took against its own lease.
void Faulted::JudgeElection() {
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
}

// Another replica serves after the fault: when, by its own record, and its first grant.
absl::Status Faulted::JudgeTakeover(absl::Duration owner_ttl) {
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
  return absl::OkStatus();
}

// The old replica saw its ownership deadline pass, refused what it held, gave up its lease and
// stood by again in the same process, with no supervisor; its last act came before the
// deadline it held for it (the checker checks every act against it, and against the other
// replicas).
void Faulted::JudgeDeposed() {
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

}  // namespace

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
  Faulted faulted{c, h, out, old, old_name, fault_at};
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
    case HaFault::kOwnerDeleted:
      if (absl::Status s = faulted.DeleteOwnerKey(); !s.ok()) return s;
      what = absl::StrCat(c.etcd_prefix(), "/owner deleted with etcdctl while ", old_name,
                          " served");
      deposed = true;
      break;
    case HaFault::kEtcdStranger:
      if (absl::Status s = faulted.TrySecretsFromEtcd(); !s.ok()) return s;
      what = "a stranger read etcd and tried what it found as session secrets";
      fails_over = false;
      break;
  }
  out.Figure("fault", absl::StrCat(what, " after ", paid_before, " payouts"));
  // Payouts go on: the workers finish whichever replica serves.
  if (fault == HaFault::kEtcdStranger) {
    if (absl::Status s = AwaitPaid(h, std::min(n, paid_before + 5)); !s.ok()) return s;
  } else if (fault == HaFault::kEtcdLeaderKill) {
    if (absl::Status s = AwaitPaid(h, paid_before + 5); !s.ok()) return s;
    faulted.JudgeElection();
  } else if (absl::Status s = faulted.JudgeTakeover(owner_ttl); !s.ok()) {
    return s;
  }
  if (fault == HaFault::kEtcdCut) {
    for (const auto& p : proxies) {  // the partition heals
      p->Release(Dir::kToServer);
      p->Release(Dir::kToClient);
    }
  }
  if (deposed) faulted.JudgeDeposed();
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

}  // namespace replicated

std::vector<Scenario> ReplicatedScenarios() {
  using replicated::HaFault;
  using replicated::Replicated;
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
       replicated::Elections, true},
      {"ha-etcd-slow",
       "replicated: etcd answers 300 ms, 700 ms, then 1 s late; payouts go on, nobody deposed",
       replicated::SlowEtcd, true},
      {"ha-clock-step",
       "replicated: the serving lockd's wall clock stepped an hour either way: nothing changes",
       replicated::ReplicaClockStep, true},
      {"ha-etcd-nospace",
       "replicated: etcd runs out of space; nobody serves until the operator frees it, paid once",
       replicated::EtcdNoSpace, true},
      {"ha-port-taken",
       "replicated: a restarted standby and a deposed replica find their ports taken: each exits 1 "
       "naming it",
       replicated::PortTaken, true},
      {"ha-etcd-stranger",
       "replicated: a stranger reads etcd and tries what it finds as session secrets: all refused",
       [](Env& e, Outcome& o) { return Replicated(e, o, HaFault::kEtcdStranger); }, true},
  };
}

}  // namespace fencelock::harness
