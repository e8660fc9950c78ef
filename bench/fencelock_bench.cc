// fencelock-bench: the M7 benchmark (issue 18), first workloads.
//
//   fencelock-bench --lockd=build/lock-server/lockd [--out=DIR] [--sessions=1000,10000]
//                   [--seconds=20] [--heartbeat=3.5s] [--session-ttl=15s] [--load-clients=8]
//
// Measures, against a lockd it starts on a fresh state directory under $TMPDIR:
//   - the floors: the fdatasync time of a 4 KiB write on the state directory's disk, and the
//     loopback TCP round trip of a 64-byte message;
//   - heartbeat RTT: N sessions, each holding a lock and renewing session and lock with one
//     KeepAlive every --heartbeat, idle and then under a durable lock-cycle load
//     (--load-clients connections acquiring and releasing their own locks). A KeepAlive that
//     gets no answer within its timeout counts as an RTT of that timeout. Reports p50, p90,
//     p99, p99.9 and max, and ADR-006 6.5's verdict: p99 against lease x margin / 3.
// Progress goes to stderr (workload, elapsed, current rate); results to DIR/results.json and
// DIR/summary.md, and the summary to stdout.
//   - lock cycles: acquire + release at each of --cycle-clients, each client on its own lock and
//     all on one lock (waiting), through the client library and through the raw protocol (one
//     request at a time); cycles/s and acquire p50/p99.
// Not yet here: the margin sweep, the peers (Redis, etcd) and the plots.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "clock/clock.h"
#include "fencelock/wire.pb.h"
#include "lock-client/client.h"
#include "lock-server/blocking_connection.h"
#include "process/flags.h"
#include "process/process.h"

ABSL_FLAG(std::string, lockd, "", "path to the lockd binary");
ABSL_FLAG(std::string, out, "", "folder for results.json and summary.md (default: none)");
ABSL_FLAG(std::string, sessions, "1000,10000", "session counts of the heartbeat workload");
ABSL_FLAG(double, seconds, 20.0, "measuring time of each heartbeat variant");
ABSL_FLAG(absl::Duration, heartbeat, absl::Milliseconds(3500),
          "heartbeat period (the client's default: session TTL x (1 - margin) / 3)");
ABSL_FLAG(absl::Duration, session_ttl, absl::Seconds(15), "session and lock TTL");
ABSL_FLAG(double, margin, 0.30, "lock.client.safety-margin, for the 6.5 verdict");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5), "a KeepAlive's timeout");
ABSL_FLAG(int, load_clients, 8, "connections of the durable lock-cycle load");
ABSL_FLAG(std::string, cycle_clients, "1,8,64", "client counts of the lock-cycle workload");
ABSL_FLAG(double, cycle_seconds, 3.0, "measuring time of each lock-cycle variant");

namespace fencelock::bench {
namespace {

using server::BlockingConnection;
using fencelock::Client;

MonoTime Now() { return Clock::Real()->Now(); }

struct Percentiles {
  size_t samples = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;  // milliseconds
};

Percentiles Summarize(std::vector<int64_t> ns) {
  Percentiles p;
  p.samples = ns.size();
  if (ns.empty()) return p;
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    const size_t i = std::min(ns.size() - 1, static_cast<size_t>(q * static_cast<double>(ns.size())));
    return static_cast<double>(ns[i]) / 1e6;
  };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p99 = at(0.99);
  p.p999 = at(0.999);
  p.max = static_cast<double>(ns.back()) / 1e6;
  return p;
}

std::string Json(const Percentiles& p) {
  return absl::StrCat("{\"samples\": ", p.samples, ", \"p50_ms\": ", p.p50, ", \"p90_ms\": ",
                      p.p90, ", \"p99_ms\": ", p.p99, ", \"p999_ms\": ", p.p999,
                      ", \"max_ms\": ", p.max, "}");
}

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
  const uint64_t ttl = static_cast<uint64_t>(absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_session_ttl)));
  for (size_t i = 0; i < count; ++i) {
    wire::Request open;
    open.mutable_open_session()->set_ttl_ms(ttl);
    auto opened = h.conn->Call(open);
    if (!opened.ok()) return opened.status();
    if (opened->code() != wire::OK) return absl::UnavailableError(opened->message());
    const uint64_t session = opened->open_session().session_id();
    wire::Request acquire;
    acquire.mutable_acquire()->set_session_id(session);
    acquire.mutable_acquire()->set_lock(absl::StrCat("hb/", first + i));
    acquire.mutable_acquire()->set_ttl_ms(ttl);
    auto granted = h.conn->Call(acquire);
    if (!granted.ok()) return granted.status();
    if (granted->code() != wire::OK) return absl::UnavailableError(granted->message());
    h.sessions.emplace_back(session, granted->acquire().token());
  }
  return absl::OkStatus();
}

