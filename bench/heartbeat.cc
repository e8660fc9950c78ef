// fencelock-bench's heartbeat workloads (bench.h): sessions renewed by the raw driver on a
// schedule, and the client library's own heartbeat read from its histogram.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench.h"
#include "fencelock/wire.pb.h"
#include "lock-client/client.h"
#include "logging/logging.h"
#include "metrics/metrics.h"
#include "protocol/requests.h"

namespace fencelock::bench {
namespace {

using fencelock::Client;
namespace req = protocol::request;

// The cumulative bucket counts of lock_heartbeat_rtt_seconds in a registry's exposition, by
// upper bound (seconds; +Inf as infinity), and the heartbeats that failed.
struct RttBuckets {
  std::vector<std::pair<double, double>> cumulative;
  double failures = 0;
};

RttBuckets ReadBuckets(const metrics::Registry& registry) {
  RttBuckets b;
  for (absl::string_view line : absl::StrSplit(registry.TextExposition(), '\n')) {
    if (absl::ConsumePrefix(&line, "lock_heartbeat_failures_total ")) {
      (void)absl::SimpleAtod(line, &b.failures);
      continue;
    }
    if (!absl::ConsumePrefix(&line, "lock_heartbeat_rtt_seconds_bucket{le=\"")) continue;
    const size_t quote = line.find('"');
    const size_t space = line.rfind(' ');
    if (quote == absl::string_view::npos || space == absl::string_view::npos) continue;
    double le = 0, n = 0;
    const absl::string_view bound = line.substr(0, quote);
    if (bound == "+Inf") {
      le = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(bound, &le)) {
      continue;
    }
    if (absl::SimpleAtod(line.substr(space + 1), &n)) b.cumulative.emplace_back(le, n);
  }
  return b;
}

// The q-quantile in milliseconds of the heartbeats between two readings, interpolated inside
// its bucket as Prometheus' histogram_quantile() does (an operator's dashboard shows this).
double BucketQuantile(const RttBuckets& before, const RttBuckets& after, double q) {
  const size_t n = std::min(before.cumulative.size(), after.cumulative.size());
  if (n == 0) return 0;
  const double total = after.cumulative[n - 1].second - before.cumulative[n - 1].second;
  if (total <= 0) return 0;
  const double rank = q * total;
  double lower_bound = 0, lower_count = 0;
  for (size_t i = 0; i < n; ++i) {
    const double le = after.cumulative[i].first;
    const double count = after.cumulative[i].second - before.cumulative[i].second;
    if (count >= rank) {
      if (std::isinf(le)) return lower_bound * 1000;  // above the last bound: its bound, at least
      return 1000 * (lower_bound + (le - lower_bound) * (rank - lower_count) /
                                       std::max(1e-12, count - lower_count));
    }
    lower_bound = le;
    lower_count = count;
  }
  return lower_bound * 1000;
}

}  // namespace

using net::BlockingConnection;
namespace req = protocol::request;

absl::StatusOr<std::unique_ptr<BlockingConnection>> Connect(const std::string& address) {
  return BlockingConnection::Connect(
      {.server = address, .timeout = absl::GetFlag(FLAGS_timeout), .client_name = "bench"});
}

absl::StatusOr<wire::StatsReply> Stats(BlockingConnection& conn) {
  auto r = conn.Call(req::GetStats());
  if (!r.ok()) return r.status();
  if (r->code() != wire::OK) return absl::UnavailableError(r->message());
  return r->stats();
}

absl::Status ReceiveAll(BlockingConnection& conn, const std::vector<uint64_t>& ids,
                        std::vector<wire::Response>& out) {
  std::map<uint64_t, size_t> where;
  for (size_t i = 0; i < ids.size(); ++i) where[ids[i]] = i;
  out.assign(ids.size(), wire::Response());
  for (size_t left = ids.size(); left > 0;) {
    auto r = conn.Receive(absl::GetFlag(FLAGS_timeout));
    if (!r.ok()) return r.status();
    auto it = where.find(r->request_id());
    if (it == where.end()) continue;
    out[it->second] = std::move(*r);
    where.erase(it);
    --left;
  }
  return absl::OkStatus();
}

// Opens `count` sessions on a new connection, each with one lock: the opens in one write, then
// the acquires in one write. At most `count` (64) requests are outstanding on a connection, so
// a burst of many connections is paced by lockd's answers, not cut off by a timeout.
absl::Status OpenSessions(Heartbeater& h, const std::string& address, size_t count,
                          size_t first) {
  auto conn = Connect(address);
  if (!conn.ok()) return conn.status();
  h.conn = std::move(*conn);
  const absl::Duration ttl = absl::GetFlag(FLAGS_session_ttl);
  std::vector<wire::Request> opens(count, req::OpenSession(ttl));
  auto ids = h.conn->SendAll(std::move(opens));
  if (!ids.ok()) return ids.status();
  std::vector<wire::Response> opened;
  if (absl::Status s = ReceiveAll(*h.conn, *ids, opened); !s.ok()) return s;
  std::vector<wire::Request> acquires;
  for (size_t i = 0; i < count; ++i) {
    if (opened[i].code() != wire::OK) return absl::UnavailableError(opened[i].message());
    acquires.push_back(req::Acquire(opened[i].open_session().session_id(),
                                    absl::StrCat("hb/", first + i), absl::ZeroDuration(), ttl));
  }
  ids = h.conn->SendAll(acquires);
  if (!ids.ok()) return ids.status();
  std::vector<wire::Response> granted;
  if (absl::Status s = ReceiveAll(*h.conn, *ids, granted); !s.ok()) return s;
  for (size_t i = 0; i < count; ++i) {
    if (granted[i].code() != wire::OK) return absl::UnavailableError(granted[i].message());
    h.sessions.emplace_back(opened[i].open_session().session_id(),
                            granted[i].acquire().token());
  }
  return absl::OkStatus();
}

void CycleLoad(const std::string& address, const std::string& lock, const std::atomic<bool>& stop,
               std::atomic<uint64_t>& cycles) {
  auto conn = Connect(address);
  if (!conn.ok()) return;
  auto opened = (*conn)->Call(req::OpenSession(absl::Minutes(1)));
  if (!opened.ok() || opened->code() != wire::OK) return;
  const uint64_t session = opened->open_session().session_id();
  while (!stop.load()) {
    auto g = (*conn)->Call(req::Acquire(session, lock));
    if (!g.ok() || g->code() != wire::OK) break;
    if (auto rel = (*conn)->Call(req::Release(session, lock, g->acquire().token()));
        !rel.ok() || rel->code() != wire::OK) {
      break;
    }
    ++cycles;
  }
}

HeartbeatResult RunHeartbeats(std::vector<Heartbeater>& hs, double seconds, const std::string& label,
                              const std::string& address, int load_clients) {
  const absl::Duration period = absl::GetFlag(FLAGS_heartbeat);
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  const MonoTime start = Now();
  const MonoTime end = start + absl::Seconds(seconds);
  std::mutex mu;
  std::vector<int64_t> all;
  std::atomic<size_t> timeouts{0}, failures{0}, done{0};
  std::atomic<uint64_t> cycles{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  size_t total = 0;
  for (const Heartbeater& h : hs) total += h.sessions.size();
  size_t index = 0;
  for (Heartbeater& h : hs) {
    const size_t base = index;
    index += h.sessions.size();
    threads.emplace_back([&, base, total] {
      std::vector<int64_t> mine;
      std::vector<MonoTime> due(h.sessions.size());
      for (size_t i = 0; i < due.size(); ++i) {
        due[i] = start + period * (static_cast<double>(base + i) / static_cast<double>(total));
      }
      for (;;) {
        const size_t next = static_cast<size_t>(std::min_element(due.begin(), due.end()) - due.begin());
        if (due[next] >= end) break;
        const MonoTime now = Now();
        if (due[next] > now) absl::SleepFor(due[next] - now);
        const wire::Request ka = req::KeepAlive(
            h.sessions[next].first, absl::StrCat("hb/", base + next), h.sessions[next].second);
        const MonoTime sent = Now();
        auto reply = h.conn->Call(ka);
        const MonoTime got = Now();
        if (!reply.ok()) {
          if (absl::IsDeadlineExceeded(reply.status())) {
            ++timeouts;
            mine.push_back(std::max(timeout, got - sent) / absl::Nanoseconds(1));
          } else {
            ++failures;
          }
        } else {
          if (reply->code() != wire::OK) ++failures;
          mine.push_back((got - sent) / absl::Nanoseconds(1));
        }
        ++done;
        due[next] = due[next] + period;
      }
      std::lock_guard<std::mutex> lock(mu);
      all.insert(all.end(), mine.begin(), mine.end());
    });
  }
  for (int c = 0; c < load_clients; ++c) {
    threads.emplace_back([&, c] { CycleLoad(address, absl::StrCat("load/", c), stop, cycles); });
  }
  size_t last_done = 0;
  for (MonoTime t = Now(); t < end; t = Now()) {
    const absl::Duration step = std::min(absl::Seconds(1), end - t);
    absl::SleepFor(step);
    const size_t d = done.load();
    Progress(absl::StrFormat("  %-32s %5.1fs  %7.0f heartbeats/s  %8lu load cycles", label,
                             absl::ToDoubleSeconds(Now() - start),
                             static_cast<double>(d - last_done) / absl::ToDoubleSeconds(step),
                             static_cast<unsigned long>(cycles.load())),
             absl::ToDoubleSeconds(Now() - start));
    last_done = d;
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  EndProgress();
  HeartbeatResult r;
  r.rtt = Summarize(all);
  r.rtt_ns = std::move(all);
  r.timeouts = timeouts;
  r.failures = failures;
  r.cycles_per_second = static_cast<double>(cycles.load()) / seconds;
  return r;
}

std::vector<LibraryHeartbeatResult> RunLibraryHeartbeats(const std::string& address, size_t n,
                                                         double seconds, int load_clients,
                                                         std::string* error) {
  auto registry = std::make_shared<metrics::Registry>();
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<LockHandle> handles;
  logging::Program().Info(absl::StrFormat(
      "heartbeat through the library: %zu clients, each with a session and a lock", n));
  for (size_t i = 0; i < n; ++i) {
    auto c = Client::Create({.server = address,
                             .heartbeat_interval = absl::GetFlag(FLAGS_library_heartbeat),
                             .metrics = registry});
    if (!c.ok()) {
      *error = absl::StrCat("library client ", i, ": ", c.status().ToString());
      return {};
    }
    auto h = (*c)->acquire(absl::StrCat("lib-hb/", i), absl::Seconds(10));
    if (!h.ok()) {
      *error = absl::StrCat("library client ", i, ": ", h.status().ToString());
      return {};
    }
    handles.push_back(*std::move(h));
    clients.push_back(*std::move(c));
  }
  std::vector<LibraryHeartbeatResult> results;
  for (int loaded = 0; loaded <= 1; ++loaded) {
    const RttBuckets before = ReadBuckets(*registry);
    std::vector<Heartbeater> none;
    const HeartbeatResult load =
        RunHeartbeats(none, seconds, absl::StrCat(n, " library clients, ", loaded ? "loaded" : "idle"),
                      address, loaded ? load_clients : 0);
    const RttBuckets after = ReadBuckets(*registry);
    LibraryHeartbeatResult r;
    if (!after.cumulative.empty() && !before.cumulative.empty()) {
      r.heartbeats = after.cumulative.back().second - before.cumulative.back().second;
    }
    r.failures = after.failures - before.failures;
    r.p50 = BucketQuantile(before, after, 0.50);
    r.p90 = BucketQuantile(before, after, 0.90);
    r.p99 = BucketQuantile(before, after, 0.99);
    r.p999 = BucketQuantile(before, after, 0.999);
    r.cycles_per_second = load.cycles_per_second;
    results.push_back(r);
  }
  for (size_t i = 0; i < clients.size(); ++i) (void)clients[i]->release(handles[i]);
  return results;
}

absl::Status RunHeartbeatWorkloads(const Settings& s, Report& report) {
  Json& heartbeat = report.json["heartbeat"] = {
      {"period_ms", absl::ToDoubleMilliseconds(s.heartbeat)},
      {"threshold_ms", s.threshold_ms},
      {"runs", Json::array()},
      {"library", Json::array()}};
  report.table =
      "| sessions | load | samples | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | timeouts | "
      "load cycles/s | 6.5 verdict |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t n : s.counts) {
    auto lockd = StartLockd(s.binary, absl::StrCat(s.root, "/lockd-", n));
    if (!lockd.ok()) return lockd.status();
    logging::Program().Info(absl::StrFormat(
        "heartbeat: opening %zu sessions, each with a lock", n));
    const size_t per = 64;
    std::vector<Heartbeater> hs((n + per - 1) / per);
    // A few opener threads, each opening its connections one after another: a thread per
    // connection (1,563 at 100,000 sessions) left some waiting past the timeout for a core.
    constexpr size_t kOpeners = 8;
    std::vector<std::thread> openers;
    std::atomic<bool> failed{false};
    const MonoTime open_start = Now();
    for (size_t t = 0; t < std::min(kOpeners, hs.size()); ++t) {
      openers.emplace_back([&, t] {
        for (size_t i = t; i < hs.size() && !failed; i += kOpeners) {
          const size_t count = std::min(per, n - i * per);
          if (absl::Status opened = OpenSessions(hs[i], (*lockd)->address(), count, i * per);
              !opened.ok()) {
            logging::Program().Error(opened.ToString());
            failed = true;
          }
        }
      });
    }
    for (std::thread& t : openers) t.join();
    if (failed) return absl::UnavailableError("a heartbeat session could not be opened (above)");
    const double open_seconds = absl::ToDoubleSeconds(Now() - open_start);
    logging::Program().Info(absl::StrFormat(
        "heartbeat: opened %zu sessions and took a lock in each in %.2f s (%.0f sessions/s)", n,
        open_seconds, open_seconds > 0 ? static_cast<double>(n) / open_seconds : 0.0));
    for (int loaded = 0; loaded <= 1; ++loaded) {
      HeartbeatResult r =
          RunHeartbeats(hs, s.seconds, absl::StrCat(n, " sessions, ", loaded ? "loaded" : "idle"),
                        (*lockd)->address(), loaded ? s.load_clients : 0);
      const bool ok = r.rtt.p99 <= s.threshold_ms;
      if (r.failures > 0 || r.rtt.samples == 0) report.broken = true;
      heartbeat["runs"].push_back({{"sessions", n},
                                   {"loaded", loaded == 1},
                                   {"rtt", ToJson(r.rtt)},
                                   {"timeouts", r.timeouts},
                                   {"failures", r.failures},
                                   {"load_cycles_per_s", r.cycles_per_second},
                                   {"p99_within_threshold", ok}});
      absl::StrAppend(&report.table, "| ", n, " | ", loaded ? absl::StrCat(s.load_clients, " clients") : "idle",
                      " | ", r.rtt.samples, " | ", Ms(r.rtt.p50), " | ", Ms(r.rtt.p90), " | ",
                      Ms(r.rtt.p99), " | ", Ms(r.rtt.p999), " | ", Ms(r.rtt.max), " | ", r.timeouts,
                      " | ", absl::StrFormat("%.0f", r.cycles_per_second), " | ",
                      ok ? "p99 within" : "p99 ABOVE", " ", absl::StrFormat("%.0f", s.threshold_ms),
                      " ms |\n");
      report.variants.push_back({n, loaded == 1, std::move(r)});
    }
  }
  if (const int n = s.library_sessions; n > 0) {
    auto lockd = StartLockd(s.binary, absl::StrCat(s.root, "/lockd-library"));
    if (!lockd.ok()) return lockd.status();
    std::string library_error;
    const std::vector<LibraryHeartbeatResult> lib = RunLibraryHeartbeats(
        (*lockd)->address(), static_cast<size_t>(n), s.seconds, s.load_clients, &library_error);
    if (!library_error.empty()) {
      logging::Program().Error(library_error);
      report.broken = true;
    }
    report.library_table =
        "| clients | load | heartbeats | p50 ms | p90 ms | p99 ms | p99.9 ms | failed or timed out | "
        "load cycles/s | 6.5 verdict |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for (size_t i = 0; i < lib.size(); ++i) {
      const LibraryHeartbeatResult& r = lib[i];
      const bool ok = r.p99 <= s.threshold_ms;
      if (r.heartbeats == 0) report.broken = true;
      heartbeat["library"].push_back({{"clients", n},
                                      {"loaded", i == 1},
                                      {"heartbeats", r.heartbeats},
                                      {"p50_ms", r.p50},
                                      {"p90_ms", r.p90},
                                      {"p99_ms", r.p99},
                                      {"p999_ms", r.p999},
                                      {"failures", r.failures},
                                      {"load_cycles_per_s", r.cycles_per_second}});
      absl::StrAppend(&report.library_table, "| ", n, " | ", i == 1 ? absl::StrCat(s.load_clients, " clients") : "idle",
                      " | ", absl::StrFormat("%.0f", r.heartbeats), " | ", Ms(r.p50), " | ", Ms(r.p90),
                      " | ", Ms(r.p99), " | ", Ms(r.p999), " | ", absl::StrFormat("%.0f", r.failures),
                      " | ", absl::StrFormat("%.0f", r.cycles_per_second), " | ",
                      ok ? "p99 within" : "p99 ABOVE", " ", absl::StrFormat("%.0f", s.threshold_ms), " ms |\n");
    }
  }
  return absl::OkStatus();
}

}  // namespace fencelock::bench
