#include <signal.h>
#include <sys/wait.h>

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
#include "harness/fault_proxy.h"
#include "harness/stalled_renewal.h"
#include "scenario.h"
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

// Every scenario's processes use these. The usable lease, 4 s x 0.7 = 2.8 s, covers a rail
// submit's worst case, 300 ms + 2 s (D4), with room for the heartbeat.
constexpr absl::Duration kTtl = absl::Seconds(4);
constexpr double kMargin = defaults::kSafetyMargin;  // the contract's margin
constexpr absl::Duration kRailReadTimeout = absl::Milliseconds(300);

std::string Secs(absl::Duration d) { return absl::StrFormat("%.2f s", absl::ToDoubleSeconds(d)); }
absl::Duration Since(int64_t ns) { return absl::Nanoseconds(history::NowNanos() - ns); }

// Starts lockd and the rail with the scenario settings and loads `payouts` payouts. Workers
// get `worker_environment` ("NAME=value") on top of the harness's environment.
absl::StatusOr<std::unique_ptr<Cluster>> StartCluster(
    Env& env, int64_t payouts, std::vector<std::string> worker_environment = {},
    absl::Duration ttl = kTtl, const std::function<void(ClusterOptions&)>& adjust = nullptr) {
  ClusterOptions options{.dir = env.dir,
                         .lockd_binary = env.binaries.lockd,
                         .rail_binary = env.binaries.rail,
                         .worker_binary = env.binaries.worker,
                         .rail_latency = absl::Milliseconds(10),
                         .rail_jitter = absl::Milliseconds(10),
                         .rail_read_timeout = kRailReadTimeout,
                         .rail_seed = env.seed,
                         .session_ttl = ttl,
                         .lock_ttl = ttl,
                         .margin = kMargin,
                         .history = true,
                         .worker_environment = std::move(worker_environment),
                         .tls_dir = env.tls_dir};
  if (adjust) adjust(options);
  auto cluster = Cluster::Start(std::move(options));
  if (!cluster.ok()) return cluster.status();
  if (payouts == 0) return cluster;
  if (absl::Status s = (*cluster)->Load(payouts, 1000); !s.ok()) return s;
  return cluster;
}

// Starts w1, w2 and w3, reaching lockd at `via` (empty: directly).
absl::Status StartWorkers(Cluster& c, const std::string& via = "") {
  for (const char* name : {"w1", "w2", "w3"}) {
    if (auto w = c.StartWorker(name, {}, via); !w.ok()) return w.status();
  }
  return absl::OkStatus();
}

// Payouts loaded by the scenarios that fault lockd or the network under load.
int64_t BusyPayouts(const Env& env) { return env.quick ? 30 : 80; }

// A cluster with `payouts` payouts that w1, w2 and w3 are already paying through lockd.
absl::StatusOr<std::unique_ptr<Cluster>> StartPaying(Env& env, int64_t payouts,
                                                      absl::Duration ttl = kTtl) {
  auto cluster = StartCluster(env, payouts, {}, ttl);
  if (!cluster.ok()) return cluster;
  if (absl::Status s = StartWorkers(**cluster); !s.ok()) return s;
  return cluster;
}

// Follows every history file of the run as the processes append to them.
class History {
 public:
  explicit History(std::string dir) : dir_(std::move(dir)) {}
  void Poll() {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string path = entry.path().string();
      if (tails_.count(path) == 0) tails_.emplace(path, payout::LineTail(path));
    }
    for (auto& [path, tail] : tails_) {
      for (const std::string& line : tail.Poll()) {
        if (auto r = history::Parse(line); r.ok()) {
          ++counts_[r->event];
          records_.push_back(std::move(*r));
        }
      }
    }
  }
  std::optional<history::Record> Find(const std::function<bool(const history::Record&)>& match) {
    Poll();
    for (const auto& r : records_) {
      if (match(r)) return r;
    }
    return std::nullopt;
  }
  int64_t Count(const std::string& event) {
    Poll();
    auto it = counts_.find(event);
    return it == counts_.end() ? 0 : it->second;
  }

 private:
  std::string dir_;
  std::map<std::string, payout::LineTail> tails_;
  std::vector<history::Record> records_;
  std::map<std::string, int64_t> counts_;  // records_ per event
};

// Polls `done` every 5 ms until it holds or `timeout` passes.
absl::Status WaitUntil(const std::function<bool()>& done, absl::Duration timeout,
                       const std::string& what) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("gave up after ", absl::FormatDuration(timeout), " waiting for ", what));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::OkStatus();
}

// Waits until `count` payouts have been paid (by anyone), for a fault in the middle of the run.
absl::Status AwaitPaid(History& h, int64_t count) {
  return WaitUntil([&] { return h.Count("paid") >= count; }, absl::Seconds(60),
                   absl::StrCat(count, " payouts to be paid"));
}

// Waits until each started worker has opened its lockd session, so that faults meet work in
// progress. (A worker that cannot reach lockd at startup keeps trying; that is tested in
// worker_connect_test.)
absl::Status AwaitSessions(Cluster& c) {
  std::map<std::string, payout::LineTail> waiting;  // worker → its log, read as it grows
  for (const std::string& name : c.worker_names()) {
    waiting.emplace(name, payout::LineTail(c.Path("logs/" + name + ".log")));
  }
  return WaitUntil(
      [&] {
        for (auto it = waiting.begin(); it != waiting.end();) {
          bool started = false;
          for (const std::string& line : it->second.Poll()) {
            started = started || line.starts_with(it->first + " started session");
          }
          it = started ? waiting.erase(it) : std::next(it);
        }
        return waiting.empty();
      },
      absl::Seconds(60), "every worker to open its lockd session");
}

