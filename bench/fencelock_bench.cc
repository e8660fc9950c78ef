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
//     interleaved rounds, with its reconciliation (paid once, the must-be-zero counters);
//   - scale: how the cost grows with the size of the work (scale.cc), at each of --scale-held.
// --workloads picks some of them.
// Progress goes to stderr (workload, elapsed, current rate). With --out, DIR gets results.json,
// summary.md and the PNG plots (gnuplot); the summary also goes to stdout.
//
// This file reads the flags once (ReadSettings) and runs the workloads in turn (Main); each
// workload is a file of its own (heartbeat.cc, cycles.cc with peers.cc, margin_sweep.cc,
// payout_scaling.cc), and the report is written by report.cc and plots.cc (bench.h).
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench.h"
#include "common.h"
#include "logging/logging.h"
#include "process/flags.h"
#include "process/process.h"

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
ABSL_FLAG(std::string, workloads, "heartbeat,cycles,margin,payout,scale",
          "the workloads to run, of heartbeat, cycles, margin (with --rail), payout (with --demo), "
          "scale");
ABSL_FLAG(std::string, scale_held, "1000,10000,100000",
          "the scale workload: locks held by the benchmark's process at each point");
ABSL_FLAG(std::string, scale_names, "1000,100000,1000000",
          "the scale workload: lock names held in lockd at each point (empty: none)");
ABSL_FLAG(std::string, scale_sessions, "1000,10000,100000,1000000",
          "the scale workload: sessions on one lockd at each point, renewed 1,024 to a Renew "
          "(empty: none)");
ABSL_FLAG(std::string, scale_standby, "1000,100000,1000000",
          "the scale workload: locks held on the etcd backend when its serving lockd is killed "
          "and a standby takes over, at each point (with --etcd; empty: none)");
ABSL_FLAG(std::string, scale_waiters, "1,10,100,1000,10000",
          "the scale workload: waiters queued on one lock at each point (empty: none)");
ABSL_FLAG(std::string, scale_expiries, "1000,10000,100000",
          "the scale workload: held leases that end at one moment at each point (empty: none)");
ABSL_FLAG(int, scale_restarts, 1,
          "the scale workload: times each --scale-names point's lockd is restarted on the same "
          "state directory (1 to 20)");
ABSL_FLAG(bool, scale_snapshot, true,
          "the scale workload: at each --scale-names point, cycle locks until lockd writes one "
          "more snapshot (its grants' latency meanwhile)");
ABSL_FLAG(uint64_t, scale_wal_segment_bytes, 0,
          "the scale workload: `lockd init --wal-segment-bytes` of the --scale-names points (0: "
          "lockd's default); smaller segments let a snapshot come sooner");
ABSL_FLAG(double, scale_seconds, 15.0,
          "the scale workload: measuring time of each point (at least three heartbeat periods of "
          "the default 15 s session, so that what holding costs is in every point)");

namespace fencelock::bench {
namespace {

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

}  // namespace

// --- lockd ---------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<testing::LocalLockd>> StartLockd(const std::string& binary,
                                                                const std::string& dir) {
  return testing::LocalLockd::Start(
      {.binary = binary,
       .dir = dir,
       .serve_args = {"--max-connections=4096", "--max-connections-per-peer=4096"}});
}

