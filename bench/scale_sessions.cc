// The scale workload's sessions dimension (issue 60): N sessions opened on one lockd and kept
// alive, the way a process that serves many of them keeps them: one Renew per connection and
// period, naming every session the connection drives.
//
// Sessions on one lockd (--scale-sessions): a fresh lockd (--max-sessions-per-connection=1024)
// gets N sessions from 8 threads, 1,024 to a connection, their OpenSessions 256 in flight at a
// time (lockd's own limit per connection: the burst is paced by its answers, not by timeouts),
// each with an hour's TTL: the open rate, and how many opens failed or timed out. Then each
// connection renews its sessions once per --heartbeat period (the connections spread evenly over
// it) for
// --scale-seconds, idle and then beside 8 raw connections cycling a lock of their own: each
// Renew's round trip, the sessions it renewed, lockd's resident memory per session.
#include <atomic>
#include <mutex>
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

constexpr size_t kSessionsPerConnection = 256;
constexpr size_t kOpensInFlight = 256;  // lockd's default --max-requests-in-flight
constexpr int kThreads = 8;

struct SessionConnection {
  std::unique_ptr<net::BlockingConnection> conn;
  std::vector<uint64_t> sessions;
};

// Opens `count` sessions on a new connection, kOpensInFlight at a time.
absl::Status OpenSessionsOn(SessionConnection& c, const std::string& address, size_t count,
                            absl::Duration ttl) {
  auto conn = Connect(address);
  if (!conn.ok()) return conn.status();
  c.conn = std::move(*conn);
  for (size_t done = 0; done < count;) {
    const size_t now = std::min(kOpensInFlight, count - done);
    auto ids = c.conn->SendAll(std::vector<wire::Request>(now, req::OpenSession(ttl)));
    if (!ids.ok()) return ids.status();
    std::vector<wire::Response> opened;
    if (absl::Status s = ReceiveAll(*c.conn, *ids, opened); !s.ok()) return s;
    for (const wire::Response& r : opened) {
      if (r.code() != wire::OK) return absl::UnavailableError(r.message());
      c.sessions.push_back(r.open_session().session_id());
    }
    done += now;
  }
  return absl::OkStatus();
}

wire::Request RenewAll(const std::vector<uint64_t>& sessions) {
  wire::Request r;
  auto* renew = r.mutable_renew();
  for (uint64_t id : sessions) renew->add_sessions()->set_session_id(id);
  return r;
}

struct RenewRun {
  Percentiles rtt;
  size_t renews = 0, timeouts = 0, failures = 0;
  double sessions_per_second = 0;  // session renewals lockd answered OK
  double load_cycles_per_second = 0;
};

// Every connection renews all its sessions once per period, for `seconds`; `load` raw
// connections cycle a lock each beside them.
RenewRun KeepAlive(std::vector<SessionConnection>& conns, const std::string& address,
                   double seconds, int load, const std::string& label) {
  const absl::Duration period = absl::GetFlag(FLAGS_heartbeat);
  const MonoTime start = Now();
  const MonoTime end = start + absl::Seconds(seconds);
  std::mutex mu;
  std::vector<int64_t> all;
  std::atomic<size_t> renews{0}, timeouts{0}, failures{0}, renewed{0};
  std::atomic<uint64_t> cycles{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // This thread's connections, each due at its place in the period.
      std::vector<std::pair<MonoTime, size_t>> due;
      for (size_t c = t; c < conns.size(); c += kThreads) {
        due.emplace_back(start + period * (static_cast<double>(c) / conns.size()), c);
      }
      std::vector<int64_t> mine;
      for (size_t next = 0; !due.empty();) {
        auto& [when, c] = due[next];
        if (when >= end) break;
        if (const MonoTime now = Now(); when > now) absl::SleepFor(when - now);
        const MonoTime sent = Now();
        auto reply = conns[c].conn->Call(RenewAll(conns[c].sessions));
        const MonoTime got = Now();
        ++renews;
        if (!reply.ok()) {
          if (absl::IsDeadlineExceeded(reply.status())) {
            ++timeouts;
            mine.push_back((got - sent) / absl::Nanoseconds(1));
          } else {
            ++failures;
          }
        } else {
          mine.push_back((got - sent) / absl::Nanoseconds(1));
          size_t ok = 0;
          for (const auto& s : reply->renew().sessions()) ok += s.code() == wire::OK;
          if (reply->code() != wire::OK || ok != conns[c].sessions.size()) ++failures;
          renewed += ok;
        }
        when = when + period;
        next = (next + 1) % due.size();
      }
      std::lock_guard<std::mutex> lock(mu);
      all.insert(all.end(), mine.begin(), mine.end());
    });
  }
  for (int c = 0; c < load; ++c) {
    threads.emplace_back(
        [&, c] { CycleLoad(address, absl::StrCat("scale/load/", c), stop, cycles); });
  }
  for (MonoTime t = Now(); t < end; t = Now()) {
    absl::SleepFor(std::min(absl::Seconds(1), end - t));
    Progress(absl::StrFormat("  %-32s %5.1fs  %8lu renews  %8lu load cycles", label,
                             absl::ToDoubleSeconds(Now() - start),
                             static_cast<unsigned long>(renews.load()),
                             static_cast<unsigned long>(cycles.load())),
             absl::ToDoubleSeconds(Now() - start));
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  EndProgress();
  RenewRun r;
  r.rtt = Summarize(std::move(all));
  r.renews = renews;
  r.timeouts = timeouts;
  r.failures = failures;
  r.sessions_per_second = static_cast<double>(renewed.load()) / seconds;
  r.load_cycles_per_second = static_cast<double>(cycles.load()) / seconds;
  return r;
}