// Waits for every worker not in `killed` to exit; each must exit 0 (nothing left unpaid).
absl::Status WaitWorkers(Cluster& cluster, Outcome& out, absl::Duration timeout,
                         const std::set<std::string>& killed = {}) {
  const absl::Time give_up = absl::Now() + timeout;
  for (const std::string& name : cluster.worker_names()) {
    if (killed.count(name) > 0) continue;
    auto status = cluster.worker(name)->Wait(std::max(give_up - absl::Now(), absl::ZeroDuration()));
    if (!status.has_value()) {
      return absl::DeadlineExceededError(absl::StrCat(
          name, " still running after ", absl::FormatDuration(timeout), ": payouts left unpaid?"));
    }
    out.Expect(*status == 0, absl::StrCat(name, " ", process::DescribeStatus(*status), "; see ",
                                          cluster.Path("logs/" + name + ".log")));
  }
  return absl::OkStatus();
}

struct Expectations {
  bool fences_quiet = true;       // lock_fenced_out_total and rail_fenced_out_total are zero
  bool expect_overlap = false;    // the client check is off: a client-believed overlap is due
  int64_t max_abandoned = -1;     // at most this many payouts abandoned; -1: any number
};

// Reconciles the ledger against the store, runs the history checker, and judges the run.
absl::Status Finish(Cluster& cluster, Outcome& out, const Expectations& expect) {
  auto r = cluster.Reconcile();
  if (!r.ok()) return r.status();
  auto check = CheckDirectory(cluster.Path("history"));
  if (!check.ok()) return check.status();
  out.check = *check;
  int64_t abandoned = 0;
  for (const auto& [reason, n] : r->abandoned) abandoned += n;
  out.Figure("payouts", absl::StrCat(r->payouts));
  out.Figure("paid exactly once", absl::StrCat(r->paid_once));
  out.Figure("lock_fenced_out_total", absl::StrCat(r->lock_fenced_out));
  out.Figure("rail_duplicate_attempted_total", absl::StrCat(r->rail_duplicates));
  out.Figure("rail_fenced_out_total", absl::StrCat(r->rail_fenced_out));
  out.Figure("abandoned", absl::StrCat(abandoned));
  out.Figure("history", absl::StrCat(check->records, " records, ", check->grants, " grants, ",
                                     check->fence_decisions, " fence decisions, ",
                                     check->lockd_acts > 0
                                         ? absl::StrCat(check->lockd_acts, " lockd acts, ")
                                         : std::string(),
                                     check->violations.size(), " violations, ",
                                     check->client_overlaps.size(), " client overlaps"));
  out.Expect(r->paid_twice == 0, absl::StrCat(r->paid_twice, " payouts paid twice"));
  out.Expect(expect.max_abandoned < 0 || abandoned <= expect.max_abandoned,
             absl::StrCat(abandoned, " payouts abandoned; at most ", expect.max_abandoned,
                          " were expected"));
  out.Expect(r->left == 0 && r->paid_once == r->payouts,
             absl::StrCat(r->left, " payouts left unpaid"));
  out.Expect(r->rail_duplicates == 0,
             absl::StrCat("rail_duplicate_attempted_total is ", r->rail_duplicates));
  for (const std::string& v : check->violations) out.failures.push_back("history: " + v);
  if (expect.fences_quiet) {
    out.Expect(r->lock_fenced_out == 0,
               absl::StrCat("lock_fenced_out_total is ", r->lock_fenced_out, "; see ",
                            cluster.Path("logs/lockd.log")));
    out.Expect(r->rail_fenced_out == 0,
               absl::StrCat("rail_fenced_out_total is ", r->rail_fenced_out));
  }
  if (expect.expect_overlap) {
    out.Expect(!check->client_overlaps.empty(),
               "no client-believed overlap although the client check was off");
  } else {
    for (const std::string& o : check->client_overlaps) {
      out.failures.push_back("client-believed overlap with the client check on: " + o);
    }
  }
  return absl::OkStatus();
}

bool OtherThan(const history::Record& r, const std::string& process) {
  return r.process != process && r.process != "rail";
}

// Starts w1 with `args` and --pause-before-submit=<id>, and waits until it has stopped
// itself right before the submit of payout <id>, holding its lock. Returns the "paused" record.
absl::StatusOr<history::Record> StartPausedHolder(Cluster& c, History& h, int64_t id,
                                                  std::vector<std::string> args,
                                                  process::Child** w1) {
  args.push_back(absl::StrCat("--pause-before-submit=", id));
  auto started = c.StartWorker("w1", args);
  if (!started.ok()) return started.status();
  *w1 = *started;
  std::optional<history::Record> paused;
  absl::Status s = WaitUntil(
      [&] {
        paused = h.Find([&](const auto& r) { return r.process == "w1" && r.event == "paused"; });
        return paused.has_value() && (*w1)->stopped();
      },
      absl::Seconds(60), "w1 to stop itself before submitting " + PayoutKey(id));
  if (!s.ok()) return s;
  return *paused;
}