struct HeartbeatResult {
  Percentiles rtt;
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
        wire::Request ka;
        ka.mutable_keep_alive()->set_session_id(h.sessions[next].first);
        auto* ref = ka.mutable_keep_alive()->add_locks();
        ref->set_lock(absl::StrCat("hb/", base + next));
        ref->set_token(h.sessions[next].second);
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
      wire::Request open;
      open.mutable_open_session()->set_ttl_ms(60'000);
      auto opened = (*conn)->Call(open);
      if (!opened.ok() || opened->code() != wire::OK) return;
      const uint64_t session = opened->open_session().session_id();
      const std::string lock = absl::StrCat("load/", c);
      while (!stop.load()) {
        wire::Request a;
        a.mutable_acquire()->set_session_id(session);
        a.mutable_acquire()->set_lock(lock);
        auto g = (*conn)->Call(a);
        if (!g.ok() || g->code() != wire::OK) break;
        wire::Request r;
        r.mutable_release()->set_session_id(session);
        r.mutable_release()->set_lock(lock);
        r.mutable_release()->set_token(g->acquire().token());
        if (auto rel = (*conn)->Call(r); !rel.ok() || rel->code() != wire::OK) break;
        ++cycles;
      }
    });
  }
  size_t last_done = 0;
  const bool tty = isatty(STDERR_FILENO) == 1;
  for (MonoTime t = Now(); t < end; t = Now()) {
    absl::SleepFor(std::min(absl::Seconds(1), end - t));
    const size_t d = done.load();
    // On a terminal one line that updates; in a log a line every 5 s.
    const double elapsed = absl::ToDoubleSeconds(Now() - start);
    if (tty || static_cast<int>(elapsed + 0.5) % 5 == 0) {
      std::fprintf(stderr, "%s  %-28s %5.1fs  %8zu heartbeats/s  %8lu load cycles%s",
                   tty ? "\r" : "", label.c_str(), elapsed, d - last_done,
                   static_cast<unsigned long>(cycles.load()), tty ? "   " : "\n");
    }
    last_done = d;
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  if (tty) std::fprintf(stderr, "\n");
  HeartbeatResult r;
  r.rtt = Summarize(std::move(all));
  r.timeouts = timeouts;
  r.failures = failures;
  r.cycles_per_second = static_cast<double>(cycles.load()) / seconds;
  return r;
}

// --- lock cycles ---------------------------------------------------------------------------

struct CycleResult {
  double cycles_per_second = 0;
  Percentiles acquire;
  size_t errors = 0;
};

// `clients` threads, each acquiring and releasing (its own lock, or with `contended` all the
// same one, waiting for it) through the client library (`library`) or the raw protocol.
CycleResult RunCycles(const std::string& address, int clients, bool contended, bool library,
                      double seconds, const std::string& label) {
  std::atomic<bool> go{false}, stop{false};
  std::atomic<uint64_t> cycles{0};
  std::atomic<size_t> errors{0}, ready{0};
  std::mutex mu;
  std::vector<int64_t> all;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      const std::string lock = contended ? std::string("cycle") : absl::StrCat("cycle/", c);
      std::vector<int64_t> mine;
      std::unique_ptr<Client> client;
      std::unique_ptr<BlockingConnection> conn;
      uint64_t session = 0;
      if (library) {
        auto created = Client::Create({.server = address});
        if (created.ok()) client = std::move(*created);
      } else if (auto connected = Connect(address); connected.ok()) {
        conn = std::move(*connected);
        wire::Request open;
        open.mutable_open_session()->set_ttl_ms(60'000);
        auto opened = conn->Call(open);
        if (opened.ok() && opened->code() == wire::OK) session = opened->open_session().session_id();
      }
      if (client == nullptr && session == 0) ++errors;
      ++ready;
      while (!go.load()) std::this_thread::yield();
      while (!stop.load() && (client != nullptr || session != 0)) {
        const MonoTime start = Now();
        if (library) {
          auto h = client->acquire(lock, absl::Seconds(10));
          if (!h.ok()) {
            ++errors;
            break;
          }
          mine.push_back((Now() - start) / absl::Nanoseconds(1));
          if (!client->release(*h).ok()) ++errors;
        } else {
          wire::Request a;
          a.mutable_acquire()->set_session_id(session);
          a.mutable_acquire()->set_lock(lock);
          a.mutable_acquire()->set_wait_timeout_ms(contended ? 10'000 : 0);
          auto g = conn->Call(a);
          if (!g.ok() || g->code() != wire::OK || !g->acquire().granted()) {
            ++errors;
            break;
          }
          mine.push_back((Now() - start) / absl::Nanoseconds(1));
          wire::Request r;
          r.mutable_release()->set_session_id(session);
          r.mutable_release()->set_lock(lock);
          r.mutable_release()->set_token(g->acquire().token());
          if (auto rel = conn->Call(r); !rel.ok() || rel->code() != wire::OK) ++errors;
        }
        ++cycles;
      }
      std::lock_guard<std::mutex> guard(mu);
      all.insert(all.end(), mine.begin(), mine.end());
    });
  }
  while (ready.load() < static_cast<size_t>(clients)) absl::SleepFor(absl::Milliseconds(5));
  const MonoTime start = Now();
  go = true;
  absl::SleepFor(absl::Seconds(seconds));
  const uint64_t counted = cycles.load();
  const double elapsed = absl::ToDoubleSeconds(Now() - start);
  stop = true;
  for (std::thread& t : threads) t.join();
  CycleResult r;
  r.cycles_per_second = static_cast<double>(counted) / elapsed;
  r.acquire = Summarize(std::move(all));
  r.errors = errors;
  std::fprintf(stderr, "  %-44s %9.0f cycles/s  acquire p50 %.3f ms  p99 %.3f ms\n",
               label.c_str(), r.cycles_per_second, r.acquire.p50, r.acquire.p99);
  return r;
}

