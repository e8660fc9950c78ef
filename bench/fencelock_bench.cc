// fencelock-bench: the M7 benchmark (issue 18; docs/benchmarks.md).
//
//   fencelock-bench --lockd=PATH --rail=PATH --worker=PATH [--out=DIR] [--peers=redis,etcd]
//
// One command, every workload, against a lockd (and peers) it starts itself on a fresh folder
// under $TMPDIR (the disk every server's data is on):
//   - floors: the fdatasync time of a 4 KiB write on that disk, and the loopback TCP round trip;
//   - heartbeat RTT: N sessions, each holding a lock and renewing session and lock with one
//     KeepAlive every --heartbeat, idle and then under a durable lock-cycle load. A KeepAlive
//     unanswered within its timeout counts as an RTT of that timeout. p50 to max, a histogram,
//     and ADR-006 6.5's verdict: p99 against lease x margin / 3;
//   - lock cycles: acquire + release in a closed loop at each of --cycle-clients, through the
//     client library and a raw protocol driver (each client on its own lock, and all on one;
//     and pipelined: each Release sent with the next Acquire, releaseWithNextRequest),
//     and the same cycle on the peers: Redis 7 (appendfsync always, and no persistence; SET NX
//     PX + compare-and-delete, with and without an INCR token) and etcd 3.4 (lease,
//     create-if-absent transaction, delete). A thread per client, as worker code runs; and the
//     raw driver and Redis also with every client on one thread (one epoll set, as
//     redis-benchmark drives Redis), which measures the server rather than what 64 client
//     threads cost a 2-core machine. Rounds are interleaved (A B C A B C ...) and each
//     figure is the min / median / max over --rounds;
//   - margin sweep: the payout demo's processes at each margin and TTL (margin_sweep.h);
//   - payout scaling (--demo): the payout demo without faults at each of --scaling-workers,
//     interleaved rounds, with its reconciliation (paid once, the must-be-zero counters).
// Progress goes to stderr (workload, elapsed, current rate). With --out, DIR gets results.json,
// summary.md and the PNG plots (gnuplot); the summary also goes to stdout.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <iterator>
#include <map>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "clock/clock.h"
#include "fencelock/wire.pb.h"
#include "lock-client/client.h"
#include "metrics/metrics.h"
#include "lock-server/blocking_connection.h"
#include "common.h"
#include "margin_sweep.h"
#include "peers.h"
#include "process/flags.h"
#include "process/process.h"
#include "protocol/requests.h"

ABSL_FLAG(std::string, lockd, "", "path to the lockd binary");
ABSL_FLAG(std::string, out, "", "folder for results.json and summary.md (default: none)");
ABSL_FLAG(std::string, sessions, "1000,10000", "session counts of the heartbeat workload");
ABSL_FLAG(double, seconds, 20.0, "measuring time of each heartbeat variant");
ABSL_FLAG(absl::Duration, heartbeat, absl::Milliseconds(3500),
          "the raw driver's heartbeat period (the library's own: a third of the session TTL, or "
          "less when a declared step needs it)");
ABSL_FLAG(absl::Duration, session_ttl, absl::Seconds(15), "session and lock TTL");
ABSL_FLAG(double, margin, 0.30, "lock.client.safety-margin, for the 6.5 verdict");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5), "a KeepAlive's timeout");
ABSL_FLAG(int, load_clients, 8, "connections of the durable lock-cycle load");
ABSL_FLAG(int, library_sessions, 1000,
          "clients of the heartbeat workload through the client library (0: none)");
ABSL_FLAG(absl::Duration, library_heartbeat, absl::ZeroDuration(),
          "their heartbeat period (0: the library's own, a third of the shortest TTL)");
ABSL_FLAG(std::string, cycle_clients, "1,8,64", "client counts of the lock-cycle workload");
ABSL_FLAG(double, cycle_seconds, 2.0, "measuring time of each lock-cycle run");
ABSL_FLAG(int, rounds, 3, "interleaved rounds of the lock-cycle workload (min/median/max over them)");
ABSL_FLAG(std::string, systems, "",
          "lock-cycle systems to run, by their results.json keys (empty: all); for profiling one");
ABSL_FLAG(std::string, peers, "redis,etcd", "peers measured beside lockd: redis, etcd (empty: none)");
ABSL_FLAG(std::string, redis, "/usr/bin/redis-server", "the redis-server binary (Debian's redis-server)");
ABSL_FLAG(std::string, etcd, "/usr/bin/etcd", "the etcd binary (Debian's etcd-server)");
ABSL_FLAG(std::string, rail, "", "the payout-rail binary, for the margin sweep (empty: no sweep)");
ABSL_FLAG(std::string, worker, "", "the payout-worker binary, for the margin sweep");
ABSL_FLAG(std::string, margins, "0.1,0.2,0.3,0.4,0.45,0.48,0.5,0.6", "margins of the sweep");
ABSL_FLAG(std::string, margin_ttls, "5s,15s", "TTLs of the sweep (session = lock TTL)");
ABSL_FLAG(double, margin_seconds, 4.0, "capacity phase of each margin-sweep point (a backlog)");
ABSL_FLAG(double, margin_arrival_seconds, 5.0, "arrivals phase of each margin-sweep point");
ABSL_FLAG(double, margin_arrival_rate, 100.0, "payouts arriving per second in the arrivals phase");
ABSL_FLAG(int, margin_workers, 4, "payout workers at each margin-sweep point");
ABSL_FLAG(std::string, gnuplot, "/usr/bin/gnuplot", "gnuplot, for the PNG plots (empty: none)");
ABSL_FLAG(std::string, demo, "",
          "the payout-demo binary, for the payout scaling workload (empty: none; needs --rail "
          "and --worker)");
ABSL_FLAG(std::string, scaling_workers, "1,4,8", "worker counts of the payout scaling workload");
ABSL_FLAG(int, scaling_payouts, 300, "payouts each payout scaling run pays");

