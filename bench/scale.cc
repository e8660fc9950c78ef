// The scale workload (issue 60): how the cost of the work grows with its size. Each figure
// names its size; a curve that bends upward is the bug this workload is for.
//
// Held locks per process (--scale-held): 8 Clients of one process, on its shared I/O thread,
// together hold N locks (N / 8 each, renewed by their own heartbeats), and each then acquires
// and releases one more lock of its own in a closed loop: the work a Client does per cycle
// beside the leases it holds. The cycle rate, the acquire's p50 and p99, the process's CPU per
// cycle (the heartbeats included: they are what holding costs) and lockd's resident memory, at
// each N, against a fresh lockd.
//
// Lock names held in lockd (--scale-names): the raw driver fills a fresh lockd with N held
// locks (sessions of 1,000 locks each, 8 threads, 64 requests in flight per connection, names
// of 20 bytes, an hour's TTL so that nothing needs renewing), while one Client acquires and
// releases a lock of its own beside the fill (a probe: its longest request is the longest stall
// the fill caused, snapshots included, for lockd writes one after each 64 MiB of log once the
// log has grown by the last snapshot's size). Then 8 Clients cycle as above, lockd's resident
// memory per held lock is read, and lockd is stopped and served again from its state
// directory, --scale-restarts times: each restart's time, until it answers. Before the
// restarts (--scale-snapshot), 8 raw connections cycle a lock each until lockd has written one
// more snapshot: the longest a grant waited while one was taken.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench.h"
#include "lock-client/client.h"
#include "fencelock/wire.pb.h"
#include "logging/logging.h"
#include "protocol/requests.h"

namespace fencelock::bench {

uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %llu kB", &kb) == 1) return kb * 1024;
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<Probe>> Probe::Start(const std::string& address,
                                                    const std::string& lock) {
  auto client = Client::Create({.server = address, .client_name = "scale-probe"});
  if (!client.ok()) return client.status();
  std::unique_ptr<Probe> probe(new Probe());
  probe->thread_ = std::thread([p = probe.get(), c = std::move(*client), lock] {
    // A request that fails is counted and the loop goes on (after 10 ms, so that a lockd that
    // is gone is not spun on): a stall long enough to fail one is a figure too.
    auto failed = [p](const absl::Status& s) {
      if (p->failures_++ == 0) p->first_error_ = s;
      absl::SleepFor(absl::Milliseconds(10));
    };
    while (!p->stop_.load()) {
      const MonoTime start = Now();
      auto handle = c->acquire(lock, absl::Seconds(10));
      if (!handle.ok()) {
        failed(handle.status());
        continue;
      }
      p->samples_.push_back({start, NanosSince(start)});
      const MonoTime release = Now();
      if (absl::Status s = c->release(*handle); !s.ok()) {
        failed(s);
        continue;
      }
      p->samples_.push_back({release, NanosSince(release)});
    }
  });
  return probe;
}

Probe::~Probe() { Stop(); }

std::vector<Probe::Sample> Probe::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  return std::move(samples_);
}

std::vector<int64_t> Probe::Between(const std::vector<Sample>& samples, MonoTime from,
                                    MonoTime to) {
  std::vector<int64_t> ns;
  for (const Sample& s : samples) {
    if (s.start >= from && s.start < to) ns.push_back(s.ns);
  }
  return ns;
}

namespace {

constexpr int kCyclers = 8;

struct HeldPoint {
  size_t held = 0;
  CycleResult cycles;
  double client_cpu_us_per_cycle = 0;
  uint64_t lockd_rss_before = 0, lockd_rss = 0;
};

// acquire + release of one lock through a Client that holds `held` others.
class HoldingCycler : public Cycler {
 public:
  explicit HoldingCycler(std::unique_ptr<Client> client, std::string lock)
      : client_(std::move(client)), lock_(std::move(lock)) {}
  absl::StatusOr<int64_t> Cycle() override {
    const MonoTime start = Now();
    auto handle = client_->acquire(lock_, absl::Seconds(10));
    if (!handle.ok()) return handle.status();
    const int64_t took = NanosSince(start);
    if (absl::Status s = client_->release(*handle); !s.ok()) return s;
    return took;
  }

