// The scale workload (issue 60): how the cost of the work grows with its size. Each figure
// names its size; a curve that bends upward is the bug this workload is for.
//
// Held locks per process (--scale-held): 8 Clients of one process, on its shared I/O thread,
// together hold N locks (N / 8 each, renewed by their own heartbeats), and each then acquires
// and releases one more lock of its own in a closed loop: the work a Client does per cycle
// beside the leases it holds. The cycle rate, the acquire's p50 and p99, the process's CPU per
// cycle (the heartbeats included: they are what holding costs) and lockd's resident memory, at
// each N, against a fresh lockd.
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench.h"
#include "lock-client/client.h"
#include "logging/logging.h"

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

}  // namespace

absl::Status RunScaleWorkloads(const Settings& s, Report& report) {
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