int Main() {
  const std::string binary = absl::GetFlag(FLAGS_lockd);
  if (binary.empty()) {
    std::fprintf(stderr, "fencelock-bench: --lockd=PATH is required\n");
    return 2;
  }
  const double seconds = absl::GetFlag(FLAGS_seconds);
  if (!(seconds > 0 && seconds <= 3600)) {
    std::fprintf(stderr, "fencelock-bench: --seconds must be in (0, 3600]\n");
    return 2;
  }
  std::vector<size_t> counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sessions), ',', absl::SkipEmpty())) {
    size_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n == 0 || n > 100'000) {
      std::fprintf(stderr, "fencelock-bench: --sessions wants counts of 1 to 100000, got \"%s\"\n",
                   std::string(s).c_str());
      return 2;
    }
    counts.push_back(n);
  }
  const char* tmp = std::getenv("TMPDIR");
  const std::string root = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/fencelock-bench-", getpid());

  std::fprintf(stderr, "floors: fdatasync of 4 KiB in %s, loopback TCP round trip\n", root.c_str());
  std::filesystem::create_directories(root);
  const Percentiles fsync = FsyncFloor(root);
  const Percentiles loopback = LoopbackFloor();

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
  bool first = true;
  bool broken = false;  // a heartbeat lockd refused, or a variant with no samples at all
  for (size_t n : counts) {
    auto lockd = Lockd::Start(binary, absl::StrCat(root, "/lockd-", n));
    if (!lockd.ok()) {
      std::fprintf(stderr, "fencelock-bench: %s\n", lockd.status().ToString().c_str());
      return 1;
    }
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
      const HeartbeatResult r =
          RunHeartbeats(hs, seconds, absl::StrCat(n, " sessions, ", loaded ? "loaded" : "idle"),
                        (*lockd)->address(), loaded ? absl::GetFlag(FLAGS_load_clients) : 0);
      const bool ok = r.rtt.p99 <= threshold_ms;
      if (r.failures > 0 || r.rtt.samples == 0) broken = true;
      absl::StrAppend(&json, first ? "" : ",\n", "    {\"sessions\": ", n, ", \"loaded\": ",
                      loaded ? "true" : "false", ", \"rtt\": ", Json(r.rtt), ", \"timeouts\": ",
                      r.timeouts, ", \"failures\": ", r.failures, ", \"load_cycles_per_s\": ",
                      r.cycles_per_second, ", \"p99_within_threshold\": ", ok ? "true" : "false",
                      "}");
      first = false;
      absl::StrAppend(&table, "| ", n, " | ", loaded ? absl::StrCat(absl::GetFlag(FLAGS_load_clients), " clients") : "idle",
                      " | ", r.rtt.samples, " | ", absl::StrFormat("%.3f", r.rtt.p50), " | ",
                      absl::StrFormat("%.3f", r.rtt.p90), " | ", absl::StrFormat("%.3f", r.rtt.p99),
                      " | ", absl::StrFormat("%.3f", r.rtt.p999), " | ",
                      absl::StrFormat("%.3f", r.rtt.max), " | ", r.timeouts, " | ",
                      absl::StrFormat("%.0f", r.cycles_per_second), " | ",
                      ok ? "p99 within" : "p99 ABOVE", " ", absl::StrFormat("%.0f", threshold_ms),
                      " ms |\n");
    }
  }
  absl::StrAppend(&json, "\n  ]},\n  \"lock_cycles\": [\n");
  std::string cycles_table =
      "| clients | lock | library cycles/s | raw cycles/s | library / raw | library acquire p50 / "
      "p99 ms | raw acquire p50 / p99 ms |\n|---|---|---|---|---|---|---|\n";
  {
    auto lockd = Lockd::Start(binary, absl::StrCat(root, "/lockd-cycles"));
    if (!lockd.ok()) {
      std::fprintf(stderr, "fencelock-bench: %s\n", lockd.status().ToString().c_str());
      return 1;
    }
    std::fprintf(stderr, "lock cycles: acquire + release, through the library and raw\n");
    // A fresh lockd writes into its first WAL segment for the first time: one untimed variant
    // first, so that the first measured one does not pay for that.
    (void)RunCycles((*lockd)->address(), 8, false, false, std::min(1.0, absl::GetFlag(FLAGS_cycle_seconds)),
                    "warm-up (not reported)");
    bool first_cycle = true;
    for (absl::string_view text :
         absl::StrSplit(absl::GetFlag(FLAGS_cycle_clients), ',', absl::SkipEmpty())) {
      int clients = 0;
      if (!absl::SimpleAtoi(text, &clients) || clients < 1 || clients > 1024) {
        std::fprintf(stderr, "fencelock-bench: --cycle-clients wants 1 to 1024, got \"%s\"\n",
                     std::string(text).c_str());
        return 2;
      }
      for (bool contended : {false, true}) {
        const double secs = absl::GetFlag(FLAGS_cycle_seconds);
        const std::string what = absl::StrCat(clients, " clients, ", contended ? "one lock" : "own locks");
        const CycleResult lib = RunCycles((*lockd)->address(), clients, contended, true, secs,
                                          what + ", library");
        const CycleResult raw = RunCycles((*lockd)->address(), clients, contended, false, secs,
                                          what + ", raw");
        if (lib.errors + raw.errors > 0) broken = true;
        absl::StrAppend(&json, first_cycle ? "" : ",\n", "    {\"clients\": ", clients,
                        ", \"contended\": ", contended ? "true" : "false",
                        ", \"library\": {\"cycles_per_s\": ", lib.cycles_per_second,
                        ", \"acquire\": ", Json(lib.acquire), ", \"errors\": ", lib.errors,
                        "}, \"raw\": {\"cycles_per_s\": ", raw.cycles_per_second,
                        ", \"acquire\": ", Json(raw.acquire), ", \"errors\": ", raw.errors, "}}");
        first_cycle = false;
        absl::StrAppend(&cycles_table, "| ", clients, " | ", contended ? "one, shared" : "own", " | ",
                        absl::StrFormat("%.0f", lib.cycles_per_second), " | ",
                        absl::StrFormat("%.0f", raw.cycles_per_second), " | ",
                        absl::StrFormat("%.2f", raw.cycles_per_second > 0
                                                    ? lib.cycles_per_second / raw.cycles_per_second
                                                    : 0.0),
                        " | ", absl::StrFormat("%.3f / %.3f", lib.acquire.p50, lib.acquire.p99),
                        " | ", absl::StrFormat("%.3f / %.3f", raw.acquire.p50, raw.acquire.p99),
                        " |\n");
      }
    }
  }
  absl::StrAppend(&json, "\n  ]\n}\n");
  const std::string summary = absl::StrCat(
      "floors: fdatasync 4 KiB p50 ", absl::StrFormat("%.3f", fsync.p50), " ms, p99 ",
      absl::StrFormat("%.3f", fsync.p99), " ms; loopback round trip p50 ",
      absl::StrFormat("%.3f", loopback.p50), " ms, p99 ", absl::StrFormat("%.3f", loopback.p99),
      " ms\n\nheartbeat RTT (period ", absl::FormatDuration(absl::GetFlag(FLAGS_heartbeat)),
      "; ADR-006 6.5 threshold lease x margin / 3 = ", absl::StrFormat("%.0f", threshold_ms),
      " ms)\n\n", table, "\nlock cycles (acquire + release; durable: each is two fdatasynced "
      "mutations, shared by group commit)\n\n", cycles_table);
  std::printf("%s", summary.c_str());
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    std::filesystem::create_directories(out);
    std::ofstream(out + "/results.json") << json;
    std::ofstream(out + "/summary.md") << "# fencelock-bench\n\n" << summary;
  }
  std::filesystem::remove_all(root);
  if (broken) {
    std::fprintf(stderr, "fencelock-bench: some heartbeats failed (see failures in results)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace fencelock::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the M7 benchmark: floors and heartbeat RTT against a lockd it starts\n"
      "  fencelock-bench --lockd=PATH [--out=DIR] [--sessions=1000,10000] [--seconds=20]");
  fencelock::process::ParseFlags(argc, argv);
  return fencelock::bench::Main();
}