namespace {

// --- the run -------------------------------------------------------------------------------

int Fail(const std::string& message) {
  logging::Program().Error(message);
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

absl::StatusOr<Settings> ReadSettings() {
  const std::string binary = absl::GetFlag(FLAGS_lockd);
  if (binary.empty()) return absl::InvalidArgumentError("--lockd=PATH is required");
  const double seconds = absl::GetFlag(FLAGS_seconds);
  if (!(seconds > 0 && seconds <= 3600)) return absl::InvalidArgumentError("--seconds must be in (0, 3600]");
  const double cycle_seconds = absl::GetFlag(FLAGS_cycle_seconds);
  if (!(cycle_seconds > 0 && cycle_seconds <= 600)) return absl::InvalidArgumentError("--cycle-seconds must be in (0, 600]");
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (rounds < 1 || rounds > 20) return absl::InvalidArgumentError("--rounds must be 1 to 20");
  const double margin_seconds = absl::GetFlag(FLAGS_margin_seconds);
  if (!(margin_seconds > 0 && margin_seconds <= 600)) return absl::InvalidArgumentError("--margin-seconds must be in (0, 600]");
  const double arrival_seconds = absl::GetFlag(FLAGS_margin_arrival_seconds);
  if (!(arrival_seconds > 0 && arrival_seconds <= 600)) return absl::InvalidArgumentError("--margin-arrival-seconds must be in (0, 600]");
  const double arrival_rate = absl::GetFlag(FLAGS_margin_arrival_rate);
  if (!(arrival_rate > 0 && arrival_rate <= 10'000)) return absl::InvalidArgumentError("--margin-arrival-rate must be in (0, 10000]");
  const int margin_workers = absl::GetFlag(FLAGS_margin_workers);
  if (margin_workers < 1 || margin_workers > 64) return absl::InvalidArgumentError("--margin-workers must be 1 to 64");
  for (const auto& [flag, d, lo, hi] :
       {std::tuple{"--heartbeat", absl::GetFlag(FLAGS_heartbeat), absl::Milliseconds(1), absl::Minutes(10)},
        std::tuple{"--timeout", absl::GetFlag(FLAGS_timeout), absl::Milliseconds(1), absl::Minutes(10)},
        std::tuple{"--session-ttl", absl::GetFlag(FLAGS_session_ttl), absl::Seconds(1), absl::Hours(1)},
        std::tuple{"--library-heartbeat", absl::GetFlag(FLAGS_library_heartbeat), absl::ZeroDuration(),
                   absl::Minutes(10)}}) {
    // A period of zero or less would never move the raw driver's schedule: it would spin.
    if (d < lo || d > hi) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " must be from ", absl::FormatDuration(lo), " to ",
                               absl::FormatDuration(hi), ", got ", absl::FormatDuration(d)));
    }
  }
  if (const int n = absl::GetFlag(FLAGS_library_sessions); n < 0 || n > 20'000) {
    return absl::InvalidArgumentError("--library-sessions must be 0 to 20000");
  }
  const int load_clients = absl::GetFlag(FLAGS_load_clients);
  if (load_clients < 0 || load_clients > 1024) return absl::InvalidArgumentError("--load-clients must be 0 to 1024");
  std::string error;
  std::vector<size_t> counts;
  std::vector<int> clients;
  std::vector<double> margins;
  std::vector<absl::Duration> margin_ttls;
  std::vector<int> scaling_workers;
  if (!ParseList<int>("scaling-workers", absl::GetFlag(FLAGS_scaling_workers), 1, 64,
                      &scaling_workers, &error)) {
    return absl::InvalidArgumentError(error);
  }
  const int scaling_payouts = absl::GetFlag(FLAGS_scaling_payouts);
  if (scaling_payouts < 1 || scaling_payouts > 1'000'000) {
    return absl::InvalidArgumentError(absl::StrCat("--scaling-payouts must be from 1 to 1000000, got ", scaling_payouts));
  }
  if (!ParseList<size_t>("sessions", absl::GetFlag(FLAGS_sessions), 1, 100'000, &counts, &error) ||
      !ParseList<int>("cycle-clients", absl::GetFlag(FLAGS_cycle_clients), 1, 1024, &clients, &error) ||
      !ParseList<double>("margins", absl::GetFlag(FLAGS_margins), 0.0, 0.95, &margins, &error) ||
      !ParseList<absl::Duration>("margin-ttls", absl::GetFlag(FLAGS_margin_ttls), absl::Seconds(1),
                                 absl::Minutes(10), &margin_ttls, &error)) {
    return absl::InvalidArgumentError(error);
  }
  bool want_redis = false, want_etcd = false;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_peers), ',', absl::SkipEmpty())) {
    if (p == "redis") {
      want_redis = true;
    } else if (p == "etcd") {
      want_etcd = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--peers knows redis and etcd, not \"", std::string(p), "\""));
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
      return absl::InvalidArgumentError(absl::StrCat("--systems: no system \"", std::string(key), "\"; the systems are ",
                               absl::StrJoin(system_keys, ", ")));
    }
    const bool redis = absl::StartsWith(key, "redis"), is_etcd = key == "etcd";
    if ((redis && !want_redis) || (is_etcd && !want_etcd)) {
      return absl::InvalidArgumentError(absl::StrCat("--systems: ", std::string(key), " needs --peers to name ",
                               redis ? "redis" : "etcd"));
    }
    if (std::find(only.begin(), only.end(), key) != only.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--systems names ", std::string(key), " twice"));
    }
    only.emplace_back(key);
  }
  std::vector<size_t> scale_held;
  if (!ParseList<size_t>("scale-held", absl::GetFlag(FLAGS_scale_held), 1, 10'000'000,
                         &scale_held, &error)) {
    return absl::InvalidArgumentError(error);
  }
  std::vector<size_t> scale_names;
  if (!ParseList<size_t>("scale-names", absl::GetFlag(FLAGS_scale_names), 1, 100'000'000,
                         &scale_names, &error)) {
    return absl::InvalidArgumentError(error);
  }
  std::vector<size_t> scale_waiters, scale_expiries, scale_sessions, scale_standby;
  if (!ParseList<size_t>("scale-standby", absl::GetFlag(FLAGS_scale_standby), 1, 10'000'000,
                         &scale_standby, &error) ||
      !ParseList<size_t>("scale-sessions", absl::GetFlag(FLAGS_scale_sessions), 1, 4'000'000,
                         &scale_sessions, &error) ||
      !ParseList<size_t>("scale-waiters", absl::GetFlag(FLAGS_scale_waiters), 1, 100'000,
                         &scale_waiters, &error) ||
      !ParseList<size_t>("scale-expiries", absl::GetFlag(FLAGS_scale_expiries), 1, 10'000'000,
                         &scale_expiries, &error)) {
    return absl::InvalidArgumentError(error);
  }
  const int scale_restarts = absl::GetFlag(FLAGS_scale_restarts);
  if (scale_restarts < 1 || scale_restarts > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("--scale-restarts must be from 1 to 20, got ", scale_restarts));
  }
  const double scale_seconds = absl::GetFlag(FLAGS_scale_seconds);
  if (!(scale_seconds > 0 && scale_seconds <= 600)) {
    return absl::InvalidArgumentError("--scale-seconds must be in (0, 600]");
  }
  std::vector<std::string> workloads;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_workloads), ',', absl::SkipEmpty())) {
    static const std::vector<std::string> kKnown = {"heartbeat", "cycles", "margin", "payout",
                                                    "scale"};
    if (std::find(kKnown.begin(), kKnown.end(), w) == kKnown.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--workloads: no workload \"", std::string(w),
                                                     "\"; the workloads are ",
                                                     absl::StrJoin(kKnown, ", ")));
    }
    workloads.emplace_back(w);
  }
  auto wants = [&](const char* w) {
    return std::find(workloads.begin(), workloads.end(), w) != workloads.end();
  };
  const std::string rail = absl::GetFlag(FLAGS_rail), worker = absl::GetFlag(FLAGS_worker);
  if (rail.empty() != worker.empty()) return absl::InvalidArgumentError("--rail and --worker go together (the margin sweep)");
  const std::string demo = absl::GetFlag(FLAGS_demo);
  if (!demo.empty() && rail.empty()) return absl::InvalidArgumentError("--demo needs --rail and --worker");
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::string gnuplot = out.empty() ? "" : absl::GetFlag(FLAGS_gnuplot);
  if (!gnuplot.empty() && access(gnuplot.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--gnuplot=", gnuplot, " is not an executable (Debian: gnuplot-nox; "
                             "--gnuplot= for no plots)"));
  }
  const absl::Duration ttl = absl::GetFlag(FLAGS_session_ttl);
  const double margin = absl::GetFlag(FLAGS_margin);
  return Settings{.binary = binary, .seconds = seconds, .cycle_seconds = cycle_seconds, .rounds = rounds, .margin_seconds = margin_seconds, .arrival_seconds = arrival_seconds, .arrival_rate = arrival_rate, .margin_workers = margin_workers, .load_clients = load_clients, .counts = counts, .clients = clients, .margins = margins, .margin_ttls = margin_ttls, .scaling_workers = scaling_workers, .scaling_payouts = scaling_payouts, .want_redis = want_redis, .want_etcd = want_etcd, .system_keys = system_keys, .only = only, .rail = rail, .worker = worker, .demo = demo, .out = out, .gnuplot = gnuplot,
                  .heartbeat = absl::GetFlag(FLAGS_heartbeat),
                  .library_sessions = absl::GetFlag(FLAGS_library_sessions),
                  .redis_binary = absl::GetFlag(FLAGS_redis), .etcd_binary = absl::GetFlag(FLAGS_etcd),
                  .threshold_ms = absl::ToDoubleMilliseconds(ttl) * margin / 3,
                  .run_heartbeat = wants("heartbeat"), .run_cycles = wants("cycles"),
                  .run_margin = wants("margin"), .run_payout = wants("payout"),
                  .scale_held = wants("scale") ? scale_held : std::vector<size_t>(),
                  .scale_names = wants("scale") ? scale_names : std::vector<size_t>(),
                  .scale_waiters = wants("scale") ? scale_waiters : std::vector<size_t>(),
                  .scale_expiries = wants("scale") ? scale_expiries : std::vector<size_t>(),
                  .scale_sessions = wants("scale") ? scale_sessions : std::vector<size_t>(),
                  .scale_standby = wants("scale") ? scale_standby : std::vector<size_t>(),
                  .scale_seconds = scale_seconds, .scale_restarts = scale_restarts,
                  .scale_snapshot = absl::GetFlag(FLAGS_scale_snapshot),
                  .scale_wal_segment_bytes = absl::GetFlag(FLAGS_scale_wal_segment_bytes)};
}