// Starts w2 and w3 and waits until one of them records `event` for `key`.
absl::StatusOr<history::Record> TakeOver(Cluster& c, History& h, const std::string& event,
                                         const std::string& key) {
  for (const char* name : {"w2", "w3"}) {
    if (auto w = c.StartWorker(name); !w.ok()) return w.status();
  }
  std::optional<history::Record> found;
  absl::Status s = WaitUntil(
      [&] {
        found = h.Find([&](const auto& r) {
          return OtherThan(r, "w1") && r.event == event && r.key == key;
        });
        return found.has_value();
      },
      4 * kTtl + absl::Seconds(30), absl::StrCat("another worker's \"", event, "\" of ", key));
  if (!s.ok()) return s;
  return *found;
}

// UC-03: w1 stops itself right before its irreversible step of payout P and stays frozen until
// another worker has taken P over under a higher token and paid it; then it resumes.
absl::Status Uc03(Env& env, Outcome& out, bool client_check) {
  const int64_t n = env.quick ? 12 : 40;
  auto cluster = StartCluster(env, n);
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  const int64_t p = env.Uniform(1, n);
  const std::string key = PayoutKey(p);
  History h(c.Path("history"));
  std::vector<std::string> args;
  if (!client_check) args.push_back("--skip-client-checks");
  process::Child* w1 = nullptr;
  auto paused = StartPausedHolder(c, h, p, args, &w1);
  if (!paused.ok()) return paused.status();
  out.Figure("frozen payout", absl::StrCat(key, " under token ", paused->token));
  auto taken = TakeOver(c, h, "paid", key);
  if (!taken.ok()) return taken.status();
  // Past the lease by a margin, however quickly the takeover came.
  while (Since(paused->end_ns) < kTtl + absl::Milliseconds(500)) absl::SleepFor(absl::Milliseconds(5));
  const absl::Duration frozen = Since(paused->end_ns);
  w1->Signal(SIGCONT);
  out.Figure("takeover", absl::StrCat(taken->process, " paid it under token ", taken->token));
  out.Figure("w1 frozen for", absl::StrCat(Secs(frozen), " (lock TTL ", Secs(kTtl), ")"));
  out.Expect(frozen > kTtl, "w1 was not frozen longer than the lock TTL");
  out.Expect(taken->token > paused->token, "the takeover's token is not higher");
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(60)); !s.ok()) return s;
  // What w1 did after it woke up.
  auto stale_step = h.Find([&](const auto& r) {
    return r.process == "w1" && r.key == key && r.event == "step-started" && r.token == paused->token;
  });
  auto fenced = h.Find([&](const auto& r) {
    return r.process == "w1" && r.key == key && r.event == "fenced" && r.token == paused->token;
  });
  auto lost = h.Find([&](const auto& r) {
    return r.process == "w1" && r.key == key && r.event == "lost" && r.token == paused->token;
  });
  if (client_check) {
    out.Figure("w1 after waking", lost ? "abandoned before the submit: " + lost->detail : "(no loss recorded)");
    out.Expect(lost.has_value() && !stale_step.has_value(),
               "w1 did not abandon before its submit after waking");
  } else {
    out.Figure("w1 after waking", fenced ? "submitted; refused by the " + fenced->detail : "(not fenced)");
    out.Expect(stale_step.has_value(), "w1 did not attempt the submit with the client check off");
    out.Expect(fenced.has_value(), "no fence refused w1's stale submit");
  }
  if (absl::Status s = Finish(c, out, {.fences_quiet = client_check, .expect_overlap = !client_check});
      !s.ok()) {
    return s;
  }
  if (!client_check) {
    // The stale submit must show in a fence's counter: lockd's or the rail's.
    int64_t shown = 0;
    for (const auto& [name, value] : out.figures) {
      if (name == "lock_fenced_out_total" || name == "rail_fenced_out_total") shown += std::stoll(value);
    }
    out.Expect(shown >= 1, "neither lock_fenced_out_total nor rail_fenced_out_total counted the stale submit");
  }
  return absl::OkStatus();
}

// UC-04: a holder dies (SIGKILL) in the middle of a payout; how long until another worker holds
// the lock, against the session TTL.
absl::Status Uc04(Env& env, Outcome& out) {
  const int64_t n = env.quick ? 12 : 40;
  auto cluster = StartCluster(env, n);
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  const int64_t p = env.Uniform(1, n);
  const std::string key = PayoutKey(p);
  History h(c.Path("history"));
  process::Child* w1 = nullptr;
  auto held = StartPausedHolder(c, h, p, {}, &w1);
  if (!held.ok()) return held.status();
  w1->Signal(SIGKILL);
  w1->Wait();
  const int64_t killed_at = history::NowNanos();
  auto next = TakeOver(c, h, "acquire", key);
  if (!next.ok()) return next.status();
  const absl::Duration recovery = absl::Nanoseconds(next->end_ns - killed_at);
  out.Figure("killed holder", absl::StrCat("w1 holding ", key, " under token ", held->token));
  out.Figure("recovery latency", absl::StrCat(Secs(recovery), " until ", next->process,
                                              " held it (token ", next->token, ")"));
  out.Figure("session TTL", absl::StrCat(Secs(kTtl), "; recovery / TTL = ",
                                         absl::StrFormat("%.2f", absl::FDivDuration(recovery, kTtl))));
  // A protocol bound, not a speed target: lockd must free the lock once the dead holder's lease
  // runs out, so recovery cannot take several TTLs.
  out.Expect(recovery < 3 * kTtl, "the lock was not free within 3 TTLs of the holder's death");
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(60), {"w1"}); !s.ok()) return s;
  return Finish(c, out, {});
}

