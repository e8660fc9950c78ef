// The scale workload's two event dimensions (issue 60): many waiters on one lock, and many
// leases ending at once. Each point runs against a fresh lockd, driven by the raw protocol.
//
// Waiters on one lock (--scale-waiters): W sessions queue on one held lock, in a known order
// (64 to a connection, each connection's acquires in one write, the next connection's only once
// lockd counts the first's as queued). The holder releases, and each waiter releases the moment
// its grant arrives: W hand-offs in a chain, each one release and one grant made durable and
// one round trip. Counted: that the grants come in queue order (FIFO), that lockd granted
// exactly W times and sent no waiter anything else (one wake-up per release), and the hand-offs
// per second against the floor 1 / (fdatasync p50 + loopback RTT p50) measured in the same run.
//
// Leases ending together (--scale-expiries): N held locks filled with TTLs that run out at one
// moment, or spread evenly over the second after it (each acquire asks for the time left until
// its lease's end), while a probe Client acquires and releases a lock of its own: its requests'
// times from a second before that moment until a second after lockd holds none of the N, and
// how long lockd took to end them all.
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench.h"
#include "fencelock/wire.pb.h"
#include "logging/logging.h"
#include "protocol/requests.h"

namespace fencelock::bench {
namespace {

namespace req = protocol::request;

constexpr size_t kSessionsPerConnection = 64;  // lockd's default --max-sessions-per-connection
const char kQueuedLock[] = "scale/queue";

struct WaitersPoint {
  size_t waiters = 0;
  double queue_seconds = 0;  // queueing them all, in order
  double handoffs_per_second = 0;
  Percentiles handoff;     // one grant's arrival to the next's
  uint64_t grants = 0;     // lockd's grants_total over the hand-offs
  uint64_t syncs = 0;      // lockd's log syncs over them
  size_t out_of_turn = 0;  // grants that came to a waiter behind the next in line
  size_t unexpected = 0;   // replies other than the grants and the releases' answers
};

// One connection's waiters: their sessions, and the request id of each one's
// Acquire.
struct WaiterConnection {
  std::unique_ptr<net::BlockingConnection> conn;
  std::vector<uint64_t> sessions;
  std::map<uint64_t, size_t> acquire_of;  // acquire request id -> index in sessions
  std::set<uint64_t> releases;            // request ids of the releases not yet answered
};

// Takes `r` as the answer to one of `w`'s releases, if it is one; false if it
// is not.
bool Answered(WaiterConnection& w, const wire::Response& r) {
  return w.releases.erase(r.request_id()) == 1 && r.code() == wire::OK;
}

absl::Status OpenWaiters(WaiterConnection& w, const std::string& address, size_t count) {
  auto conn = Connect(address);
  if (!conn.ok()) return conn.status();
  w.conn = std::move(*conn);
  auto ids = w.conn->SendAll(std::vector<wire::Request>(count, req::OpenSession(absl::Hours(1))));
  if (!ids.ok()) return ids.status();
  std::vector<wire::Response> opened;
  if (absl::Status s = ReceiveAll(*w.conn, *ids, opened); !s.ok()) return s;
  for (const wire::Response& r : opened) {
    if (r.code() != wire::OK) return absl::UnavailableError(r.message());
    w.sessions.push_back(r.open_session().session_id());
  }
  return absl::OkStatus();
}

// Queues the connection's waiters (one write) and returns once lockd counts
// `queued_after` waiters in all: the next connection's then queue behind these.
absl::Status QueueWaiters(WaiterConnection& w, net::BlockingConnection& control,
                          size_t queued_after) {
  std::vector<wire::Request> acquires;
  for (uint64_t session : w.sessions) {
    acquires.push_back(req::Acquire(session, kQueuedLock, absl::Hours(1), absl::Hours(1)));
  }
  auto ids = w.conn->SendAll(std::move(acquires));
  if (!ids.ok()) return ids.status();
  for (size_t i = 0; i < ids->size(); ++i) w.acquire_of[(*ids)[i]] = i;
  const MonoTime deadline = Now() + absl::GetFlag(FLAGS_timeout);
  while (true) {
    auto stats = Stats(control);
    if (!stats.ok()) return stats.status();
    if (stats->waiters() >= queued_after) return absl::OkStatus();
    if (Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("queueing: lockd counts ", stats->waiters(),
                                                      " waiters, ", queued_after, " sent"));
    }
  }
}

absl::StatusOr<WaitersPoint> MeasureWaiters(const Settings& s, size_t n) {
  auto lockd = testing::LocalLockd::Start(
      {.binary = s.binary,
       .dir = absl::StrCat(s.root, "/scale-waiters-", n),
       .serve_args = {"--max-connections=4096", "--max-connections-per-peer=4096",
                      absl::StrCat("--max-waiters-per-lock=", std::max<size_t>(1024, n))}});
  if (!lockd.ok()) return lockd.status();
  const std::string address = (*lockd)->address();
  auto control = Connect(address);
  if (!control.ok()) return control.status();
  WaiterConnection holder;
  if (absl::Status st = OpenWaiters(holder, address, 1); !st.ok()) return st;
  auto held = holder.conn->Call(req::Acquire(holder.sessions[0], kQueuedLock));
  if (!held.ok()) return held.status();
  if (held->code() != wire::OK) return absl::UnavailableError(held->message());

  WaitersPoint point;
  point.waiters = n;
  std::vector<WaiterConnection> conns((n + kSessionsPerConnection - 1) / kSessionsPerConnection);
  const MonoTime queue_start = Now();
  for (size_t c = 0; c < conns.size(); ++c) {
    const size_t count = std::min(kSessionsPerConnection, n - c * kSessionsPerConnection);
    if (absl::Status st = OpenWaiters(conns[c], address, count); !st.ok()) return st;
    if (absl::Status st = QueueWaiters(conns[c], **control, c * kSessionsPerConnection + count);
        !st.ok()) {
      return st;
    }
  }
  point.queue_seconds = absl::ToDoubleSeconds(Now() - queue_start);
  auto before = Stats(**control);
  if (!before.ok()) return before.status();

  // The chain: each grant is answered by its release at once.
  const MonoTime start = Now();
  auto sent =
      holder.conn->Send(req::Release(holder.sessions[0], kQueuedLock, held->acquire().token()));
  if (!sent.ok()) return sent.status();
  holder.releases.insert(*sent);
  uint64_t last_token = held->acquire().token();
  std::vector<int64_t> handoff_ns;
  std::vector<bool> granted(n, false);  // out of turn, before its place in line came
  MonoTime last = start;
  for (size_t i = 0; i < n; ++i) {
    if (granted[i]) continue;
    WaiterConnection& w = conns[i / kSessionsPerConnection];
    const size_t expected = i % kSessionsPerConnection;
    while (true) {
      auto r = w.conn->Receive(absl::GetFlag(FLAGS_timeout));
      if (!r.ok()) {
        return absl::Status(r.status().code(), absl::StrCat("waiter ", i, " of ", n,
                                                            " (the next in line) was not "
                                                            "granted: ",
                                                            r.status().message()));
      }
      auto it = w.acquire_of.find(r->request_id());
      if (it == w.acquire_of.end()) {
        // A release's answer (or something no waiter asked for).
        if (!Answered(w, *r)) ++point.unexpected;
        continue;
      }
      const size_t index = it->second;
      w.acquire_of.erase(it);
      if (r->code() != wire::OK) {
        return absl::UnavailableError(absl::StrCat("waiter ", i, ": ", r->message()));
      }
      if (r->acquire().token() <= last_token) {
        return absl::InternalError(absl::StrCat("waiter ", i, " granted token ",
                                                r->acquire().token(), " after ", last_token));
      }
      last_token = r->acquire().token();
      auto release = w.conn->Send(req::Release(w.sessions[index], kQueuedLock, last_token));
      if (!release.ok()) return release.status();
      w.releases.insert(*release);
      if (index != expected) {
        // A waiter behind the next in line: counted, and passed over when its place comes.
        ++point.out_of_turn;
        granted[(i / kSessionsPerConnection) * kSessionsPerConnection + index] = true;
        continue;
      }
      break;
    }
    const MonoTime now = Now();
    handoff_ns.push_back((now - last) / absl::Nanoseconds(1));
    last = now;
  }
  const double seconds = absl::ToDoubleSeconds(last - start);
  point.handoffs_per_second = seconds > 0 ? n / seconds : 0;
  point.handoff = Summarize(std::move(handoff_ns));

  // Every release answered; then nothing more may come to anyone.
  conns.push_back(std::move(holder));
  for (WaiterConnection& w : conns) {
    while (!w.releases.empty()) {
      auto r = w.conn->Receive(absl::GetFlag(FLAGS_timeout));
      if (!r.ok()) return r.status();
      if (!Answered(w, *r)) ++point.unexpected;
    }
  }
  auto after = Stats(**control);
  if (!after.ok()) return after.status();
  for (WaiterConnection& w : conns) {
    while (w.conn->Receive(absl::ZeroDuration()).ok()) ++point.unexpected;
  }
  point.grants = after->grants_total() - before->grants_total();
  point.syncs = after->log_syncs_total() - before->log_syncs_total();
  if (after->waiters() != 0) {
    return absl::InternalError(absl::StrCat("lockd still counts ", after->waiters(),
                                            " waiters after every one was served"));
  }
  return point;
}

struct ExpiryPoint {
  size_t leases = 0;
  absl::Duration over;  // the leases' ends spread evenly over this much time
  double fill_seconds = 0;
  double first_seconds = 0;   // from the moment they were due until lockd counted one ended
  double end_seconds = 0;     // until lockd held none of them
  uint64_t stalls = 0;        // times lockd found it had not run (its leases extended)
  double max_at = 0;          // when the probe's longest acquire began, from the moment
  Percentiles probe_before;   // acquires begun before the last second ahead of the moment
  Percentiles probe_storm;    // from that second until a second after lockd held none
  uint64_t expiries = 0;      // lockd's lock_expiries_total over the storm
  size_t probe_failures = 0;  // the probe's requests that failed (a timeout: lockd did not answer)
};

absl::StatusOr<ExpiryPoint> MeasureExpiries(const Settings& s, size_t n, absl::Duration over) {
  auto lockd = testing::LocalLockd::Start(
      {.binary = s.binary,
       .dir = absl::StrCat(s.root, "/scale-expiries-", n, "-", absl::FormatDuration(over)),
       .serve_args = {"--max-connections=4096", "--max-connections-per-peer=4096",
                      "--max-locks-per-session=1000"}});
  if (!lockd.ok()) return lockd.status();
  const std::string address = (*lockd)->address();
  // lockd may not answer for seconds while it ends them: that is the figure, not an error.
  auto control = net::BlockingConnection::Connect(
      {.server = address, .timeout = absl::Minutes(2), .client_name = "bench"});
  if (!control.ok()) return control.status();
  auto probe = Probe::Start(address, "scale/probe");
  if (!probe.ok()) return probe.status();
  ExpiryPoint point;
  point.leases = n;
  point.over = over;
  // Room for a fill at a fifth of the rate lockd fills at here (over
  // 100,000/s), and for the probe's samples before the storm.
  const MonoTime due = Now() + absl::Seconds(2) + absl::Seconds(n / 20'000.0);
  auto filled =
      FillLocks(address, {.locks = n, .prefix = "scale/expiring/", .ttl = [due, over, n](size_t i) {
                            return due + over * (static_cast<double>(i) / n) - Now();
                          }});
  if (!filled.ok()) return filled.status();
  point.fill_seconds = *filled;
  auto before = Stats(**control);
  if (!before.ok()) return before.status();
  if (before->locks_held() < n) {
    return absl::InternalError(absl::StrCat("lockd holds ", before->locks_held(), " of the ", n,
                                            " locks before they were due"));
  }
  // The run is counted from the first end due; the last is due `over` later.
  // Until lockd holds none of them (the probe's lock may be held at any
  // moment).
  while (Now() < due) absl::SleepFor(absl::Milliseconds(10));
  MonoTime ended, first = MonoTime::Max();
  while (true) {
    auto stats = Stats(**control);
    if (!stats.ok()) return stats.status();
    if (first == MonoTime::Max() && stats->lock_expiries_total() > before->lock_expiries_total()) {
      first = Now();
    }
    if (stats->locks_held() <= 1 &&
        stats->lock_expiries_total() - before->lock_expiries_total() >= n) {
      ended = Now();
      point.expiries = stats->lock_expiries_total() - before->lock_expiries_total();
      point.stalls = stats->stalls_total() - before->stalls_total();
      break;
    }
    if (Now() > due + over + absl::Minutes(1)) {
      return absl::DeadlineExceededError(absl::StrCat("lockd still holds ", stats->locks_held(),
                                                      " locks a minute after they were due"));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  point.first_seconds = absl::ToDoubleSeconds(first - due);
  point.end_seconds = absl::ToDoubleSeconds(ended - due);
  absl::SleepFor(absl::Seconds(1));
  const std::vector<Probe::Sample> samples = (*probe)->Stop();
  point.probe_failures = (*probe)->failures();
  point.probe_before = Summarize(Probe::Between(samples, MonoTime::Min(), due - absl::Seconds(1)));
  point.probe_storm =
      Summarize(Probe::Between(samples, due - absl::Seconds(1), ended + absl::Seconds(1)));
  int64_t longest = -1;
  for (const Probe::Sample& sample : samples) {
    if (sample.ns > longest) {
      longest = sample.ns;
      point.max_at = absl::ToDoubleSeconds(sample.start - due);
    }
  }
  return point;
}

}  // namespace

absl::Status RunWaiters(const Settings& s, const Percentiles& fsync, const Percentiles& loopback,
                        Report& report) {
  const double floor = 1e3 / (fsync.p50 + loopback.p50);
  std::string table = absl::StrFormat(
      "\n### Cost as the work grows: waiters on one lock (each released at "
      "once on its grant; "
      "floor 1 / (fdatasync p50 + loopback RTT p50) = %.0f/s)\n\n"
      "| waiters | queueing (s) | hand-offs/s | vs the floor | hand-off p50 "
      "(ms) | "
      "hand-off p99 (ms) | grants | log syncs | out of turn | other replies |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
      floor);
  Json points = Json::array();
  for (size_t n : s.scale_waiters) {
    logging::Program().Info(absl::StrCat("scale: ", n, " waiters on one lock"));
    auto p = MeasureWaiters(s, n);
    if (!p.ok()) return p.status();
    if (p->out_of_turn > 0 || p->unexpected > 0 || p->grants != n) {
      report.broken = true;
      logging::Program().Error(absl::StrCat(
          "scale: ", n, " waiters: ", p->out_of_turn, " granted out of turn, ", p->unexpected,
          " other replies, ", p->grants, " grants (one per release wanted)"));
    }
    points.push_back({{"waiters", n},
                      {"queue_seconds", p->queue_seconds},
                      {"handoffs_per_second", p->handoffs_per_second},
                      {"floor_per_second", floor},
                      {"handoff", ToJson(p->handoff)},
                      {"grants", p->grants},
                      {"log_syncs", p->syncs},
                      {"out_of_turn", p->out_of_turn},
                      {"other_replies", p->unexpected}});
    absl::StrAppendFormat(&table, "| %d | %.2f | %.0f | %.2f | %s | %s | %d | %d | %d | %d |\n", n,
                          p->queue_seconds, p->handoffs_per_second,
                          floor > 0 ? p->handoffs_per_second / floor : 0, Ms(p->handoff.p50),
                          Ms(p->handoff.p99), p->grants, p->syncs, p->out_of_turn, p->unexpected);
  }
  report.json["scale"]["waiters"] = points;
  report.scale_waiters_table = table;
  return absl::OkStatus();
}

absl::Status RunExpiries(const Settings& s, Report& report) {
  std::string table =
      "\n### Cost as the work grows: leases ending at one moment, or spread "
      "over a second (a "
      "probe Client acquiring an unrelated lock)\n\n"
      "| leases | due over (s) | fill (s) | first / all ended after (s) | "
      "probe p99 / max before (ms) | probe p50 / p99 / max during (ms) | "
      "longest began at (s) | "
      "expiries | lockd stalls | probe failures |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  Json points = Json::array();
  for (size_t n : s.scale_expiries) {
    for (absl::Duration over : {absl::ZeroDuration(), absl::Seconds(1)}) {
      logging::Program().Info(
          absl::StrCat("scale: ", n, " leases ending over ", absl::FormatDuration(over)));
      auto p = MeasureExpiries(s, n, over);
      if (!p.ok()) return p.status();
      points.push_back({{"leases", n},
                        {"due_over_seconds", absl::ToDoubleSeconds(over)},
                        {"fill_seconds", p->fill_seconds},
                        {"first_ended_after_seconds", p->first_seconds},
                        {"ended_after_seconds", p->end_seconds},
                        {"probe_longest_began_at_seconds", p->max_at},
                        {"lockd_stalls", p->stalls},
                        {"probe_failures", p->probe_failures},
                        {"probe_before", ToJson(p->probe_before)},
                        {"probe_during", ToJson(p->probe_storm)},
                        {"expiries", p->expiries}});
      absl::StrAppendFormat(&table,
                            "| %d | %.0f | %.2f | %.3f / %.3f | %s / %s | %s / %s / %s | %+.3f | "
                            "%d | %d | %d |\n",
                            n, absl::ToDoubleSeconds(over), p->fill_seconds, p->first_seconds,
                            p->end_seconds, Ms(p->probe_before.p99), Ms(p->probe_before.max),
                            Ms(p->probe_storm.p50), Ms(p->probe_storm.p99), Ms(p->probe_storm.max),
                            p->max_at, p->expiries, p->stalls, p->probe_failures);
    }
  }
  report.json["scale"]["expiries"] = points;
  report.scale_expiries_table = table;
  return absl::OkStatus();
}

}  // namespace fencelock::bench
