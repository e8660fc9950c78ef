// The replicated scenarios with longer etcd faults (issue 37, docs/harness.md): the etcd
// leader killed again and again, a slow etcd, the serving replica's wall clock stepped, etcd out
// of space, and replicas whose ports are taken. The parts they share are in replicated.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "clock/clock.h"
#include "replicated.h"

namespace fencelock::harness::replicated {

using payout::Cluster;
using payout::ClusterOptions;
using Dir = FaultProxy::Direction;
using Mode = FaultProxy::Mode;

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

namespace {

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

}  // namespace

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

}  // namespace fencelock::harness::replicated