int Main() {
  absl::StatusOr<Settings> settings = ReadSettings();
  if (!settings.ok()) return Fail(std::string(settings.status().message()));
  Settings& s = *settings;
  if (!s.out.empty()) std::filesystem::create_directories(s.out);
  const char* tmp = std::getenv("TMPDIR");
  s.root = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/fencelock-bench-", getpid());
  const MonoTime run_start = Now();
  logging::Program().Info(absl::StrFormat(
      "floors: fdatasync of 4 KiB in %s, loopback TCP round trip", s.root.c_str()));
  std::filesystem::create_directories(s.root);
  const Percentiles fsync = FsyncFloor(s.root);
  const Percentiles loopback = LoopbackFloor();
  Report report;
  report.json["floors"] = {{"fdatasync_4k", ToJson(fsync)}, {"loopback_rtt", ToJson(loopback)}};
  if (s.run_heartbeat) {
    if (absl::Status st = RunHeartbeatWorkloads(s, report); !st.ok()) return Fail(std::string(st.message()));
  }
  if (s.run_cycles) {
    if (absl::Status st = RunCycleWorkloads(s, report); !st.ok()) return Fail(std::string(st.message()));
  }
  if (s.run_margin) RunMarginSweepWorkload(s, report);
  if (s.run_payout) RunPayoutScaling(s, report);
  if (absl::Status st = RunScaleWorkloads(s, fsync, loopback, report); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  report.json["versions"] = report.versions;
  report.json["total_seconds"] = absl::ToDoubleSeconds(Now() - run_start);
  WriteReport(s, fsync, loopback, report);
  std::filesystem::remove_all(s.root);
  logging::Program().Info(absl::StrFormat(
      "done in %.0f s", absl::ToDoubleSeconds(Now() - run_start)));
  if (report.broken) {
    logging::Program().Error("some requests failed or were refused (see errors above)");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace fencelock::bench

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("fencelock-bench");
  // Debian's Abseil is built with its debug-mode deadlock detection on: every Mutex::Lock then
  // updates a process-wide lock graph under one global lock. A release build has it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "the M7 benchmark: floors, heartbeat RTT, lock cycles against Redis and etcd, the margin sweep\n"
      "  fencelock-bench --lockd=PATH --rail=PATH --worker=PATH [--out=DIR] [--peers=redis,etcd]");
  fencelock::process::ParseFlags(argc, argv);
  return fencelock::bench::Main();
}