namespace fencelock::bench {
namespace {

using server::BlockingConnection;
namespace req = protocol::request;
using fencelock::Client;

// --- floors ------------------------------------------------------------------------------

Percentiles FsyncFloor(const std::string& dir) {
  const std::string path = dir + "/fsync-probe";
  const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  std::vector<int64_t> ns;
  if (fd < 0) return {};
  const std::string block(4096, 'x');
  for (int i = 0; i < 200; ++i) {
    const MonoTime start = Now();
    if (pwrite(fd, block.data(), block.size(), static_cast<off_t>(i) * 4096) < 0) break;
    if (fdatasync(fd) != 0) break;
    ns.push_back((Now() - start) / absl::Nanoseconds(1));
  }
  close(fd);
  std::filesystem::remove(path);
  return Summarize(ns);
}

Percentiles LoopbackFloor() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return {};
  }
  std::thread echo([listener] {
    const int c = accept(listener, nullptr, nullptr);
    char buf[64];
    for (;;) {
      ssize_t n = read(c, buf, sizeof(buf));
      if (n <= 0) break;
      if (write(c, buf, static_cast<size_t>(n)) != n) break;
    }
    close(c);
  });
  const int c = socket(AF_INET, SOCK_STREAM, 0);
  std::vector<int64_t> ns;
  if (connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    char buf[64] = {};
    for (int i = 0; i < 5000; ++i) {
      const MonoTime start = Now();
      if (write(c, buf, sizeof(buf)) != sizeof(buf)) break;
      size_t got = 0;
      while (got < sizeof(buf)) {
        const ssize_t n = read(c, buf + got, sizeof(buf) - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      ns.push_back((Now() - start) / absl::Nanoseconds(1));
    }
  }
  close(c);
  echo.join();
  close(listener);
  return Summarize(ns);
}

// --- lockd ---------------------------------------------------------------------------------

class Lockd {
 public:
  static absl::StatusOr<std::unique_ptr<Lockd>> Start(const std::string& binary,
                                                      const std::string& dir) {
    std::filesystem::create_directories(dir);
    auto init = process::Child::Spawn(binary, {"init", "--data-dir=" + dir + "/state"},
                                      {.stdout_file = dir + "/init.out"});
    if (!init.ok()) return init.status();
    (void)init->Wait(absl::Seconds(30));
    auto child = process::Child::Spawn(
        binary,
        {"serve", "--data-dir=" + dir + "/state", "--port=0", "--port-file=" + dir + "/port",
         "--metrics-port=-1", "--max-connections=4096", "--max-connections-per-peer=4096"},
        {.stdout_file = dir + "/lockd.out", .stderr_file = dir + "/lockd.err"});
    if (!child.ok()) return child.status();
    auto port = process::AwaitPortFile(dir + "/port", *child, absl::Seconds(30));
    if (!port.ok()) return port.status();
    auto l = std::unique_ptr<Lockd>(new Lockd);
    l->child_ = std::move(*child);
    l->address_ = absl::StrCat("127.0.0.1:", *port);
    return l;
  }
  ~Lockd() { (void)child_.Stop(); }
  const std::string& address() const { return address_; }

 private:
  Lockd() = default;
  process::Child child_;
  std::string address_;
};

absl::StatusOr<std::unique_ptr<BlockingConnection>> Connect(const std::string& address) {
  return BlockingConnection::Connect(
      {.server = address, .timeout = absl::GetFlag(FLAGS_timeout), .client_name = "bench"});
}

// One connection's sessions, each holding the lock hb/<id>.
struct Heartbeater {
  std::unique_ptr<BlockingConnection> conn;
  std::vector<std::pair<uint64_t, uint64_t>> sessions;  // session id, token
};

absl::Status OpenSessions(Heartbeater& h, const std::string& address, size_t count,
                          size_t first) {
  auto conn = Connect(address);
  if (!conn.ok()) return conn.status();
  h.conn = std::move(*conn);
  const absl::Duration ttl = absl::GetFlag(FLAGS_session_ttl);
  for (size_t i = 0; i < count; ++i) {
    auto opened = h.conn->Call(req::OpenSession(ttl));
    if (!opened.ok()) return opened.status();
    if (opened->code() != wire::OK) return absl::UnavailableError(opened->message());
    const uint64_t session = opened->open_session().session_id();
    auto granted = h.conn->Call(
        req::Acquire(session, absl::StrCat("hb/", first + i), absl::ZeroDuration(), ttl));
    if (!granted.ok()) return granted.status();
    if (granted->code() != wire::OK) return absl::UnavailableError(granted->message());
    h.sessions.emplace_back(session, granted->acquire().token());
  }
  return absl::OkStatus();
}

struct HeartbeatResult {
  Percentiles rtt;
  std::vector<int64_t> rtt_ns;  // every sample, for the histogram
  size_t timeouts = 0;
  size_t failures = 0;
  double cycles_per_second = 0;  // of the load, when loaded
};

// Every session renews once per period, spread evenly over it, until `seconds` pass.
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
  // The durable load: each client acquires and releases its own lock as fast as it can.
  for (int c = 0; c < load_clients; ++c) {
    threads.emplace_back([&, c] {
      auto conn = Connect(address);
      if (!conn.ok()) return;
      auto opened = (*conn)->Call(req::OpenSession(absl::Minutes(1)));
      if (!opened.ok() || opened->code() != wire::OK) return;
      const uint64_t session = opened->open_session().session_id();
      const std::string lock = absl::StrCat("load/", c);
      while (!stop.load()) {
        auto g = (*conn)->Call(req::Acquire(session, lock));
        if (!g.ok() || g->code() != wire::OK) break;
        if (auto rel = (*conn)->Call(req::Release(session, lock, g->acquire().token()));
            !rel.ok() || rel->code() != wire::OK) {
          break;
        }
        ++cycles;
      }
    });
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

// --- heartbeat RTT through the client library -----------------------------------------------

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

struct LibraryHeartbeatResult {
  double heartbeats = 0, failures = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0;  // milliseconds, from the histogram's buckets
  double cycles_per_second = 0;
};

// Clients of the library, each holding one lock and renewing it on the library's own heartbeat
// (its default period), all counting into one registry; read over `seconds`, idle then loaded.
std::vector<LibraryHeartbeatResult> RunLibraryHeartbeats(const std::string& address, size_t n,
                                                         double seconds, int load_clients,
                                                         std::string* error) {
  auto registry = std::make_shared<metrics::Registry>();
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<LockHandle> handles;
  std::fprintf(stderr, "heartbeat through the library: %zu clients, each with a session and a lock\n", n);
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

// --- lock cycles ---------------------------------------------------------------------------

// acquire (waiting up to 10 s) + release through fencelock::Client: what worker code sees.
// Pipelined, the release is releaseWithNextRequest(): it travels with the next cycle's acquire.
class LibraryCycler : public Cycler {
 public:
  LibraryCycler(std::unique_ptr<Client> client, std::string lock, bool pipelined)
      : client_(std::move(client)), lock_(std::move(lock)), pipelined_(pipelined) {}
  absl::StatusOr<int64_t> Cycle() override {
    const MonoTime start = Now();
    auto handle = client_->acquire(lock_, absl::Seconds(10));
    if (!handle.ok()) return handle.status();
    const int64_t took = NanosSince(start);
    absl::Status s = pipelined_ ? client_->releaseWithNextRequest(*handle) : client_->release(*handle);
    if (!s.ok()) return s;
    return took;
  }

 private:
  std::unique_ptr<Client> client_;
  const std::string lock_;
  const bool pipelined_;
};

// The same two requests over a BlockingConnection, without the client's lease bookkeeping:
// what lockd can do.
class RawCycler : public Cycler {
 public:
  RawCycler(std::unique_ptr<BlockingConnection> conn, uint64_t session, std::string lock,
            bool wait)
      : conn_(std::move(conn)), session_(session), lock_(std::move(lock)), wait_(wait) {}
  absl::StatusOr<int64_t> Cycle() override {
    const MonoTime start = Now();
    auto g = conn_->Call(
        req::Acquire(session_, lock_, wait_ ? absl::Seconds(10) : absl::ZeroDuration()));
    if (!g.ok()) return g.status();
    if (g->code() != wire::OK || !g->acquire().granted()) {
      return absl::FailedPreconditionError(absl::StrCat("acquire: ", g->message()));
    }
    const int64_t took = NanosSince(start);
    auto rel = conn_->Call(req::Release(session_, lock_, g->acquire().token()));
    if (!rel.ok()) return rel.status();
    if (rel->code() != wire::OK) return absl::FailedPreconditionError(absl::StrCat("release: ", rel->message()));
    return took;
  }

 private:
  std::unique_ptr<BlockingConnection> conn_;
  const uint64_t session_;
  const std::string lock_;
  const bool wait_;
};

// The raw driver pipelined: each cycle's Release goes out, unanswered, in one write with the
// next cycle's Acquire, and both answers are read then.
class PipelinedRawCycler : public Cycler {
 public:
  PipelinedRawCycler(std::unique_ptr<BlockingConnection> conn, uint64_t session, std::string lock)
      : conn_(std::move(conn)), session_(session), lock_(std::move(lock)) {}
  ~PipelinedRawCycler() override {
    // The last cycle's lock, so that the next run's sessions find it free.
    if (token_ == 0) return;
    (void)conn_->Call(req::Release(session_, lock_, token_));
  }
  absl::StatusOr<int64_t> Cycle() override {
    const MonoTime start = Now();
    std::vector<wire::Request> requests;
    if (token_ != 0) requests.push_back(req::Release(session_, lock_, token_));
    requests.push_back(req::Acquire(session_, lock_, absl::Seconds(10)));
    // One write, as the library's releaseWithNextRequest() makes.
    auto ids = conn_->SendAll(std::move(requests));
    if (!ids.ok()) return ids.status();
    const std::optional<uint64_t> release_id =
        ids->size() == 2 ? std::optional<uint64_t>(ids->front()) : std::nullopt;
    const uint64_t* acquire_id = &ids->back();
    for (;;) {
      auto reply = conn_->Receive(absl::Seconds(10));
      if (!reply.ok()) return reply.status();
      if (release_id.has_value() && reply->request_id() == *release_id) {
        if (reply->code() != wire::OK) {
          return absl::FailedPreconditionError(absl::StrCat("release: ", reply->message()));
        }
        continue;
      }
      if (reply->request_id() != *acquire_id) continue;
      if (reply->code() != wire::OK || !reply->acquire().granted()) {
        return absl::FailedPreconditionError(absl::StrCat("acquire: ", reply->message()));
      }
      token_ = reply->acquire().token();
      return NanosSince(start);
    }
  }

 private:
  std::unique_ptr<BlockingConnection> conn_;
  const uint64_t session_;
  const std::string lock_;
  uint64_t token_ = 0;  // held since the last cycle, released by the next
};

// The raw driver's requests (RawCycler's, or pipelined PipelinedRawCycler's) on the one-thread
// driver, RunStreamCycles.
class LockdStreamCycler : public StreamCycler {
 public:
  LockdStreamCycler(std::unique_ptr<BlockingConnection> conn, uint64_t session, std::string lock,
                    bool pipelined)
      : conn_(std::move(conn)), session_(session), lock_(std::move(lock)), pipelined_(pipelined) {}

  int fd() const override { return conn_->fd(); }
  void Begin(std::string* out) override { SendAcquire(out); }

  absl::StatusOr<bool> Feed(std::string_view in, bool stop, std::string* out,
                            std::vector<int64_t>* acquire_ns) override {
    decoder_.Feed(in);
    std::string payload;
    for (;;) {
      const auto next = decoder_.Next(&payload);
      if (next == protocol::FrameDecoder::Result::kNeedMore) break;
      if (next == protocol::FrameDecoder::Result::kTooLarge) {
        return absl::DataLossError("lockd sent a frame above the maximum size");
      }
      wire::Response reply;
      if (!reply.ParseFromString(payload)) return absl::DataLossError("lockd sent a reply that does not parse");
      if (release_id_ != 0 && reply.request_id() == release_id_) {
        if (reply.code() != wire::OK) {
          return absl::FailedPreconditionError(absl::StrCat("release: ", reply.message()));
        }
        release_id_ = 0;
        if (!pipelined_ && !stop) SendAcquire(out);
        continue;
      }
      if (acquire_id_ == 0 || reply.request_id() != acquire_id_) continue;  // a push
      if (reply.code() != wire::OK || !reply.acquire().granted()) {
        return absl::FailedPreconditionError(absl::StrCat("acquire: ", reply.message()));
      }
      acquire_id_ = 0;
      acquire_ns->push_back(NanosSince(started_));
      // Pipelined, the Release travels in one write with the next cycle's Acquire.
      SendRelease(reply.acquire().token(), out);
      if (pipelined_ && !stop) SendAcquire(out);
    }
    return acquire_id_ == 0 && release_id_ == 0;
  }

 private:
  void SendAcquire(std::string* out) {
    wire::Request a = req::Acquire(session_, lock_, absl::Seconds(10));
    a.set_request_id(acquire_id_ = ++next_id_);
    started_ = Now();
    (void)protocol::AppendFrame(a.SerializeAsString(), out);
  }
  void SendRelease(uint64_t token, std::string* out) {
    wire::Request r = req::Release(session_, lock_, token);
    r.set_request_id(release_id_ = ++next_id_);
    (void)protocol::AppendFrame(r.SerializeAsString(), out);
  }

  std::unique_ptr<BlockingConnection> conn_;
  const uint64_t session_;
  const std::string lock_;
  const bool pipelined_;
  protocol::FrameDecoder decoder_;
  uint64_t next_id_ = uint64_t{1} << 32;  // above the ids the setup's calls took
  uint64_t acquire_id_ = 0, release_id_ = 0;  // in flight (0: none)
  MonoTime started_;
};

std::string CycleLock(int client, bool contended) {
  return contended ? std::string("cycle") : absl::StrCat("cycle/", client);
}

CyclerFactory LibraryCyclers(const std::string& address, bool contended, bool pipelined = false) {
  return [address, contended, pipelined](int client) -> absl::StatusOr<std::unique_ptr<Cycler>> {
    auto c = Client::Create({.server = address});
    if (!c.ok()) return c.status();
    return std::make_unique<LibraryCycler>(std::move(*c), CycleLock(client, contended), pipelined);
  };
}

// A connection with a session of its own (60 s), for the raw drivers.
absl::StatusOr<std::pair<std::unique_ptr<BlockingConnection>, uint64_t>> ConnectWithSession(
    const std::string& address) {
  auto conn = Connect(address);
  if (!conn.ok()) return conn.status();
  auto opened = (*conn)->Call(req::OpenSession(absl::Minutes(1)));
  if (!opened.ok()) return opened.status();
  if (opened->code() != wire::OK) return absl::UnavailableError(opened->message());
  return std::make_pair(std::move(*conn), opened->open_session().session_id());
}

StreamCyclerFactory LockdStreamCyclers(const std::string& address, bool pipelined) {
  return [address, pipelined](int client) -> absl::StatusOr<std::unique_ptr<StreamCycler>> {
    auto c = ConnectWithSession(address);
    if (!c.ok()) return c.status();
    return std::make_unique<LockdStreamCycler>(std::move(c->first), c->second,
                                               CycleLock(client, false), pipelined);
  };
}

CyclerFactory RawCyclers(const std::string& address, bool contended, bool pipelined = false) {
  return [address, contended, pipelined](int client) -> absl::StatusOr<std::unique_ptr<Cycler>> {
    auto c = ConnectWithSession(address);
    if (!c.ok()) return c.status();
    auto conn = std::move(c->first);
    const uint64_t session = c->second;
    if (pipelined) {
      return std::make_unique<PipelinedRawCycler>(std::move(conn), session,
                                                  CycleLock(client, contended));
    }
    return std::make_unique<RawCycler>(std::move(conn), session, CycleLock(client, contended),
                                       contended);
  };
}

// One system of the lock-cycle comparison.
struct System {
  std::string key;   // in results.json and the plot's data
  std::string name;  // in the tables and the plot
  CyclerFactory make;  // a thread per client (RunCycles); or, when empty:
  bool fencelock = false;
  StreamCyclerFactory stream = nullptr;  // every client on one thread (RunStreamCycles)
};

// One system at one client count, over the rounds.
struct Runs {
  std::vector<double> rates;
  std::vector<int64_t> acquire_ns;
  size_t errors = 0;
  std::string first_error;
  double min() const { return rates.empty() ? 0 : *std::min_element(rates.begin(), rates.end()); }
  double max() const { return rates.empty() ? 0 : *std::max_element(rates.begin(), rates.end()); }
  double median() const {
    if (rates.empty()) return 0;
    std::vector<double> r = rates;
    std::sort(r.begin(), r.end());
    return r.size() % 2 == 1 ? r[r.size() / 2] : (r[r.size() / 2 - 1] + r[r.size() / 2]) / 2;
  }
};

// --- plots ---------------------------------------------------------------------------------

// Writes DIR/NAME.gp and runs gnuplot on it; the script writes DIR/NAME.png.
absl::Status Gnuplot(const std::string& gnuplot, const std::string& dir, const std::string& name,
                     const std::string& body) {
  const std::string png = dir + "/" + name + ".png";
  const std::string script = dir + "/" + name + ".gp";
  std::ofstream(script) << "set terminal pngcairo size 1100," << (name == "margin_sweep" ? 1100 : 650) << " font 'Sans,11'\nset output '"
                        << png << "'\nset grid\nset key outside right top\n"
                        << body;
  auto child = process::Child::Spawn(gnuplot, {script}, {.stdout_file = dir + "/gnuplot.log",
                                                         .stderr_file = dir + "/gnuplot.log"});
  if (!child.ok()) return child.status();
  const std::optional<int> status = child->Wait(absl::Seconds(60));
  if (!status.has_value()) {
    (void)child->Stop();
    return absl::DeadlineExceededError(absl::StrCat("gnuplot ", script, " took over 60 s"));
  }
  if (*status != 0 || !std::filesystem::exists(png) || std::filesystem::file_size(png) == 0) {
    return absl::InternalError(absl::StrCat("gnuplot ", script, " failed (",
                                            process::DescribeStatus(*status), "); see ", dir,
                                            "/gnuplot.log"));
  }
  return absl::OkStatus();
}

// One payout demo run without faults, from its --report_json.
struct DemoRun {
  bool ok = false;
  double payouts_per_second = 0;
  int64_t paid_once = 0, paid_twice = 0, left = 0, lock_fenced_out = 0, rail_duplicates = 0;
};

// The number after "key": in the demo's report (a flat JSON object of numbers and booleans).
absl::StatusOr<double> ReportNumber(const std::string& report, const std::string& key) {
  const std::string needle = absl::StrCat("\"", key, "\": ");
  const size_t at = report.find(needle);
  if (at == std::string::npos) return absl::DataLossError(absl::StrCat("no \"", key, "\" in the demo's report"));
  double value = 0;
  const char* begin = report.data() + at + needle.size();
  if (std::strncmp(begin, "true", 4) == 0) return 1;
  if (std::strncmp(begin, "false", 5) == 0) return 0;
  auto [end, ec] = std::from_chars(begin, report.data() + report.size(), value);
  if (ec != std::errc()) return absl::DataLossError(absl::StrCat("\"", key, "\" in the demo's report is not a number"));
  return value;
}

absl::StatusOr<DemoRun> RunDemo(const std::string& demo, const std::string& lockd,
                                const std::string& rail, const std::string& worker,
                                const std::string& dir, int workers, int payouts) {
  std::filesystem::create_directories(dir);
  const std::string report = dir + "/report.json";
  auto child = process::Child::Spawn(
      demo,
      {absl::StrCat("--workers=", workers), absl::StrCat("--payouts=", payouts), "--freeze=0",
       "--kill=false", "--state_dir=" + dir + "/state", "--report_json=" + report,
       "--lockd_binary=" + lockd, "--rail_binary=" + rail, "--worker_binary=" + worker},
      {.stdout_file = dir + "/demo.log", .stderr_file = dir + "/demo.log"});
  if (!child.ok()) return child.status();
  const std::optional<int> status = child->Wait(absl::Minutes(5));
  if (!status.has_value()) {
    (void)child->Stop();
    return absl::DeadlineExceededError(absl::StrCat("the payout demo took over 5 min; see ", dir, "/demo.log"));
  }
  std::ifstream in(report);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.empty()) {
    return absl::InternalError(absl::StrCat("the payout demo wrote no report (",
                                            process::DescribeStatus(*status), "); see ", dir, "/demo.log"));
  }
  DemoRun run;
  for (auto [key, field] : std::vector<std::pair<const char*, int64_t*>>{
           {"paid_once", &run.paid_once}, {"paid_twice", &run.paid_twice}, {"left", &run.left},
           {"lock_fenced_out_total", &run.lock_fenced_out},
           {"rail_duplicate_attempted_total", &run.rail_duplicates}}) {
    auto v = ReportNumber(text, key);
    if (!v.ok()) return v.status();
    *field = static_cast<int64_t>(*v);
  }
  auto rate = ReportNumber(text, "payouts_per_second");
  if (!rate.ok()) return rate.status();
  run.payouts_per_second = *rate;
  auto ok = ReportNumber(text, "ok");
  if (!ok.ok()) return ok.status();
  run.ok = *ok != 0 && *status == 0;
  return run;
}

// Colours that stay apart on a white page, one per line of a plot.
const char* Colour(size_t i) {
  static constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                             "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  return kColours[i % (sizeof(kColours) / sizeof(kColours[0]))];
}

// gnuplot reads its data from a file; a title inside double quotes must not hold one.
std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

struct HeartbeatVariant {
  size_t sessions;
  bool loaded;
  HeartbeatResult result;
};

// The share of heartbeats per RTT bucket, 10 buckets a decade from 10 us to 10 s.
std::string HeartbeatPlot(const std::vector<HeartbeatVariant>& variants, double threshold_ms,
                          const std::string& data_path) {
  std::string data = "rtt_ms";
  for (const HeartbeatVariant& v : variants) {
    absl::StrAppend(&data, " ", Quoted(absl::StrCat(v.sessions, " sessions, ", v.loaded ? "loaded" : "idle")));
  }
  data += "\n";
  constexpr int kPerDecade = 10;
  for (int b = 0; b < 6 * kPerDecade; ++b) {
    const double lo = 0.01 * std::pow(10.0, static_cast<double>(b) / kPerDecade);
    const double hi = 0.01 * std::pow(10.0, static_cast<double>(b + 1) / kPerDecade);
    absl::StrAppend(&data, absl::StrFormat("%.5f", lo));
    for (const HeartbeatVariant& v : variants) {
      size_t n = 0;
      for (int64_t ns : v.result.rtt_ns) {
        const double ms = static_cast<double>(ns) / 1e6;
        if (ms >= lo && ms < hi) ++n;
      }
      const double share = v.result.rtt_ns.empty() ? 0 : 100.0 * static_cast<double>(n) /
                                                             static_cast<double>(v.result.rtt_ns.size());
      absl::StrAppend(&data, " ", share > 0 ? absl::StrFormat("%.5f", share) : std::string("NaN"));
    }
    data += "\n";
  }
  std::ofstream(data_path) << data;
  return absl::StrCat(
      "set title 'Heartbeat RTT (KeepAlive round trip), share of heartbeats per bucket'\n"
      "set xlabel 'RTT (ms, log scale; 10 buckets a decade)'\nset ylabel 'heartbeats (%, log scale)'\n"
      "set logscale xy\nset xrange [0.01:", std::max(10'000.0, threshold_ms * 2), "]\n",
      "set arrow from ", threshold_ms, ", graph 0 to ", threshold_ms,
      ", graph 1 nohead dt 2 lw 2 lc rgb 'red'\n",
      "set label 'ADR-006 6.5 threshold: lease x margin / 3 = ", absl::StrFormat("%.0f", threshold_ms),
      " ms' at ", threshold_ms, ", graph 0.95 right offset -1,0 tc rgb 'red'\n",
      "plot for [i=2:", variants.size() + 1, "] '", data_path,
      "' using 1:i with steps lw 2 title columnheader(i)\n");
}

std::string CyclesPlot(const std::vector<System>& systems, const std::vector<int>& clients,
                       const std::vector<std::vector<Runs>>& runs, const std::string& data_path) {
  std::string data;
  for (size_t c = 0; c < clients.size(); ++c) {
    absl::StrAppend(&data, clients[c]);
    for (size_t s = 0; s < systems.size(); ++s) {
      absl::StrAppend(&data, absl::StrFormat(" %.1f %.1f %.1f", runs[s][c].median(), runs[s][c].min(),
                                             runs[s][c].max()));
    }
    data += "\n";
  }
  std::ofstream(data_path) << data;
  std::string plot = absl::StrCat(
      "set title 'Lock cycles (acquire + release, closed loop): median of the rounds, bars min to max'\n"
      "set xlabel 'clients (log scale)'\nset ylabel 'cycles per second (log scale)'\n"
      "set logscale xy\nset xrange [0.7:", clients.empty() ? 100 : clients.back() * 1.5, "]\n",
      "set xtics (", absl::StrJoin(clients, ", "), ")\nplot ");
  for (size_t s = 0; s < systems.size(); ++s) {
    absl::StrAppend(&plot, s == 0 ? "" : ", \\\n     ", "'", data_path, "' using 1:", 2 + 3 * s,
                    ":", 3 + 3 * s, ":", 4 + 3 * s, " with yerrorlines lw ",
                    systems[s].fencelock ? 3 : 2, " dt ", systems[s].fencelock ? 1 : 2, " lc rgb '",
                    Colour(s), "' title ", Quoted(systems[s].name));
  }
  return plot + "\n";
}

std::string MarginPlot(const std::vector<MarginPoint>& points, const std::string& data_path) {
  std::string data;
  std::vector<absl::Duration> ttls;
  for (const MarginPoint& p : points) {
    if (ttls.empty() || ttls.back() != p.ttl) {
      if (!ttls.empty()) data += "\n\n";
      ttls.push_back(p.ttl);
    }
    absl::StrAppend(&data, absl::StrFormat("%.2f %.2f %.3f %d %.3f\n", p.margin, p.payouts_per_second,
                                           p.refused ? NAN : p.renewals_per_second,
                                           static_cast<int>(p.abandoned_total), p.backlog_age_seconds));
  }
  std::ofstream(data_path) << data;
  std::string marks;
  for (size_t t = 0; t < ttls.size(); ++t) {
    const double cost = absl::ToDoubleSeconds(points.front().submit_cost);
    const double limit = 1.0 - cost / absl::ToDoubleSeconds(ttls[t]);
    if (limit > 0 && limit < 1) {
      absl::StrAppend(&marks, "set arrow from ", limit, ", graph 0 to ", limit,
                      ", graph 1 nohead dt 2 lw 2 lc ", t + 1, "\n", "set label 'TTL ",
                      absl::FormatDuration(ttls[t]), ": lease x (1 - m) = submit cost (",
                      absl::StrFormat("%.0f", cost * 1000), " ms) at m = ", absl::StrFormat("%.3f", limit),
                      "' at ", limit, ", graph ", 0.9 - 0.08 * static_cast<double>(t),
                      " right offset -1,0 tc lt ", t + 1, "\n");
    }
  }
  // One panel: column `column` of the data against the margin, a line per TTL.
  auto panel = [&](const std::string& settings, int column) {
    std::string p = settings + "plot ";
    for (size_t t = 0; t < ttls.size(); ++t) {
      absl::StrAppend(&p, t == 0 ? "" : ", ", "'", data_path, "' index ", t, " using 1:", column,
                      " with linespoints lw 2 lc ", t + 1, " title 'TTL ",
                      absl::FormatDuration(ttls[t]), "'");
    }
    return p + "\n";
  };
  std::string plot = absl::StrCat(
      "set multiplot layout 3,1\nset xrange [0:0.9]\nset xlabel 'safety margin'\n", marks,
      panel("set title 'Margin sweep, the payout workload: capacity (dashed: where lease x "
            "(1 - margin) no longer covers one submit)'\nset ylabel 'payouts per second'\n"
            "set yrange [0:*]\n",
            2),
      panel("set title 'Backlog age: the oldest unpaid payout as the arrivals end'\n"
            "set ylabel 'seconds'\nset yrange [0:*]\n",
            5),
      panel("set title 'Lease renewals (heartbeats of all workers)'\n"
            "set ylabel 'renewals per second (log scale)'\nset logscale y\nset yrange [*:*]\n",
            3));
  return plot + "unset multiplot\n";
}

// --- the run -------------------------------------------------------------------------------

int Fail(const std::string& message) {
  std::fprintf(stderr, "fencelock-bench: %s\n", message.c_str());
  return 2;
}

template <typename T>
bool ParseList(const std::string& flag, const std::string& text, T lo, T hi, std::vector<T>* out,
               std::string* error) {
  for (absl::string_view s : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    T v{};
    bool ok;
    if constexpr (std::is_same_v<T, absl::Duration>) {
      ok = absl::ParseDuration(s, &v);
    } else if constexpr (std::is_floating_point_v<T>) {
      ok = absl::SimpleAtod(s, &v);
    } else {
      ok = absl::SimpleAtoi(s, &v);
    }
    if (!ok || !(v >= lo && v <= hi)) {
      auto show = [](T x) {
        if constexpr (std::is_same_v<T, absl::Duration>) {
          return absl::FormatDuration(x);
        } else {
          return absl::StrCat(x);
        }
      };
      *error = absl::StrCat("--", flag, " wants a comma-separated list of values from ", show(lo),
                            " to ", show(hi), ", got \"", std::string(s), "\"");
      return false;
    }
    out->push_back(v);
  }
  return true;
}

int Main() {
  const std::string binary = absl::GetFlag(FLAGS_lockd);
  if (binary.empty()) return Fail("--lockd=PATH is required");
  const double seconds = absl::GetFlag(FLAGS_seconds);
  if (!(seconds > 0 && seconds <= 3600)) return Fail("--seconds must be in (0, 3600]");
  const double cycle_seconds = absl::GetFlag(FLAGS_cycle_seconds);
  if (!(cycle_seconds > 0 && cycle_seconds <= 600)) return Fail("--cycle-seconds must be in (0, 600]");
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (rounds < 1 || rounds > 20) return Fail("--rounds must be 1 to 20");
  const double margin_seconds = absl::GetFlag(FLAGS_margin_seconds);
  if (!(margin_seconds > 0 && margin_seconds <= 600)) return Fail("--margin-seconds must be in (0, 600]");
  const double arrival_seconds = absl::GetFlag(FLAGS_margin_arrival_seconds);
  if (!(arrival_seconds > 0 && arrival_seconds <= 600)) return Fail("--margin-arrival-seconds must be in (0, 600]");
  const double arrival_rate = absl::GetFlag(FLAGS_margin_arrival_rate);
  if (!(arrival_rate > 0 && arrival_rate <= 10'000)) return Fail("--margin-arrival-rate must be in (0, 10000]");
  const int margin_workers = absl::GetFlag(FLAGS_margin_workers);
  if (margin_workers < 1 || margin_workers > 64) return Fail("--margin-workers must be 1 to 64");
  for (const auto& [flag, d, lo, hi] :
       {std::tuple{"--heartbeat", absl::GetFlag(FLAGS_heartbeat), absl::Milliseconds(1), absl::Minutes(10)},
        std::tuple{"--timeout", absl::GetFlag(FLAGS_timeout), absl::Milliseconds(1), absl::Minutes(10)},
        std::tuple{"--session-ttl", absl::GetFlag(FLAGS_session_ttl), absl::Seconds(1), absl::Hours(1)},
        std::tuple{"--library-heartbeat", absl::GetFlag(FLAGS_library_heartbeat), absl::ZeroDuration(),
                   absl::Minutes(10)}}) {
    // A period of zero or less would never move the raw driver's schedule: it would spin.
    if (d < lo || d > hi) {
      return Fail(absl::StrCat(flag, " must be from ", absl::FormatDuration(lo), " to ",
                               absl::FormatDuration(hi), ", got ", absl::FormatDuration(d)));
    }
  }
  if (const int n = absl::GetFlag(FLAGS_library_sessions); n < 0 || n > 20'000) {
    return Fail("--library-sessions must be 0 to 20000");
  }
  const int load_clients = absl::GetFlag(FLAGS_load_clients);
  if (load_clients < 0 || load_clients > 1024) return Fail("--load-clients must be 0 to 1024");
  std::string error;
  std::vector<size_t> counts;
  std::vector<int> clients;
  std::vector<double> margins;
  std::vector<absl::Duration> margin_ttls;
  std::vector<int> scaling_workers;
  if (!ParseList<int>("scaling-workers", absl::GetFlag(FLAGS_scaling_workers), 1, 64,
                      &scaling_workers, &error)) {
    return Fail(error);
  }
  const int scaling_payouts = absl::GetFlag(FLAGS_scaling_payouts);
  if (scaling_payouts < 1 || scaling_payouts > 1'000'000) {
    return Fail(absl::StrCat("--scaling-payouts must be from 1 to 1000000, got ", scaling_payouts));
  }
  if (!ParseList<size_t>("sessions", absl::GetFlag(FLAGS_sessions), 1, 100'000, &counts, &error) ||
      !ParseList<int>("cycle-clients", absl::GetFlag(FLAGS_cycle_clients), 1, 1024, &clients, &error) ||
      !ParseList<double>("margins", absl::GetFlag(FLAGS_margins), 0.0, 0.95, &margins, &error) ||
      !ParseList<absl::Duration>("margin-ttls", absl::GetFlag(FLAGS_margin_ttls), absl::Seconds(1),
                                 absl::Minutes(10), &margin_ttls, &error)) {
    return Fail(error);
  }
  bool want_redis = false, want_etcd = false;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_peers), ',', absl::SkipEmpty())) {
    if (p == "redis") {
      want_redis = true;
    } else if (p == "etcd") {
      want_etcd = true;
    } else {
      return Fail(absl::StrCat("--peers knows redis and etcd, not \"", std::string(p), "\""));
    }
  }
  // The lock-cycle systems by their results.json keys; which exist depends on --peers.
  const std::vector<std::string> system_keys = {
      "fencelock_library", "fencelock_raw", "fencelock_library_pipelined",
      "fencelock_raw_pipelined", "fencelock_library_one_lock", "fencelock_raw_one_lock",
      "fencelock_raw_one_thread", "fencelock_raw_one_thread_pipelined", "redis_fsync_always",
      "redis_fsync_always_incr", "redis_no_persistence", "redis_no_persistence_incr",
      "redis_fsync_always_one_thread", "redis_fsync_always_one_thread_pipelined", "etcd"};
  std::vector<std::string> only;
  for (absl::string_view key : absl::StrSplit(absl::GetFlag(FLAGS_systems), ',', absl::SkipEmpty())) {
    if (std::find(system_keys.begin(), system_keys.end(), key) == system_keys.end()) {
      return Fail(absl::StrCat("--systems: no system \"", std::string(key), "\"; the systems are ",
                               absl::StrJoin(system_keys, ", ")));
    }
    const bool redis = absl::StartsWith(key, "redis"), is_etcd = key == "etcd";
    if ((redis && !want_redis) || (is_etcd && !want_etcd)) {
      return Fail(absl::StrCat("--systems: ", std::string(key), " needs --peers to name ",
                               redis ? "redis" : "etcd"));
    }
    if (std::find(only.begin(), only.end(), key) != only.end()) {
      return Fail(absl::StrCat("--systems names ", std::string(key), " twice"));
    }
    only.emplace_back(key);
  }
  const std::string rail = absl::GetFlag(FLAGS_rail), worker = absl::GetFlag(FLAGS_worker);
  if (rail.empty() != worker.empty()) return Fail("--rail and --worker go together (the margin sweep)");
  const std::string demo = absl::GetFlag(FLAGS_demo);
  if (!demo.empty() && rail.empty()) return Fail("--demo needs --rail and --worker");
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::string gnuplot = out.empty() ? "" : absl::GetFlag(FLAGS_gnuplot);
  if (!gnuplot.empty() && access(gnuplot.c_str(), X_OK) != 0) {
    return Fail(absl::StrCat("--gnuplot=", gnuplot, " is not an executable (Debian: gnuplot-nox; "
                             "--gnuplot= for no plots)"));
  }
  if (!out.empty()) std::filesystem::create_directories(out);

  const char* tmp = std::getenv("TMPDIR");
  const std::string root = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/fencelock-bench-", getpid());
  const MonoTime run_start = Now();
  std::fprintf(stderr, "floors: fdatasync of 4 KiB in %s, loopback TCP round trip\n", root.c_str());
  std::filesystem::create_directories(root);
  const Percentiles fsync = FsyncFloor(root);
  const Percentiles loopback = LoopbackFloor();

  // --- heartbeat RTT
  const absl::Duration ttl = absl::GetFlag(FLAGS_session_ttl);
  const double margin = absl::GetFlag(FLAGS_margin);
  const double threshold_ms = absl::ToDoubleMilliseconds(ttl) * margin / 3;
  std::string json = absl::StrCat("{\n  \"floors\": {\"fdatasync_4k\": ", Json(fsync),
                                  ", \"loopback_rtt\": ", Json(loopback), "},\n",
                                  "  \"heartbeat\": {\"period_ms\": ",
                                  absl::ToDoubleMilliseconds(absl::GetFlag(FLAGS_heartbeat)),
                                  ", \"threshold_ms\": ", threshold_ms, ", \"runs\": [\n");
  std::string table =
      "| sessions | load | samples | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | timeouts | "
      "load cycles/s | 6.5 verdict |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<HeartbeatVariant> variants;
  bool broken = false;  // a refusal or error anywhere: the figures are not to be trusted
  for (size_t n : counts) {
    auto lockd = Lockd::Start(binary, absl::StrCat(root, "/lockd-", n));
    if (!lockd.ok()) return Fail(lockd.status().ToString());
    std::fprintf(stderr, "heartbeat: opening %zu sessions, each with a lock\n", n);
    const size_t per = 64;
    std::vector<Heartbeater> hs((n + per - 1) / per);
    std::vector<std::thread> openers;
    std::atomic<bool> failed{false};
    for (size_t i = 0; i < hs.size(); ++i) {
      openers.emplace_back([&, i] {
        const size_t count = std::min(per, n - i * per);
        if (absl::Status s = OpenSessions(hs[i], (*lockd)->address(), count, i * per); !s.ok()) {
          std::fprintf(stderr, "fencelock-bench: %s\n", s.ToString().c_str());
          failed = true;
        }
      });
    }
    for (std::thread& t : openers) t.join();
    if (failed) return 1;
    for (int loaded = 0; loaded <= 1; ++loaded) {
      HeartbeatResult r =
          RunHeartbeats(hs, seconds, absl::StrCat(n, " sessions, ", loaded ? "loaded" : "idle"),
                        (*lockd)->address(), loaded ? load_clients : 0);
      const bool ok = r.rtt.p99 <= threshold_ms;
      if (r.failures > 0 || r.rtt.samples == 0) broken = true;
      absl::StrAppend(&json, variants.empty() ? "" : ",\n", "    {\"sessions\": ", n, ", \"loaded\": ",
                      loaded ? "true" : "false", ", \"rtt\": ", Json(r.rtt), ", \"timeouts\": ",
                      r.timeouts, ", \"failures\": ", r.failures, ", \"load_cycles_per_s\": ",
                      r.cycles_per_second, ", \"p99_within_threshold\": ", ok ? "true" : "false",
                      "}");
      absl::StrAppend(&table, "| ", n, " | ", loaded ? absl::StrCat(load_clients, " clients") : "idle",
                      " | ", r.rtt.samples, " | ", Ms(r.rtt.p50), " | ", Ms(r.rtt.p90), " | ",
                      Ms(r.rtt.p99), " | ", Ms(r.rtt.p999), " | ", Ms(r.rtt.max), " | ", r.timeouts,
                      " | ", absl::StrFormat("%.0f", r.cycles_per_second), " | ",
                      ok ? "p99 within" : "p99 ABOVE", " ", absl::StrFormat("%.0f", threshold_ms),
                      " ms |\n");
      variants.push_back({n, loaded == 1, std::move(r)});
    }
  }
  absl::StrAppend(&json, "\n  ], \"library\": [\n");
  std::string library_table;
  if (const int n = absl::GetFlag(FLAGS_library_sessions); n > 0) {
    auto lockd = Lockd::Start(binary, absl::StrCat(root, "/lockd-library"));
    if (!lockd.ok()) return Fail(lockd.status().ToString());
    std::string library_error;
    const std::vector<LibraryHeartbeatResult> lib = RunLibraryHeartbeats(
        (*lockd)->address(), static_cast<size_t>(n), seconds, load_clients, &library_error);
    if (!library_error.empty()) {
      std::fprintf(stderr, "fencelock-bench: %s\n", library_error.c_str());
      broken = true;
    }
    library_table =
        "| clients | load | heartbeats | p50 ms | p90 ms | p99 ms | p99.9 ms | failed or timed out | "
        "load cycles/s | 6.5 verdict |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for (size_t i = 0; i < lib.size(); ++i) {
      const LibraryHeartbeatResult& r = lib[i];
      const bool ok = r.p99 <= threshold_ms;
      if (r.heartbeats == 0) broken = true;
      absl::StrAppend(&json, i == 0 ? "" : ",\n", "    {\"clients\": ", n, ", \"loaded\": ",
                      i == 1 ? "true" : "false", ", \"heartbeats\": ", r.heartbeats,
                      ", \"p50_ms\": ", r.p50, ", \"p90_ms\": ", r.p90, ", \"p99_ms\": ", r.p99,
                      ", \"p999_ms\": ", r.p999, ", \"failures\": ", r.failures,
                      ", \"load_cycles_per_s\": ", r.cycles_per_second, "}");
      absl::StrAppend(&library_table, "| ", n, " | ", i == 1 ? absl::StrCat(load_clients, " clients") : "idle",
                      " | ", absl::StrFormat("%.0f", r.heartbeats), " | ", Ms(r.p50), " | ", Ms(r.p90),
                      " | ", Ms(r.p99), " | ", Ms(r.p999), " | ", absl::StrFormat("%.0f", r.failures),
                      " | ", absl::StrFormat("%.0f", r.cycles_per_second), " | ",
                      ok ? "p99 within" : "p99 ABOVE", " ", absl::StrFormat("%.0f", threshold_ms), " ms |\n");
    }
  }
  absl::StrAppend(&json, "\n  ]},\n");

  // --- lock cycles: lockd and the peers, all started before the first round
  auto lockd = Lockd::Start(binary, absl::StrCat(root, "/lockd-cycles"));
  if (!lockd.ok()) return Fail(lockd.status().ToString());
  const std::string address = (*lockd)->address();
  std::vector<System> systems = {
      {"fencelock_library", "fencelock, library", LibraryCyclers(address, false), true},
      {"fencelock_raw", "fencelock, raw driver", RawCyclers(address, false), true},
      {"fencelock_library_pipelined", "fencelock, library, pipelined",
       LibraryCyclers(address, false, true), true},
      {"fencelock_raw_pipelined", "fencelock, raw driver, pipelined",
       RawCyclers(address, false, true), true},
      {"fencelock_library_one_lock", "fencelock, library, one lock", LibraryCyclers(address, true), true},
      {"fencelock_raw_one_lock", "fencelock, raw driver, one lock", RawCyclers(address, true), true},
      {"fencelock_raw_one_thread", "fencelock, raw driver, one thread", nullptr, true,
       LockdStreamCyclers(address, false)},
      {"fencelock_raw_one_thread_pipelined", "fencelock, raw driver, one thread, pipelined", nullptr,
       true, LockdStreamCyclers(address, true)},
  };
  std::unique_ptr<RedisPeer> redis_always, redis_none;
  std::unique_ptr<EtcdPeer> etcd;
  std::string versions;
  if (want_redis) {
    std::fprintf(stderr, "peers: starting Redis (appendfsync always, and no persistence)\n");
    auto a = RedisPeer::Start(absl::GetFlag(FLAGS_redis), root + "/redis-always",
                              RedisPeer::Persistence::kAppendFsyncAlways);
    if (!a.ok()) return Fail(absl::StrCat("redis: ", a.status().ToString()));
    auto b = RedisPeer::Start(absl::GetFlag(FLAGS_redis), root + "/redis-none", RedisPeer::Persistence::kNone);
    if (!b.ok()) return Fail(absl::StrCat("redis: ", b.status().ToString()));
    redis_always = std::move(*a);
    redis_none = std::move(*b);
    absl::StrAppend(&versions, "Redis ", redis_always->version(), "; ");
    systems.push_back({"redis_fsync_always", "Redis, appendfsync always", redis_always->Cyclers(false)});
    systems.push_back({"redis_fsync_always_incr", "Redis, appendfsync always, INCR token", redis_always->Cyclers(true)});
    systems.push_back({"redis_no_persistence", "Redis, no persistence", redis_none->Cyclers(false)});
    systems.push_back({"redis_no_persistence_incr", "Redis, no persistence, INCR token", redis_none->Cyclers(true)});
    systems.push_back({"redis_fsync_always_one_thread", "Redis, appendfsync always, one thread", nullptr,
                       false, redis_always->StreamCyclers(false)});
    systems.push_back({"redis_fsync_always_one_thread_pipelined",
                       "Redis, appendfsync always, one thread, pipelined", nullptr, false,
                       redis_always->StreamCyclers(true)});
  }
  if (want_etcd) {
    std::fprintf(stderr, "peers: starting etcd (one member)\n");
    auto e = EtcdPeer::Start(absl::GetFlag(FLAGS_etcd), root + "/etcd");
    if (!e.ok()) return Fail(absl::StrCat("etcd: ", e.status().ToString()));
    etcd = std::move(*e);
    absl::StrAppend(&versions, "etcd ", etcd->version(), "; ");
    systems.push_back({"etcd", "etcd, one member", etcd->Cyclers()});
  }
  // The list --systems is checked against must name every system built here, or a request
  // for one would be refused before anything starts.
  for (const System& s : systems) {
    if (std::find(system_keys.begin(), system_keys.end(), s.key) == system_keys.end()) {
      return Fail(absl::StrCat("system ", s.key, " is missing from the --systems list"));
    }
  }
  if (!only.empty()) {
    std::vector<System> kept;
    for (const std::string& key : only) {
      for (const System& s : systems) {
        if (s.key == key) kept.push_back(s);
      }
    }
    systems = std::move(kept);
  }
  std::fprintf(stderr, "lock cycles: %zu systems x %zu client counts x %d rounds, %.1f s each\n",
               systems.size(), clients.size(), rounds, cycle_seconds);
  // A fresh lockd writes into its first WAL segment for the first time: one untimed run first,
  // so that the first measured one does not pay for that.
  (void)RunCycles(RawCyclers(address, false), 8, std::min(1.0, cycle_seconds), "warm-up (not reported)");
  std::vector<std::vector<Runs>> runs(systems.size(), std::vector<Runs>(clients.size()));
  for (size_t c = 0; c < clients.size(); ++c) {
    for (int round = 1; round <= rounds; ++round) {
      for (size_t s = 0; s < systems.size(); ++s) {
        const std::string label = absl::StrCat(clients[c], " clients, round ", round, ": ", systems[s].name);
        CycleResult r = systems[s].make ? RunCycles(systems[s].make, clients[c], cycle_seconds, label)
                                        : RunStreamCycles(systems[s].stream, clients[c], cycle_seconds, label);
        Runs& into = runs[s][c];
        into.rates.push_back(r.cycles_per_second);
        into.acquire_ns.insert(into.acquire_ns.end(), r.acquire_ns.begin(), r.acquire_ns.end());
        into.errors += r.errors;
        if (into.first_error.empty()) into.first_error = r.first_error;
        if (r.errors > 0 || r.cycles_per_second == 0) broken = true;
      }
    }
  }
  lockd->reset();
  redis_always.reset();
  redis_none.reset();
  etcd.reset();
  absl::StrAppend(&json, "  \"lock_cycles\": {\"rounds\": ", rounds, ", \"seconds\": ", cycle_seconds,
                  ", \"runs\": [\n");
  std::string cycles_table =
      "| clients | system | cycles/s min | median | max | median / fencelock library | acquire p50 / "
      "p99 ms | errors |\n|---|---|---|---|---|---|---|---|\n";
  // The ratio column is against the library; with --systems leaving it out, there is none.
  const auto library_at = std::find_if(systems.begin(), systems.end(),
                                       [](const System& s) { return s.key == "fencelock_library"; });
  for (size_t c = 0; c < clients.size(); ++c) {
    const double library = library_at == systems.end()
                               ? 0.0
                               : runs[static_cast<size_t>(library_at - systems.begin())][c].median();
    for (size_t s = 0; s < systems.size(); ++s) {
      const Runs& r = runs[s][c];
      const Percentiles acquire = Summarize(r.acquire_ns);
      absl::StrAppend(&json, c == 0 && s == 0 ? "" : ",\n", "    {\"clients\": ", clients[c],
                      ", \"system\": \"", systems[s].key, "\", \"cycles_per_s\": [",
                      absl::StrJoin(r.rates, ", "), "], \"median\": ", r.median(), ", \"acquire\": ",
                      Json(acquire), ", \"errors\": ", r.errors, "}");
      absl::StrAppend(&cycles_table, "| ", clients[c], " | ", systems[s].name, " | ",
                      absl::StrFormat("%.0f | %.0f | %.0f", r.min(), r.median(), r.max()), " | ",
                      library > 0 ? absl::StrFormat("%.2f", r.median() / library) : std::string("-"),
                      " | ",
                      Ms(acquire.p50), " / ", Ms(acquire.p99), " | ",
                      r.errors == 0 ? std::string("0") : absl::StrCat(r.errors, ": ", r.first_error), " |\n");
    }
  }
  absl::StrAppend(&json, "\n  ]},\n");

  // --- the margin sweep
  std::vector<MarginPoint> points;
  std::string margin_table;
  if (!rail.empty()) {
    std::fprintf(stderr, "margin sweep: %zu TTLs x %zu margins, %d workers, %.1f s each\n",
                 margin_ttls.size(), margins.size(), margin_workers, margin_seconds);
    std::string sweep_error;
    points = RunMarginSweep({.dir = root + "/margin",
                             .lockd_binary = binary,
                             .rail_binary = rail,
                             .worker_binary = worker,
                             .ttls = margin_ttls,
                             .margins = margins,
                             .arrival_seconds = arrival_seconds,
                             .arrival_rate = arrival_rate,
                             .seconds = margin_seconds,
                             .workers = margin_workers},
                            &sweep_error);
    if (!sweep_error.empty()) {
      std::fprintf(stderr, "fencelock-bench: %s\n", sweep_error.c_str());
      broken = true;
    }
    margin_table =
        "| TTL | margin | usable lease | capacity payouts/s | of the TTL's best | arrivals paid | "
        "backlog age s | abandoned | renewals/s | paid twice |\n|---|---|---|---|---|---|---|---|---|---|\n";
    absl::StrAppend(&json, "  \"margin_sweep\": {\"submit_cost_ms\": ",
                    points.empty() ? 0.0 : absl::ToDoubleMilliseconds(points[0].submit_cost),
                    ", \"workers\": ", margin_workers, ", \"capacity_seconds\": ", margin_seconds,
                    ", \"arrival_seconds\": ", arrival_seconds, ", \"arrival_rate\": ", arrival_rate,
                    ", \"points\": [\n");
    for (size_t i = 0; i < points.size(); ++i) {
      const MarginPoint& p = points[i];
      double best = 0;
      for (const MarginPoint& q : points) {
        if (q.ttl == p.ttl) best = std::max(best, q.payouts_per_second);
      }
      // A point whose workers started and paid nothing measured nothing.
      if (p.paid_twice > 0 || p.rail_duplicates > 0 || p.lock_fenced_out != 0 ||
          (!p.refused && p.paid == 0)) {
        broken = true;
      }
      std::string reasons;
      for (const auto& [reason, n] : p.abandoned) absl::StrAppend(&reasons, reasons.empty() ? "" : ", ", reason, " ", n);
      absl::StrAppend(&json, i == 0 ? "" : ",\n", "    {\"ttl_s\": ", absl::ToDoubleSeconds(p.ttl),
                      ", \"margin\": ", p.margin, ", \"usable_s\": ", absl::ToDoubleSeconds(p.usable),
                      ", \"refused\": ", p.refused ? "true" : "false", ", \"payouts_per_s\": ",
                      p.payouts_per_second, ", \"arrived\": ", p.arrived, ", \"paid_of_arrivals\": ",
                      p.paid_of_arrivals, ", \"backlog_age_s\": ", p.backlog_age_seconds,
                      ", \"abandoned\": ", p.abandoned_total, ", \"renewals_per_s\": ",
                      p.renewals_per_second, ", \"paid_twice\": ", p.paid_twice,
                      ", \"rail_duplicates\": ", p.rail_duplicates, "}");
      absl::StrAppend(&margin_table, "| ", absl::FormatDuration(p.ttl), " | ", absl::StrFormat("%.2f", p.margin),
                      " | ", absl::StrFormat("%.2f s", absl::ToDoubleSeconds(p.usable)), " | ",
                      p.refused ? std::string("0 (workers refuse: usable < submit cost)")
                                : absl::StrFormat("%.1f", p.payouts_per_second),
                      " | ", absl::StrFormat("%.2f", best > 0 ? p.payouts_per_second / best : 0.0), " | ",
                      p.paid_of_arrivals, " of ", p.arrived, " | ",
                      absl::StrFormat("%.2f", p.backlog_age_seconds), " | ", p.abandoned_total,
                      reasons.empty() ? "" : absl::StrCat(" (", reasons, ")"), " | ",
                      p.refused ? "-" : absl::StrFormat("%.2f", p.renewals_per_second), " | ",
                      p.paid_twice, " |\n");
    }
    absl::StrAppend(&json, "\n  ]},\n");
  }
  // --- payout scaling: the demo without faults, at each worker count, interleaved rounds
  std::string scaling_table;
  if (!demo.empty()) {
    std::fprintf(stderr, "payout scaling: %d payouts, workers %s, %d rounds\n", scaling_payouts,
                 absl::GetFlag(FLAGS_scaling_workers).c_str(), rounds);
    std::map<int, Runs> rates;
    std::map<int, DemoRun> worst;  // per worker count: the sum of what must be zero
    for (int round = 0; round < rounds && !broken; ++round) {
      for (int w : scaling_workers) {
        auto run = RunDemo(demo, binary, rail, worker,
                           absl::StrCat(root, "/scaling-", w, "-", round), w, scaling_payouts);
        if (!run.ok()) {
          std::fprintf(stderr, "fencelock-bench: payout scaling: %s\n", run.status().ToString().c_str());
          broken = true;
          break;
        }
        std::fprintf(stderr, "  %d workers, round %d: %.1f payouts/s, %lld of %d paid once\n", w,
                     round + 1, run->payouts_per_second, static_cast<long long>(run->paid_once),
                     scaling_payouts);
        rates[w].rates.push_back(run->payouts_per_second);
        DemoRun& bad = worst[w];
        bad.paid_twice += run->paid_twice;
        bad.left += run->left;
        bad.lock_fenced_out += run->lock_fenced_out;
        bad.rail_duplicates += run->rail_duplicates;
        bad.paid_once += run->paid_once;
        if (run->paid_twice > 0 || run->left > 0 || run->lock_fenced_out > 0 ||
            run->rail_duplicates > 0 || !run->ok) {
          broken = true;
        }
      }
    }
    const double one = rates.count(scaling_workers.front()) > 0
                           ? rates[scaling_workers.front()].median() : 0;
    scaling_table =
        "| workers | payouts/s min | median | max | median / the first row | paid once | paid twice | "
        "left unpaid | lock_fenced_out_total | rail_duplicate_attempted_total |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
    absl::StrAppend(&json, "  \"payout_scaling\": {\"payouts\": ", scaling_payouts, ", \"runs\": [\n");
    bool first = true;
    for (int w : scaling_workers) {
      if (rates.count(w) == 0) continue;
      const Runs& r = rates[w];
      const DemoRun& bad = worst[w];
      absl::StrAppend(&json, first ? "" : ",\n", "    {\"workers\": ", w, ", \"payouts_per_s_median\": ",
                      r.median(), ", \"min\": ", r.min(), ", \"max\": ", r.max(),
                      ", \"paid_once\": ", bad.paid_once, ", \"paid_twice\": ", bad.paid_twice,
                      ", \"left\": ", bad.left, ", \"lock_fenced_out\": ", bad.lock_fenced_out,
                      ", \"rail_duplicates\": ", bad.rail_duplicates, "}");
      first = false;
      absl::StrAppend(&scaling_table, "| ", w, " | ",
                      absl::StrFormat("%.1f | %.1f | %.1f", r.min(), r.median(), r.max()), " | ",
                      absl::StrFormat("%.2f", one > 0 ? r.median() / one : 0.0), " | ",
                      bad.paid_once, " | ", bad.paid_twice, " | ", bad.left, " | ",
                      bad.lock_fenced_out, " | ", bad.rail_duplicates, " |\n");
    }
    absl::StrAppend(&json, "\n  ]},\n");
  }
  absl::StrAppend(&json, "  \"versions\": \"", versions, "\", \"total_seconds\": ",
                  absl::ToDoubleSeconds(Now() - run_start), "\n}\n");

  std::string summary = absl::StrCat(
      "floors: fdatasync 4 KiB p50 ", Ms(fsync.p50), " ms, p99 ", Ms(fsync.p99),
      " ms; loopback round trip p50 ", Ms(loopback.p50), " ms, p99 ", Ms(loopback.p99),
      " ms\n\nheartbeat RTT (period ", absl::FormatDuration(absl::GetFlag(FLAGS_heartbeat)),
      "; ADR-006 6.5 threshold lease x margin / 3 = ", absl::StrFormat("%.0f", threshold_ms),
      " ms)\n\n", table,
      library_table.empty() ? "" : absl::StrCat("\nheartbeat RTT through the client library (its own "
                                                "period; percentiles interpolated in its histogram's "
                                                "buckets, as histogram_quantile does)\n\n", library_table),
      "\nlock cycles (acquire + release; ", rounds, " interleaved rounds of ",
      cycle_seconds, " s; ", versions, "peers' data on the same disk)\n\n", cycles_table);
  if (!rail.empty()) {
    absl::StrAppend(&summary, "\nmargin sweep (payout workload, ", margin_workers,
                    " workers, rail latency 20 ms, submit cost ",
                    points.empty() ? std::string("?") : absl::FormatDuration(points[0].submit_cost),
                    "; each point: ", arrival_seconds, " s of ", arrival_rate,
                    " arrivals/s onto an empty store, then ", margin_seconds,
                    " s paying a backlog)\n\n", margin_table);
  }
  if (!scaling_table.empty()) {
    absl::StrAppend(&summary, "\npayout scaling (the payout demo without faults: ", scaling_payouts,
                    " payouts, rail latency 20 ms + up to 10 ms; ", rounds,
                    " interleaved rounds; paid counts summed over the rounds)\n\n", scaling_table);
  }
  std::printf("%s", summary.c_str());
  if (!out.empty()) {
    std::ofstream(out + "/results.json") << json;
    std::ofstream(out + "/summary.md") << "# fencelock-bench\n\n" << summary;
    if (!gnuplot.empty()) {
      std::fprintf(stderr, "plots: gnuplot into %s\n", out.c_str());
      std::vector<std::pair<std::string, std::string>> plots;
      if (!variants.empty()) {
        plots.emplace_back("heartbeat_rtt", HeartbeatPlot(variants, threshold_ms, out + "/heartbeat_rtt.dat"));
      }
      plots.emplace_back("lock_cycles", CyclesPlot(systems, clients, runs, out + "/lock_cycles.dat"));
      if (!points.empty()) plots.emplace_back("margin_sweep", MarginPlot(points, out + "/margin_sweep.dat"));
      for (const auto& [name, body] : plots) {
        if (absl::Status s = Gnuplot(gnuplot, out, name, body); !s.ok()) {
          std::fprintf(stderr, "fencelock-bench: %s\n", s.ToString().c_str());
          broken = true;
        }
      }
    }
  }
  std::filesystem::remove_all(root);
  std::fprintf(stderr, "fencelock-bench: done in %.0f s\n", absl::ToDoubleSeconds(Now() - run_start));
  if (broken) {
    std::fprintf(stderr, "fencelock-bench: some requests failed or were refused (see errors above)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace fencelock::bench

int main(int argc, char** argv) {
  // Debian's Abseil is built with its debug-mode deadlock detection on: every Mutex::Lock then
  // updates a process-wide lock graph under one global lock. A release build has it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "the M7 benchmark: floors, heartbeat RTT, lock cycles against Redis and etcd, the margin sweep\n"
      "  fencelock-bench --lockd=PATH --rail=PATH --worker=PATH [--out=DIR] [--peers=redis,etcd]");
  fencelock::process::ParseFlags(argc, argv);
  return fencelock::bench::Main();
}