// A proxy between a client and lockd holds the KeepAlive's reply for 2 s. The client's new
// deadline must be measured from when it sent the KeepAlive, not from the late reply.
absl::Status StalledReply(Env& env, Outcome& out) {
  auto cluster = StartCluster(env, 0);
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  FaultProxy proxy(c.lockd_port());
  auto probe_history = history::Writer::Open(c.HistoryPath("probe"), "probe");
  if (!probe_history.ok()) return probe_history.status();
  const absl::Duration ttl = absl::Seconds(10);
  const absl::Duration stall = absl::Seconds(2);
  ClientOptions options;
  options.server = absl::StrCat("127.0.0.1:", proxy.port());
  options.session_ttl = ttl;
  options.default_lock_ttl = ttl;
  options.safety_margin = kMargin;
  options.heartbeat_interval = absl::Hours(1);  // only the renewal below
  options.client_name = "harness probe";
  auto client = Client::Create(options);
  if (!client.ok()) return client.status();
  const int64_t sent = history::NowNanos();
  auto lock = (*client)->acquire("stall/probe", absl::Seconds(5));
  if (!lock.ok()) return lock.status();
  (*probe_history)->Append(sent, "acquire", "stall/probe", lock->token());

  auto stalled = RenewThroughStall(proxy, **client, *lock, stall);
  if (!stalled.ok()) return stalled.status();
  const MonoTime seen_by_proxy = stalled->seen_by_proxy, reply_at = stalled->reply_at;
  const MonoTime deadline = stalled->deadline;
  const absl::Duration usable = ttl * (1 - kMargin);
  const absl::Duration past_send = deadline - (seen_by_proxy + usable);
  out.Figure("reply held", Secs(reply_at - seen_by_proxy));
  out.Figure("deadline vs send + usable lease",
             absl::StrCat(absl::StrFormat("%+.1f ms", absl::ToDoubleMilliseconds(past_send)),
                          " (measured from the reply it would be about +", Secs(stall), ")"));
  out.Expect(past_send <= absl::ZeroDuration(),
             absl::StrCat("the deadline is ", absl::FormatDuration(past_send),
                          " later than send + usable lease: measured from the reply"));
  out.Expect(reply_at - seen_by_proxy >= stall, "the proxy did not hold the reply for 2 s");
  if (absl::Status s = (*client)->release(*lock); !s.ok()) return s;
  (*probe_history)->Append(history::NowNanos(), "released", "stall/probe", lock->token());
  client->reset();
  return Finish(c, out, {});
}

// w1, w2 and w3 pay `n` payouts with `ttl`; after a fifth are paid, lockd is stopped (SIGSTOP)
// for `stop` and resumed. The run is judged by `expect` once the workers are done.
absl::Status StopLockdWhilePaying(Env& env, Outcome& out, int64_t n, absl::Duration ttl,
                                  absl::Duration stop, const Expectations& expect) {
  auto cluster = StartPaying(env, n, ttl);
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  History h(c.Path("history"));
  if (absl::Status s = AwaitPaid(h, n / 5); !s.ok()) return s;
  const int64_t paid_before = h.Count("paid");
  c.lockd().Signal(SIGSTOP);
  absl::SleepFor(stop);
  c.lockd().Signal(SIGCONT);
  out.Figure("lockd stopped", absl::StrCat(Secs(stop), " (TTL ", Secs(ttl), ") after ",
                                           paid_before, " payouts"));
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(90)); !s.ok()) return s;
  out.Figure("lost leases (client side)", absl::StrCat(h.Count("lost")));
  return Finish(c, out, expect);
}

// Workers pay while lockd is frozen (SIGSTOP) past the TTL and resumed.
absl::Status ServerFreeze(Env& env, Outcome& out) {
  const absl::Duration freeze = kTtl + absl::Milliseconds(env.Uniform(500, 2000));
  return StopLockdWhilePaying(env, out, BusyPayouts(env), kTtl, freeze, {});
}

// lockd is killed (SIGKILL) while workers pay, and restarted from its state directory.
absl::Status ServerCrash(Env& env, Outcome& out) {
  const int64_t n = BusyPayouts(env);
  auto cluster = StartPaying(env, n);
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  History h(c.Path("history"));
  const int64_t at = env.Uniform(n / 8, n / 2);
  if (absl::Status s = AwaitPaid(h, at); !s.ok()) return s;
  const int64_t paid_before = h.Count("paid");
  c.lockd().Signal(SIGKILL);
  c.lockd().Wait();
  const absl::Time down = absl::Now();
  if (absl::Status s = c.StartLockd(); !s.ok()) return s;
  out.Figure("lockd killed", absl::StrCat("after ", paid_before, " payouts; restarted from its state in ",
                                          Secs(absl::Now() - down)));
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(90)); !s.ok()) return s;
  return Finish(c, out, {});
}

