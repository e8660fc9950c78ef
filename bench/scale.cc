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
// releases a lock of its own beside the fill (a probe: its longest acquire is the longest stall
// the fill caused, snapshots included, for lockd writes one after each 64 MiB of log once the
// log has grown by the last snapshot's size). Then 8 Clients cycle as above, lockd's resident
// memory per held lock is read, and lockd is stopped and served again from its state
// directory: the restart's time, until it answers.
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
namespace {

constexpr int kCyclers = 8;

// VmRSS of process `pid`, in bytes; 0 if it cannot be read.
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %llu kB", &kb) == 1) return kb * 1024;
  }
  return 0;
}

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

struct NamesPoint {
  size_t names = 0;
  double fill_seconds = 0;
  Percentiles probe;  // the probe's acquires during the fill
  CycleResult cycles;
  uint64_t lockd_rss_before = 0, lockd_rss = 0;
  double restart_seconds = 0;
};

std::string NameOf(size_t i) { return absl::StrFormat("scale/names/%08d", i); }

// Sessions first, last (of kLocksPerSession locks each, the last one short) on one connection:
// each opened, then its locks acquired kInFlight at a time.
absl::Status FillSessions(const std::string& address, size_t n, size_t first, size_t last) {
  namespace req = protocol::request;
  auto conn = Connect(address);
  if (!conn.ok()) return conn.status();
  const absl::Duration ttl = absl::Hours(1);
  for (size_t session = first; session < last; ++session) {
    auto opened = (*conn)->Call(req::OpenSession(ttl));
    if (!opened.ok()) return opened.status();
    if (opened->code() != wire::OK) return absl::UnavailableError(opened->message());
    const uint64_t id = opened->open_session().session_id();
    const size_t end = std::min(n, (session + 1) * kLocksPerSession);
    for (size_t i = session * kLocksPerSession; i < end; i += kInFlight) {
      std::vector<wire::Request> acquires;
      for (size_t j = i; j < std::min(end, i + kInFlight); ++j) {
        acquires.push_back(req::Acquire(id, NameOf(j), absl::ZeroDuration(), ttl));
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

// N held locks in lockd, from kFillers threads (a connection each per 64 sessions, for
// lockd's sessions-per-connection limit), the probe cycling beside them.
absl::Status Fill(const std::string& address, size_t n, NamesPoint& point) {
  const size_t sessions = (n + kLocksPerSession - 1) / kLocksPerSession;
  constexpr size_t kSessionsPerConnection = 64;
  const size_t connections = (sessions + kSessionsPerConnection - 1) / kSessionsPerConnection;
  auto probe_client = Client::Create({.server = address, .client_name = "scale-probe"});
  if (!probe_client.ok()) return probe_client.status();
  std::atomic<bool> filled{false};
  std::vector<int64_t> probe_ns;
  absl::Status probe_error;
  std::thread probe([&] {
    while (!filled.load()) {
      const MonoTime start = Now();
      auto handle = (*probe_client)->acquire("scale/probe", absl::Seconds(10));
      if (!handle.ok()) {
        probe_error = handle.status();
        return;
      }
      probe_ns.push_back(NanosSince(start));
      if (absl::Status s = (*probe_client)->release(*handle); !s.ok()) {
        probe_error = s;
        return;
      }
    }
  });
  std::mutex mu;
  absl::Status error;
  std::atomic<size_t> next{0};
  const MonoTime start = Now();
  std::vector<std::thread> fillers;
  for (int t = 0; t < kFillers; ++t) {
    fillers.emplace_back([&] {
      for (size_t c = next++; c < connections; c = next++) {
        absl::Status s = FillSessions(address, n, c * kSessionsPerConnection,
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
  point.fill_seconds = absl::ToDoubleSeconds(Now() - start);
  filled = true;
  probe.join();
  if (!error.ok()) return error;
  if (!probe_error.ok()) return probe_error;
  point.probe = Summarize(probe_ns);
  return absl::OkStatus();
}

absl::StatusOr<NamesPoint> MeasureNames(const Settings& s, size_t n) {
  testing::LocalLockdOptions options{
      .binary = s.binary,
      .dir = absl::StrCat(s.root, "/scale-names-", n),
      .serve_args = {"--max-connections=4096", "--max-connections-per-peer=4096",
                     absl::StrCat("--max-locks-per-session=", kLocksPerSession)},
      .start_timeout = absl::Minutes(10)};
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
  (*lockd)->child().Stop(absl::Minutes(1));
  lockd->reset();
  options.existing_state = true;
  const MonoTime restart = Now();
  auto again = testing::LocalLockd::Start(options);
  if (!again.ok()) return again.status();
  point.restart_seconds = absl::ToDoubleSeconds(Now() - restart);
  return point;
}

absl::Status RunNames(const Settings& s, Report& report) {
  std::string table =
      "\n### Cost as the work grows: lock names held in lockd (8 cycling Clients beside them)\n\n"
      "| names held | fill (acquires/s) | probe p99 / max during the fill (ms) | cycles/s | "
      "acquire p50 (ms) | acquire p99 (ms) | lockd RSS | bytes per held lock | restart (s) |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
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
                                  {"restart_seconds", point->restart_seconds},
                                  {"errors", point->cycles.errors}});
    absl::StrAppendFormat(&table,
                          "| %d | %.0f | %s / %s | %.0f | %s | %s | %.1f MB | %.0f | %.2f |\n",
                          n, fill_rate, Ms(point->probe.p99), Ms(point->probe.max),
                          point->cycles.cycles_per_second, Ms(acquire.p50), Ms(acquire.p99),
                          point->lockd_rss / 1e6, per_lock, point->restart_seconds);
  }
  report.json["scale"]["names"] = report.scale_names;
  report.scale_names_table = table;
  return absl::OkStatus();
}

}  // namespace

absl::Status RunScaleWorkloads(const Settings& s, Report& report) {
  if (!s.scale_names.empty()) {
    if (absl::Status names = RunNames(s, report); !names.ok()) return names;
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