 private:
  std::unique_ptr<Client> client_;
  const std::string lock_;
};

CyclerFactory HoldingCyclers(const std::string& address, size_t held_each) {
  return [address, held_each](int c) -> absl::StatusOr<std::unique_ptr<Cycler>> {
    auto client = Client::Create({.server = address, .client_name = "scale"});
    if (!client.ok()) return client.status();
    for (size_t i = 0; i < held_each; ++i) {
      auto held = (*client)->acquire(absl::StrCat("scale/held/", c, "/", i), absl::Seconds(10));
      if (!held.ok()) {
        return absl::Status(held.status().code(),
                            absl::StrCat("holding lock ", i, ": ", held.status().message()));
      }
    }
    return std::make_unique<HoldingCycler>(std::move(*client), absl::StrCat("scale/cycle/", c));
  };
}

absl::StatusOr<HeldPoint> MeasureHeld(const Settings& s, size_t n) {
  const size_t each = (n + kCyclers - 1) / kCyclers;
  auto lockd = testing::LocalLockd::Start(
      {.binary = s.binary,
       .dir = absl::StrCat(s.root, "/scale-held-", n),
       .serve_args = {"--max-connections=4096", "--max-connections-per-peer=4096",
                      absl::StrCat("--max-locks-per-session=", std::max<size_t>(1024, each + 1))}});
  if (!lockd.ok()) return lockd.status();
  HeldPoint point;
  point.held = each * kCyclers;
  const pid_t pid = (*lockd)->child().pid();
  point.lockd_rss_before = ResidentBytes(pid);
  // The cyclers take their locks before RunCycles starts counting (and its CPU figure covers
  // the measuring alone).
  point.cycles = RunCycles(HoldingCyclers((*lockd)->address(), each), kCyclers, s.scale_seconds,
                           absl::StrCat("scale: ", point.held, " locks held"));
  const double cycles = point.cycles.cycles_per_second * s.scale_seconds;
  if (cycles > 0) point.client_cpu_us_per_cycle = point.cycles.process_cpu_seconds * 1e6 / cycles;
  point.lockd_rss = ResidentBytes(pid);
  return point;
}

constexpr size_t kLocksPerSession = 1000;
constexpr size_t kInFlight = 64;
constexpr int kFillers = 8;

// Churn until lockd has written one more snapshot: what a grant waits while one is taken.
struct SnapshotRun {
  bool done = false;     // a snapshot completed within the limit
  double seconds = 0;    // from the churn's start until lockd counted it
  size_t cycles = 0;     // the churn's
  Percentiles acquire;   // the churn's acquires
  Percentiles probe;     // the probe's requests
};

struct NamesPoint {
  size_t names = 0;
  double fill_seconds = 0;
  Percentiles probe;  // the probe's requests during the fill
  CycleResult cycles;
  SnapshotRun snapshot;
  uint64_t lockd_rss_before = 0, lockd_rss = 0;
  std::vector<double> restart_seconds;  // each restart's, ascending
};

// Sessions first, last (of kLocksPerSession locks each, the last one short) on one connection:
// each opened, then its locks acquired kInFlight at a time.
absl::Status FillSessions(const std::string& address, const FillPlan& plan, size_t first,
                          size_t last) {
  namespace req = protocol::request;
  auto conn = Connect(address);
  if (!conn.ok()) return conn.status();
  const size_t n = plan.locks;
  for (size_t session = first; session < last; ++session) {
    auto opened = (*conn)->Call(req::OpenSession(absl::Hours(1)));
    if (!opened.ok()) return opened.status();
    if (opened->code() != wire::OK) return absl::UnavailableError(opened->message());
    const uint64_t id = opened->open_session().session_id();
    const size_t end = std::min(n, (session + 1) * kLocksPerSession);
    for (size_t i = session * kLocksPerSession; i < end; i += kInFlight) {
      std::vector<wire::Request> acquires;
      for (size_t j = i; j < std::min(end, i + kInFlight); ++j) {
        const absl::Duration ttl = plan.ttl(j);
        if (ttl < absl::Seconds(1)) {
          return absl::DeadlineExceededError(
              absl::StrCat("filling: a lease would last only ", absl::FormatDuration(ttl),
                           "; the fill is slower than the plan allows"));
        }
        acquires.push_back(req::Acquire(id, absl::StrFormat("%s%08d", plan.prefix, j),
                                        absl::ZeroDuration(), ttl));
      }
      auto ids = (*conn)->SendAll(std::move(acquires));
      if (!ids.ok()) return ids.status();
      std::vector<wire::Response> granted;
      if (absl::Status s = ReceiveAll(**conn, *ids, granted); !s.ok()) return s;
      for (const wire::Response& r : granted) {
        if (r.code() != wire::OK) {
          return absl::UnavailableError(absl::StrCat("filling: ", r.message()));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> FillLocks(const std::string& address, const FillPlan& plan) {
  const size_t sessions = (plan.locks + kLocksPerSession - 1) / kLocksPerSession;
  constexpr size_t kSessionsPerConnection = 64;
  const size_t connections = (sessions + kSessionsPerConnection - 1) / kSessionsPerConnection;
  std::mutex mu;
  absl::Status error;
  std::atomic<size_t> next{0};
  const MonoTime start = Now();
  std::vector<std::thread> fillers;
  for (int t = 0; t < kFillers; ++t) {
    fillers.emplace_back([&] {
      for (size_t c = next++; c < connections; c = next++) {
        absl::Status s = FillSessions(address, plan, c * kSessionsPerConnection,
                                      std::min(sessions, (c + 1) * kSessionsPerConnection));
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (error.ok()) error = s;
          next = connections;
        }
      }
    });
  }
  for (std::thread& t : fillers) t.join();
  if (!error.ok()) return error;
  return absl::ToDoubleSeconds(Now() - start);
}

namespace {

// N held locks in lockd, the probe cycling beside the fill.
absl::Status Fill(const std::string& address, size_t n, NamesPoint& point) {
  auto probe = Probe::Start(address, "scale/probe");
  if (!probe.ok()) return probe.status();
  auto seconds = FillLocks(address, {.locks = n, .prefix = "scale/names/",
                                     .ttl = [](size_t) { return absl::Hours(1); }});
  const std::vector<Probe::Sample> samples = (*probe)->Stop();
  if (!seconds.ok()) return seconds.status();
  if ((*probe)->failures() > 0) {
    return absl::Status((*probe)->first_error().code(),
                        absl::StrCat("the probe beside the fill: ", (*probe)->failures(),
                                     " requests failed, the first: ",
                                     (*probe)->first_error().message()));
  }
  point.fill_seconds = *seconds;
  point.probe = Summarize(Probe::Between(samples, MonoTime::Min(), MonoTime::Max()));
  return absl::OkStatus();
}

// kCyclers raw connections cycle a lock each (a grant and a release logged per cycle) and the
// probe beside them, until lockd's snapshots_total rises (a snapshot follows a new WAL segment
// once the log since the last one is as large as it) or `limit` passes.
absl::StatusOr<SnapshotRun> UntilSnapshot(const std::string& address, absl::Duration limit) {
  namespace req = protocol::request;
  auto control = Connect(address);
  if (!control.ok()) return control.status();
  auto first = Stats(**control);
  if (!first.ok()) return first.status();
  const uint64_t before = first->snapshots_total();
  auto probe = Probe::Start(address, "scale/probe");
  if (!probe.ok()) return probe.status();
  std::atomic<bool> stop{false};
  std::atomic<size_t> cycles{0};
  std::mutex mu;
  std::vector<int64_t> acquire_ns;
  absl::Status error;
  std::vector<std::thread> churn;
  for (int c = 0; c < kCyclers; ++c) {
    churn.emplace_back([&, c] {
      std::vector<int64_t> mine;
      absl::Status failed = [&]() -> absl::Status {
        auto conn = Connect(address);
        if (!conn.ok()) return conn.status();
        auto opened = (*conn)->Call(req::OpenSession(absl::Minutes(10)));
        if (!opened.ok()) return opened.status();
        const uint64_t session = opened->open_session().session_id();
        const std::string lock = absl::StrCat("scale/churn/", c);
        while (!stop.load()) {
          const MonoTime start = Now();
          auto g = (*conn)->Call(req::Acquire(session, lock));
          if (!g.ok()) return g.status();
          if (g->code() != wire::OK) return absl::UnavailableError(g->message());
          mine.push_back(NanosSince(start));
          auto r = (*conn)->Call(req::Release(session, lock, g->acquire().token()));
          if (!r.ok()) return r.status();
          ++cycles;
        }
        return absl::OkStatus();
      }();
      std::lock_guard<std::mutex> lock(mu);
      acquire_ns.insert(acquire_ns.end(), mine.begin(), mine.end());
      if (error.ok()) error = failed;
    });
  }
  SnapshotRun run;
  const MonoTime start = Now();
  int shown = -1;  // the last whole second the progress line was given
  while (Now() - start < limit) {
    absl::SleepFor(absl::Milliseconds(50));
    auto stats = Stats(**control);
    if (!stats.ok()) {
      error = stats.status();
      break;
    }
    const double elapsed = absl::ToDoubleSeconds(Now() - start);
    if (static_cast<int>(elapsed) != shown) {
      shown = static_cast<int>(elapsed);
      Progress(absl::StrFormat("  until a snapshot %5.1fs  %8lu cycles", elapsed,
                               static_cast<unsigned long>(cycles.load())),
               elapsed);
    }
    if (stats->snapshots_total() > before) {
      run.done = true;
      break;
    }
  }
  run.seconds = absl::ToDoubleSeconds(Now() - start);
  // lockd counts the snapshot once it is written; the removal of what it covers follows. The
  // churn goes on for a second, so that grants beside that are measured too.
  if (run.done) absl::SleepFor(absl::Seconds(1));
  stop = true;
  for (std::thread& t : churn) t.join();
  EndProgress();
  const std::vector<Probe::Sample> samples = (*probe)->Stop();
  if (!error.ok()) return error;
  if ((*probe)->failures() > 0) return (*probe)->first_error();
  run.cycles = cycles;
  run.acquire = Summarize(std::move(acquire_ns));
  run.probe = Summarize(Probe::Between(samples, MonoTime::Min(), MonoTime::Max()));
  return run;
}

absl::StatusOr<NamesPoint> MeasureNames(const Settings& s, size_t n) {
  testing::LocalLockdOptions options{
      .binary = s.binary,
      .dir = absl::StrCat(s.root, "/scale-names-", n),
      .serve_args = {"--max-connections=4096", "--max-connections-per-peer=4096",
                     absl::StrCat("--max-locks-per-session=", kLocksPerSession)},
      .start_timeout = absl::Minutes(10)};
  if (s.scale_wal_segment_bytes > 0) {
    options.init_args.push_back(
        absl::StrCat("--wal-segment-bytes=", s.scale_wal_segment_bytes));
  }
  auto lockd = testing::LocalLockd::Start(options);
  if (!lockd.ok()) return lockd.status();
  NamesPoint point;
  point.names = n;
  point.lockd_rss_before = ResidentBytes((*lockd)->child().pid());
  logging::Program().Info(absl::StrCat("scale: filling lockd with ", n, " held locks"));
  if (absl::Status s = Fill((*lockd)->address(), n, point); !s.ok()) return s;
  point.cycles = RunCycles(HoldingCyclers((*lockd)->address(), 0), kCyclers, s.scale_seconds,
                           absl::StrCat("scale: ", n, " names held in lockd"));
  point.lockd_rss = ResidentBytes((*lockd)->child().pid());
  if (s.scale_snapshot) {
    auto snapshot = UntilSnapshot((*lockd)->address(), absl::Minutes(10));
    if (!snapshot.ok()) return snapshot.status();
    point.snapshot = *snapshot;
  }
  (*lockd)->child().Stop(absl::Minutes(1));
  lockd->reset();
  options.existing_state = true;
  for (int i = 0; i < s.scale_restarts; ++i) {
    const MonoTime restart = Now();
    auto again = testing::LocalLockd::Start(options);
    if (!again.ok()) return again.status();
    point.restart_seconds.push_back(absl::ToDoubleSeconds(Now() - restart));
    (*again)->child().Stop(absl::Minutes(1));
  }
  std::sort(point.restart_seconds.begin(), point.restart_seconds.end());
  return point;
}

absl::Status RunNames(const Settings& s, Report& report) {
  std::string table =
      "\n### Cost as the work grows: lock names held in lockd (8 cycling Clients beside them)\n\n"
      "| names held | fill (acquires/s) | probe p99 / max during the fill (ms) | cycles/s | "
      "acquire p50 (ms) | acquire p99 (ms) | lockd RSS | bytes per held lock | "
      "until a snapshot: s, churn acquire p99 / max, probe p99 / max (ms) | "
      "restart min / median / max (s) |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (size_t n : s.scale_names) {
    auto point = MeasureNames(s, n);
    if (!point.ok()) return point.status();
    const Percentiles acquire = Summarize(point->cycles.acquire_ns);
    if (point->cycles.errors > 0) {
      report.broken = true;
      logging::Program().Error(absl::StrCat("scale: ", point->cycles.errors, " cycles failed: ",
                                            point->cycles.first_error));
    }
    const double fill_rate = point->fill_seconds > 0 ? n / point->fill_seconds : 0;
    const double per_lock =
        (static_cast<double>(point->lockd_rss) - point->lockd_rss_before) / n;
    report.scale_names.push_back({{"names", n},
                                  {"fill_acquires_per_second", fill_rate},
                                  {"probe_during_fill", ToJson(point->probe)},
                                  {"cycles_per_second", point->cycles.cycles_per_second},
                                  {"acquire", ToJson(acquire)},
                                  {"lockd_rss_bytes", point->lockd_rss},
                                  {"lockd_bytes_per_held_lock", per_lock},
                                  {"snapshot",
                                   {{"completed", point->snapshot.done},
                                    {"churn_seconds", point->snapshot.seconds},
                                    {"churn_cycles", point->snapshot.cycles},
                                    {"churn_acquire", ToJson(point->snapshot.acquire)},
                                    {"probe", ToJson(point->snapshot.probe)}}},
                                  {"restart_seconds", point->restart_seconds},
                                  {"restart_median_seconds", Median(point->restart_seconds)},
                                  {"errors", point->cycles.errors}});
    absl::StrAppendFormat(&table,
                          "| %d | %.0f | %s / %s | %.0f | %s | %s | %.1f MB | %.0f | %s | "
                          "%.2f / %.2f / %.2f |\n",
                          n, fill_rate, Ms(point->probe.p99), Ms(point->probe.max),
                          point->cycles.cycles_per_second, Ms(acquire.p50), Ms(acquire.p99),
                          point->lockd_rss / 1e6, per_lock,
                          !s.scale_snapshot ? std::string("-")
                          : !point->snapshot.done
                              ? absl::StrFormat("none in %.0f s", point->snapshot.seconds)
                              : absl::StrFormat("%.1f, %s / %s, %s / %s", point->snapshot.seconds,
                                                Ms(point->snapshot.acquire.p99),
                                                Ms(point->snapshot.acquire.max),
                                                Ms(point->snapshot.probe.p99),
                                                Ms(point->snapshot.probe.max)),
                          point->restart_seconds.front(),
                          Median(point->restart_seconds), point->restart_seconds.back());
  }
  report.json["scale"]["names"] = report.scale_names;
  report.scale_names_table = table;
  return absl::OkStatus();
}

}  // namespace

absl::Status RunScaleWorkloads(const Settings& s, const Percentiles& fsync,
                               const Percentiles& loopback, Report& report) {
  if (!s.scale_names.empty()) {
    if (absl::Status names = RunNames(s, report); !names.ok()) return names;
  }
  if (!s.scale_sessions.empty()) {
    if (absl::Status st = RunSessions(s, report); !st.ok()) return st;
  }
  if (!s.scale_waiters.empty()) {
    if (absl::Status st = RunWaiters(s, fsync, loopback, report); !st.ok()) return st;
  }
  if (!s.scale_expiries.empty()) {
    if (absl::Status st = RunExpiries(s, report); !st.ok()) return st;
  }
  if (!s.scale_standby.empty()) {
    if (absl::Status st = RunStandby(s, report); !st.ok()) return st;
  }
  if (s.scale_held.empty()) return absl::OkStatus();
  Json points = Json::array();
  std::string table = absl::StrFormat(
      "\n### Cost as the work grows: locks held by the process (%d cycling Clients beside them)\n\n"
      "| locks held | cycles/s | vs the first | acquire p50 (ms) | acquire p99 (ms) | client CPU per cycle | "
      "lockd RSS | bytes per held lock |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
      kCyclers);
  double first_rate = 0;
  for (size_t n : s.scale_held) {
    logging::Program().Info(absl::StrCat("scale: ", n, " locks held by this process"));
    auto point = MeasureHeld(s, n);
    if (!point.ok()) return point.status();
    const Percentiles acquire = Summarize(point->cycles.acquire_ns);
    const double rate = point->cycles.cycles_per_second;
    if (first_rate == 0) first_rate = rate;
    if (point->cycles.errors > 0) {
      report.broken = true;
      logging::Program().Error(absl::StrCat("scale: ", point->cycles.errors, " cycles failed: ",
                                            point->cycles.first_error));
    }
    const double per_lock =
        n == 0 ? 0
               : (static_cast<double>(point->lockd_rss) - point->lockd_rss_before) / n;
    points.push_back({{"held", point->held},
                      {"cycles_per_second", rate},
                      {"acquire", ToJson(acquire)},
                      {"client_cpu_us_per_cycle", point->client_cpu_us_per_cycle},
                      {"lockd_rss_bytes", point->lockd_rss},
                      {"lockd_bytes_per_held_lock", per_lock},
                      {"errors", point->cycles.errors}});
    absl::StrAppendFormat(&table, "| %d | %.0f | %.2f | %s | %s | %.1f µs | %.1f MB | %.0f |\n",
                          point->held,
                          rate, first_rate > 0 ? rate / first_rate : 0, Ms(acquire.p50),
                          Ms(acquire.p99), point->client_cpu_us_per_cycle,
                          point->lockd_rss / 1e6, per_lock);
  }
  report.json["scale"]["held_locks"] = points;
  report.scale_table = table;
  report.scale_points = points;
  return absl::OkStatus();
}

}  // namespace fencelock::bench