// Workers reach lockd through a proxy that, on a schedule drawn from the seed, delays, holds,
// drops and cuts their connections in both directions.
absl::Status Network(Env& env, Outcome& out) {
  auto cluster = StartCluster(env, BusyPayouts(env));
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  FaultProxy proxy(c.lockd_port());
  const std::string via = absl::StrCat("127.0.0.1:", proxy.port());
  if (absl::Status s = StartWorkers(c, via); !s.ok()) return s;
  if (absl::Status s = AwaitSessions(c); !s.ok()) return s;
  const int episodes = env.quick ? 4 : 8;
  std::string schedule;
  for (int i = 0; i < episodes; ++i) {
    absl::SleepFor(absl::Milliseconds(env.Uniform(200, 800)));
    const Dir dir = env.Uniform(0, 1) == 0 ? Dir::kToServer : Dir::kToClient;
    const char* dir_name = dir == Dir::kToServer ? "to lockd" : "to workers";
    const absl::Duration length = absl::Milliseconds(env.Uniform(200, 1000));
    std::string what;
    switch (env.Uniform(0, 3)) {
      case 0: {
        const absl::Duration delay = absl::Milliseconds(env.Uniform(20, 300));
        proxy.SetDelay(dir, delay);
        absl::SleepFor(length);
        proxy.SetDelay(dir, absl::ZeroDuration());
        what = absl::StrCat("delay ", absl::FormatDuration(delay), " ", dir_name, " for ",
                            absl::FormatDuration(length));
        break;
      }
      case 1:
        proxy.Set(dir, Mode::kHold);
        absl::SleepFor(length);
        proxy.Release(dir);
        what = absl::StrCat("hold ", dir_name, " for ", absl::FormatDuration(length));
        break;
      case 2:
        proxy.Set(dir, Mode::kDrop);
        absl::SleepFor(length);
        proxy.CutAll();
        proxy.Set(dir, Mode::kPass);
        what = absl::StrCat("drop ", dir_name, " for ", absl::FormatDuration(length), ", then cut");
        break;
      default:
        proxy.CutAll();
        what = "cut every connection";
        break;
    }
    absl::StrAppend(&schedule, schedule.empty() ? "" : "; ", what);
  }
  out.Figure("faults", schedule);
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(90)); !s.ok()) return s;
  return Finish(c, out, {});
}