struct SessionsPoint {
  size_t sessions = 0;
  double open_seconds = 0;
  size_t open_failures = 0;
  std::string first_open_error;
  RenewRun idle, loaded;
  uint64_t lockd_rss_before = 0, lockd_rss = 0;
};

absl::StatusOr<SessionsPoint> MeasureSessions(const Settings& s, size_t n) {
  auto lockd = testing::LocalLockd::Start(
      {.binary = s.binary,
       .dir = absl::StrCat(s.root, "/scale-sessions-", n),
       .serve_args = {"--max-connections=4096", "--max-connections-per-peer=4096",
                      absl::StrCat("--max-sessions-per-connection=", kSessionsPerConnection)}});
  if (!lockd.ok()) return lockd.status();
  const std::string address = (*lockd)->address();
  SessionsPoint point;
  point.sessions = n;
  point.lockd_rss_before = ResidentBytes((*lockd)->child().pid());
  std::vector<SessionConnection> conns((n + kSessionsPerConnection - 1) / kSessionsPerConnection);
  std::mutex mu;
  std::atomic<size_t> next{0};
  // An hour's TTL: opening a million takes longer than --session-ttl, and a session's renewal
  // costs lockd the same whatever its TTL.
  const absl::Duration ttl = absl::Hours(1);
  const MonoTime start = Now();
  std::vector<std::thread> openers;
  for (int t = 0; t < kThreads; ++t) {
    openers.emplace_back([&] {
      for (size_t c = next++; c < conns.size(); c = next++) {
        const size_t count = std::min(kSessionsPerConnection, n - c * kSessionsPerConnection);
        if (absl::Status st = OpenSessionsOn(conns[c], address, count, ttl); !st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          point.open_failures += count - conns[c].sessions.size();
          if (point.first_open_error.empty()) point.first_open_error = st.ToString();
        }
      }
    });
  }
  for (std::thread& t : openers) t.join();
  point.open_seconds = absl::ToDoubleSeconds(Now() - start);
  if (point.open_failures > 0) return point;
  point.idle = KeepAlive(conns, address, s.scale_seconds, 0, absl::StrCat(n, " sessions, idle"));
  point.loaded =
      KeepAlive(conns, address, s.scale_seconds, 8, absl::StrCat(n, " sessions, loaded"));
  point.lockd_rss = ResidentBytes((*lockd)->child().pid());
  return point;
}

}  // namespace

absl::Status RunSessions(const Settings& s, Report& report) {
  std::string table = absl::StrFormat(
      "\n### Cost as the work grows: sessions on one lockd (%d to a connection, one Renew per "
      "connection every %s)\n\n"
      "| sessions | opens/s | failed opens | Renew RTT p50 / p99 / max idle (ms) | "
      "p50 / p99 / max beside 8 loaded (ms) | load cycles/s | sessions renewed/s | "
      "timeouts / failures | lockd RSS | bytes per session |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
      kSessionsPerConnection, absl::FormatDuration(absl::GetFlag(FLAGS_heartbeat)));
  Json points = Json::array();
  for (size_t n : s.scale_sessions) {
    logging::Program().Info(absl::StrCat("scale: ", n, " sessions on one lockd"));
    auto p = MeasureSessions(s, n);
    if (!p.ok()) return p.status();
    const size_t bad = p->open_failures + p->idle.timeouts + p->idle.failures + p->loaded.timeouts +
                       p->loaded.failures;
    if (bad > 0) {
      report.broken = true;
      logging::Program().Error(absl::StrCat("scale: ", n, " sessions: ", p->open_failures,
                                            " opens failed (", p->first_open_error, "), ", bad,
                                            " failures in all"));
    }
    const double opens = p->open_seconds > 0 ? n / p->open_seconds : 0;
    const double per_session =
        (static_cast<double>(p->lockd_rss) - static_cast<double>(p->lockd_rss_before)) / n;
    auto run_json = [](const RenewRun& r) {
      return Json{{"rtt", ToJson(r.rtt)},
                  {"renews", r.renews},
                  {"timeouts", r.timeouts},
                  {"failures", r.failures},
                  {"sessions_renewed_per_second", r.sessions_per_second},
                  {"load_cycles_per_second", r.load_cycles_per_second}};
    };
    points.push_back({{"sessions", n},
                      {"opens_per_second", opens},
                      {"open_failures", p->open_failures},
                      {"idle", run_json(p->idle)},
                      {"loaded", run_json(p->loaded)},
                      {"lockd_rss_bytes", p->lockd_rss},
                      {"lockd_bytes_per_session", per_session}});
    absl::StrAppendFormat(
        &table,
        "| %d | %.0f | %d | %s / %s / %s | %s / %s / %s | %.0f | %.0f | %d / %d | %.1f MB | "
        "%.0f |\n",
        n, opens, p->open_failures, Ms(p->idle.rtt.p50), Ms(p->idle.rtt.p99), Ms(p->idle.rtt.max),
        Ms(p->loaded.rtt.p50), Ms(p->loaded.rtt.p99), Ms(p->loaded.rtt.max),
        p->loaded.load_cycles_per_second, p->idle.sessions_per_second,
        p->idle.timeouts + p->loaded.timeouts, p->idle.failures + p->loaded.failures,
        p->lockd_rss / 1e6, per_session);
  }
  report.json["scale"]["sessions"] = points;
  report.scale_sessions_table = table;
  return absl::OkStatus();
}

}  // namespace fencelock::bench
