// The scenarios on one lockd with a local state directory (docs/harness.md); the replicated
// ones are in scenarios_replicated.cc.
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
#include "scenario_support.h"
#include "fencelock/wire.pb.h"
#include "lock-client/client.h"
#include "net/blocking_connection.h"
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

// Workers pay while their wall clocks are stepped an hour ahead, then an hour behind, then
// back (libfaketime, which rereads its offset from a file each second; their monotonic and
// boot-time clocks are left alone). Each step lasts longer than a lease: a heartbeat that
// stopped would lose every lock, one that flooded would show in lockd's load, and either would
// leave leases lost (issue 13, finding 2).
absl::Status ClockStep(Env& env, Outcome& out) {
  const std::string offset_file = env.dir + "/worker-wall-clock";
  auto environment = FaketimeEnvironment(offset_file);
  if (!environment.ok()) return environment.status();
  // Payouts are loaded as the run goes, so that three workers are paying through every step
  // on a fast machine or a slow one (a worker exits once nothing is left to pay).
  const int64_t per_step = env.quick ? 800 : 1600;
  auto cluster = StartCluster(env, per_step, *environment);
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
    SetWallClockOffset(offset_file, offset);
    absl::SleepFor(hold);
    const int64_t paid = h.Count("paid") - paid_before;
    absl::StrAppend(&steps, steps.empty() ? "" : "; ", offset, " for ", Secs(hold), ": ", paid,
                    " paid");
    out.Expect(paid > 0, absl::StrCat("no payout was paid with the wall clock at ", offset,
                                      ": the workers stalled"));
  }
  SetWallClockOffset(offset_file, "+0");
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
  const net::BlockingConnectionOptions options{.server = c.lockd_address(),
                                                  .timeout = absl::Seconds(1),
                                                  .client_name = "noisy-neighbour",
                                                  .tls = c.lockd_tls()};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> listings{0}, foreign{0}, unread{0};
  std::vector<std::unique_ptr<net::BlockingConnection>> idle;
  for (int i = 0; i < 50; ++i) {  // said Hello, then nothing
    auto conn = net::BlockingConnection::Connect(options);
    if (conn.ok()) idle.push_back(std::move(*conn));
  }
  std::thread slow_reader([&] {
    // Sends until lockd stops reading it, then never reads: lockd holds it back and closes it.
    auto conn = net::BlockingConnection::Connect(options);
    if (!conn.ok()) return;
    const wire::Request listing = req::ListLocks({.start_after = std::string(1000, 'a')});
    while (!stop && (*conn)->Send(listing).ok()) ++unread;
    while (!stop) absl::SleepFor(absl::Milliseconds(50));
  });
  std::thread flooder([&] {
    // Cheap listings back to back, and KeepAlives naming 1,000 tokens it never held.
    auto conn = net::BlockingConnection::Connect(options);
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
    auto conn = net::BlockingConnection::Connect(net::BlockingConnectionOptions{
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

}  // namespace

const std::vector<Scenario>& Scenarios() {
  static const auto* scenarios = [] {
    auto* all = new std::vector<Scenario>{
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
    };
    for (Scenario& s : ReplicatedScenarios()) all->push_back(std::move(s));
    return all;
  }();
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