// The environment that runs a process under libfaketime, its wall clock offset by what
// `offset_file` holds (reread every second); its monotonic and boot-time clocks untouched.
std::vector<std::string> FaketimeEnvironment(const std::string& offset_file) {
  std::vector<std::string> environment = {
      absl::StrCat("LD_PRELOAD=", LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE=" + offset_file,
      "FAKETIME_CACHE_DURATION=1", "FAKETIME_DONT_FAKE_MONOTONIC=1"};
  // In an AddressSanitizer build the preloaded library comes before ASan's runtime, which ASan
  // refuses unless told that the order is on purpose.
  const char* asan = std::getenv("ASAN_OPTIONS");
  environment.push_back(absl::StrCat("ASAN_OPTIONS=", asan != nullptr ? asan : "",
                                     asan != nullptr && *asan != '\0' ? ":" : "",
                                     "verify_asan_link_order=0"));
  return environment;
}

// Workers pay while their wall clocks are stepped an hour ahead, then an hour behind, then
// back (libfaketime, which rereads its offset from a file each second; their monotonic and
// boot-time clocks are left alone). Each step lasts longer than a lease: a heartbeat that
// stopped would lose every lock, one that flooded would show in lockd's load, and either would
// leave leases lost (issue 13, finding 2).
absl::Status ClockStep(Env& env, Outcome& out) {
  const std::string libfaketime = LIBFAKETIME;
  if (libfaketime.empty() || !std::filesystem::exists(libfaketime)) {
    return absl::FailedPreconditionError(
        "libfaketime not found: install the Debian package faketime (scripts/test.sh does)");
  }
  const std::string offset_file = env.dir + "/worker-wall-clock";
  auto set_offset = [&](const std::string& offset) {
    std::ofstream(offset_file, std::ios::trunc) << offset << "\n";
  };
  set_offset("+0");
  // Payouts are loaded as the run goes, so that three workers are paying through every step
  // on a fast machine or a slow one (a worker exits once nothing is left to pay).
  const int64_t per_step = env.quick ? 800 : 1600;
  auto cluster = StartCluster(env, per_step, FaketimeEnvironment(offset_file));
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  if (absl::Status s = StartWorkers(c); !s.ok()) return s;
  if (absl::Status s = AwaitSessions(c); !s.ok()) return s;
  History h(c.Path("history"));
  if (absl::Status s = AwaitPaid(h, 20); !s.ok()) return s;
  const absl::Duration hold = kTtl + absl::Milliseconds(env.Uniform(1000, 2000));
  std::string steps;
  for (const char* offset : {"+1h", "-1h"}) {
    if (absl::Status s = c.Load(per_step, 1000); !s.ok()) return s;
    const int64_t paid_before = h.Count("paid");
    set_offset(offset);
    absl::SleepFor(hold);
    const int64_t paid = h.Count("paid") - paid_before;
    absl::StrAppend(&steps, steps.empty() ? "" : "; ", offset, " for ", Secs(hold), ": ", paid,
                    " paid");
    out.Expect(paid > 0, absl::StrCat("no payout was paid with the wall clock at ", offset,
                                      ": the workers stalled"));
  }
  set_offset("+0");
  out.Figure("worker wall clock", steps + "; then back to +0");
  if (absl::Status s = WaitWorkers(c, out, absl::Seconds(120)); !s.ok()) return s;
  // Leases lost to time, not a step refused for want of lease (kInsufficientLease).
  std::optional<history::Record> lost = h.Find([](const history::Record& r) {
    return r.event == "lost" && r.detail != "insufficient_lease";
  });
  out.Figure("lost leases (client side)", absl::StrCat(h.Count("lost")));
  out.Expect(!lost.has_value(),
             lost ? absl::StrCat(lost->process, " lost the lease of ", lost->key, " (",
                                 lost->detail, ") while its wall clock was stepped")
                  : "");
  return Finish(c, out, {});
}

// lockd stopped (SIGSTOP) for 3 s, shorter than the workers' usable lease (5 s TTL, as the
// demo's), while they pay. Their leases then have too little left for a submit; each acquire
// after lockd returns must renew first rather than claim a payout and abandon it.
absl::Status ServerPause(Env& env, Outcome& out) {
  // A payout whose lock was taken just before lockd stopped may rightly be abandoned (one per
  // worker at most); a storm of them after it returned is the fault this scenario is about.
  return StopLockdWhilePaying(env, out, BusyPayouts(env) * 2, absl::Seconds(5),
                              absl::Seconds(3), {.max_abandoned = 3});
}

// A misbehaving client beside the payout workers: it pipelines listings and never reads the
// replies, floods cheap listings, presents tokens it never held, and holds idle connections.
// lockd must keep serving the workers: every payout paid once, no worker lease lost, and the
// must-be-zero fence counters stay zero (a stranger's tokens are not a holder's).
// StartPaying with BusyPayouts(env) payouts, once every worker has opened its session.
absl::StatusOr<std::unique_ptr<Cluster>> StartPayingWithSessions(Env& env) {
  auto cluster = StartPaying(env, BusyPayouts(env));
  if (!cluster.ok()) return cluster.status();
  if (absl::Status s = AwaitSessions(**cluster); !s.ok()) return s;
  return cluster;
}

// The workers noticed nothing of what ran `beside` them: no lease lost.
void ExpectNoLeaseLost(History& h, Outcome& out, const std::string& beside) {
  out.Figure("lost leases (client side)", absl::StrCat(h.Count("lost")));
  out.Expect(h.Count("lost") == 0, absl::StrCat(h.Count("lost"), " worker leases lost ", beside));
}

absl::Status NoisyNeighbour(Env& env, Outcome& out) {
  auto cluster = StartPayingWithSessions(env);
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  History h(c.Path("history"));
  const server::BlockingConnectionOptions options{.server = c.lockd_address(),
                                                  .timeout = absl::Seconds(1),
                                                  .client_name = "noisy-neighbour",
                                                  .tls = c.lockd_tls()};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> listings{0}, foreign{0}, unread{0};
  std::vector<std::unique_ptr<server::BlockingConnection>> idle;
  for (int i = 0; i < 50; ++i) {  // said Hello, then nothing
    auto conn = server::BlockingConnection::Connect(options);
    if (conn.ok()) idle.push_back(std::move(*conn));
  }
  std::thread slow_reader([&] {
    // Sends until lockd stops reading it, then never reads: lockd holds it back and closes it.
    auto conn = server::BlockingConnection::Connect(options);
    if (!conn.ok()) return;
    const wire::Request listing = req::ListLocks({.start_after = std::string(1000, 'a')});
    while (!stop && (*conn)->Send(listing).ok()) ++unread;
    while (!stop) absl::SleepFor(absl::Milliseconds(50));
  });
  std::thread flooder([&] {
    // Cheap listings back to back, and KeepAlives naming 1,000 tokens it never held.
    auto conn = server::BlockingConnection::Connect(options);
    if (!conn.ok()) return;
    auto session = (*conn)->Call(req::OpenSession(absl::Minutes(1)));
    if (!session.ok()) return;
    wire::Request ka = req::KeepAlive(session->open_session().session_id());
    for (int t = 1; t <= 1000; ++t) {
      req::AddLock(ka, absl::StrCat("payout-", t % 50), static_cast<uint64_t>(t));
    }
    const wire::Request list = req::ListLocks(1);
    for (int i = 0; !stop; ++i) {
      if (i % 50 == 0) {
        if (auto r = (*conn)->Call(ka); r.ok()) foreign += r->keep_alive().lock_codes_size();
      } else if ((*conn)->Call(list).ok()) {
        ++listings;
      }
    }
  });
  absl::Status waited = WaitWorkers(c, out, absl::Seconds(120));
  stop = true;
  slow_reader.join();
  flooder.join();
  idle.clear();
  if (!waited.ok()) return waited;
  out.Figure("noisy neighbour", absl::StrCat(listings.load(), " listings, ", foreign.load(),
                                             " foreign tokens, ", unread.load(),
                                             " unread listings, 50 idle connections"));
  ExpectNoLeaseLost(h, out, "beside a noisy neighbour");
  return Finish(c, out, {});
}

// Issue 15: a stranger on loopback reads every holder's session id and token from the lists
// (no permissions file: anyone may list) and sends them back as its own, all the while the
// workers pay: Release, KeepAlive, Acquire, Validate as holder, CloseSession, and
// ResumeSession with guessed secrets. Every one must be refused, and the workers must not
// notice.
absl::Status Stranger(Env& env, Outcome& out) {
  auto cluster = StartPayingWithSessions(env);
  if (!cluster.ok()) return cluster.status();
  Cluster& c = **cluster;
  History h(c.Path("history"));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> sent{0}, refused{0}, accepted{0};
  std::string first_accepted;
  std::thread stranger([&] {
    auto conn = server::BlockingConnection::Connect(server::BlockingConnectionOptions{
        .server = c.lockd_address(), .timeout = absl::Seconds(1), .client_name = "stranger",
        .tls = c.lockd_tls()});
    if (!conn.ok()) return;
    std::mt19937_64 guesses(env.seed);
    while (!stop) {
      auto listed = (*conn)->Call(req::ListLocks({.include_sessions = true}));
      if (!listed.ok()) break;
      std::vector<wire::Request> attacks;
      for (const wire::LockInfo& l : listed->list().locks()) {
        attacks.push_back(req::Release(l.session_id(), l.lock(), l.token()));
        attacks.push_back(req::KeepAlive(l.session_id(), l.lock(), l.token()));
        attacks.push_back(req::Validate(l.lock(), l.token(), l.session_id()));
        attacks.push_back(req::Acquire(l.session_id(), l.lock() + "-stolen"));
      }
      for (const wire::SessionInfo& s : listed->list().sessions()) {
        std::string secret(16, '\0');
        for (char& ch : secret) ch = static_cast<char>(guesses());
        attacks.push_back(req::Resume(s.session_id(), secret));
        attacks.push_back(req::Close(s.session_id()));
      }
      for (const wire::Request& r : attacks) {
        auto reply = (*conn)->Call(r);
        if (!reply.ok()) break;
        ++sent;
        if (reply->code() == wire::PERMISSION_DENIED) {
          ++refused;
        } else if (reply->code() == wire::OK) {
          if (accepted++ == 0) first_accepted = r.ShortDebugString();
        }
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  absl::Status waited = WaitWorkers(c, out, absl::Seconds(120));
  stop = true;
  stranger.join();
  if (!waited.ok()) return waited;
  out.Figure("stranger", absl::StrCat(sent.load(), " requests with other sessions' ids, ",
                                      refused.load(), " refused, ", accepted.load(), " accepted"));
  out.Expect(sent.load() > 0, "the stranger sent nothing");
  out.Expect(accepted.load() == 0,
             absl::StrCat(accepted.load(), " of the stranger's requests were accepted, first: ",
                          first_accepted));
  ExpectNoLeaseLost(h, out, "to a stranger's requests");
  return Finish(c, out, {});
}

// Replicated runs (issue 16): lockd's state in a 3-member etcd cluster, three lockd replicas on
// it (lockd-a serving, lockd-b and lockd-c standing by), the workers given all three.
constexpr absl::Duration kOwnerTtl = absl::Seconds(2);  // each replica's lease on the prefix
constexpr absl::Duration kOwnerTtlThroughElection = absl::Seconds(5);

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
// is always wanted by another holder when its holder's lease could be misjudged.
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
  int64_t holds() const { return holds_; }
  int64_t lost() const { return lost_; }
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
      auto held = (*client)->acquire(key, absl::Seconds(1));
      if (!held.ok()) {
        absl::SleepFor(absl::Milliseconds(20));
        continue;
      }
      const int64_t granted = history::NowNanos();
      (*writer)->Append(sent, "acquire", key, held->token(), "", granted);
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

// Runs etcdctl (beside `etcd`) against `endpoints` with `args`; its standard output (bytes),
// or the failure.
absl::StatusOr<std::string> Etcdctl(const std::string& etcd, const std::string& endpoints,
                                    const std::vector<std::string>& args, const std::string& dir) {
  const std::string etcdctl =
      std::filesystem::path(etcd).parent_path().append("etcdctl").string();
  std::vector<std::string> all = {"--endpoints=" + endpoints};
  all.insert(all.end(), args.begin(), args.end());
  const std::string out = dir + "/etcdctl.out";
  auto child = process::Child::Spawn(etcdctl, all,
                                     {.stdout_file = out, .stderr_file = dir + "/etcdctl.err"});
  if (!child.ok()) return child.status();
  const std::optional<int> status = child->Wait(absl::Seconds(10));
  if (!status.has_value() || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::UnavailableError(absl::StrCat("etcdctl ", absl::StrJoin(args, " "), " failed; see ",
                                               dir, "/etcdctl.err"));
  }
  std::ifstream in(out, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

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
    o.etcd_members = 3;
    o.etcd_binary = env.binaries.etcd;
    o.lockd_replicas = 3;
    o.etcd_owner_ttl = owner_ttl;
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
      auto deleted = Etcdctl(env.binaries.etcd, c.etcd()->endpoints(),
                             {"del", c.etcd_prefix() + "/owner"}, c.Path(""));
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
      auto dump = Etcdctl(env.binaries.etcd, c.etcd()->endpoints(),
                          {"get", "--prefix", c.etcd_prefix()}, c.Path(""));
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
  holders.Stop();
  out.Expect(holders.error().empty(), "a long holder could not start: " + holders.error());
  out.Expect(holders.holds() > 0, "the long holders held nothing: the run shows nothing");
  // Losses are allowed (a failover can outlast a holder's lease; D5 loses the lock cleanly);
  // overlaps are not: the checker compares every hold with the others.
  out.Figure("long holders", absl::StrCat(holders.holds(), " holds of 2 to 6 s (TTL ",
                                          Secs(LongHolders::kTtl), "), ",
                                          holders.HeldAcross(fault_at), " held across the fault, ",
                                          holders.lost(), " lost"));
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
    o.etcd_members = 3;
    o.etcd_binary = env.binaries.etcd;
    o.lockd_replicas = 3;
    o.etcd_owner_ttl = ttl;
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
  holders.Stop();
  out.Expect(holders.error().empty(), "a long holder could not start: " + holders.error());
  out.Figure("long holders", absl::StrCat(holders.holds(), " holds of 2 to 6 s (TTL ",
                                          Secs(LongHolders::kTtl), "), ", holders.lost(), " lost"));
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
    o.etcd_members = 3;
    o.etcd_binary = env.binaries.etcd;
    o.lockd_replicas = 3;
    o.etcd_owner_ttl = ttl;
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
  holders.Stop();
  out.Expect(holders.error().empty(), "a long holder could not start: " + holders.error());
  out.Figure("long holders", absl::StrCat(holders.holds(), " holds of 2 to 6 s (TTL ",
                                          Secs(LongHolders::kTtl), "), ", holders.lost(), " lost"));
  return Finish(c, out, {});
}

// Issue 37: the serving replica's wall clock stepped an hour ahead, then an hour behind
// (libfaketime; its boot-time and monotonic clocks are left alone), each for longer than its
// lease on the prefix, while the workers pay. Its ownership and every lease run on the
// boot-time clock: no deposition, no lease lost.
absl::Status ReplicaClockStep(Env& env, Outcome& out) {
  const std::string libfaketime = LIBFAKETIME;
  if (libfaketime.empty() || !std::filesystem::exists(libfaketime)) {
    return absl::FailedPreconditionError(
        "libfaketime not found: install the Debian package faketime (scripts/test.sh does)");
  }
  const std::string offset_file = env.dir + "/lockd-a-wall-clock";
  auto set_offset = [&](const std::string& offset) {
    std::ofstream(offset_file, std::ios::trunc) << offset << "\n";
  };
  set_offset("+0");
  const std::vector<std::string> environment = FaketimeEnvironment(offset_file);
  auto cluster = StartCluster(env, BusyPayouts(env), {}, kTtl, [&](ClusterOptions& o) {
    o.etcd_members = 3;
    o.etcd_binary = env.binaries.etcd;
    o.lockd_replicas = 3;
    o.etcd_owner_ttl = kOwnerTtl;
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
    set_offset(offset);
    absl::SleepFor(hold);
    const int64_t granted = prober.grants() - granted_before;
    absl::StrAppend(&steps, steps.empty() ? "" : "; ", offset, " for ", Secs(hold), ": ",
                    granted, " probe grants, longest pause ",
                    Secs(prober.LongestPause(from, history::NowNanos())));
    out.Expect(granted > 0, absl::StrCat("nothing was granted with lockd-a's wall clock at ", offset));
  }
  set_offset("+0");
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

}  // namespace

const std::vector<Scenario>& Scenarios() {
  static const auto* scenarios = new std::vector<Scenario>{
      {"uc03", "a holder frozen past its lease before its submit wakes up and abandons; fences stay quiet",
       [](Env& e, Outcome& o) { return Uc03(e, o, /*client_check=*/true); }},
      {"uc03-unchecked",
       "the same with the client check off: the stale submit is refused by a fence, paid once",
       [](Env& e, Outcome& o) { return Uc03(e, o, /*client_check=*/false); }},
      {"uc04", "a holder is killed; another holds the lock within the TTL (recovery latency)", Uc04},
      {"stalled-reply", "a KeepAlive reply held 2 s does not extend the client's deadline", StalledReply},
      {"server-freeze", "lockd frozen past the TTL and resumed: every payout still paid once", ServerFreeze},
      {"server-crash", "lockd killed under load and restarted from its state: tokens keep rising", ServerCrash},
      {"network", "delays, holds, drops and cuts between workers and lockd: paid once, tokens ordered", Network},
      {"clock-step", "workers' wall clocks stepped an hour ahead and behind mid-run: no lease lost",
       ClockStep},
      {"server-pause", "lockd stopped 3 s, less than the lease: acquires renew first, no refusal storm",
       ServerPause},
      {"noisy-neighbour",
       "a client that never reads, floods listings and presents foreign tokens: workers unharmed",
       NoisyNeighbour},
      {"stranger",
       "a peer replays every holder's session id and token, and guesses secrets: all refused",
       Stranger},
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
      {"ha-etcd-stranger",
       "replicated: a stranger reads etcd and tries what it finds as session secrets: all refused",
       [](Env& e, Outcome& o) { return Replicated(e, o, HaFault::kEtcdStranger); }, true},
  };
  return *scenarios;
}

const Scenario* FindScenario(const std::string& name) {
  for (const Scenario& s : Scenarios()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

Outcome RunScenario(const Scenario& scenario, Env& env) {
  Outcome out;
  out.scenario = scenario.name;
  out.seed = env.seed;
  out.dir = env.dir;
  env.rng.seed(env.seed);
  const absl::Time start = absl::Now();
  absl::Status s = scenario.run(env, out);
  if (!s.ok()) out.failures.push_back(std::string(s.ToString()));
  out.wall = absl::Now() - start;
  return out;
}

}  // namespace fencelock::harness
