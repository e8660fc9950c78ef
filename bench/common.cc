#include "common.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fencelock::bench {

Percentiles Summarize(std::vector<int64_t> ns) {
  Percentiles p;
  p.samples = ns.size();
  if (ns.empty()) return p;
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    const size_t i =
        std::min(ns.size() - 1, static_cast<size_t>(q * static_cast<double>(ns.size())));
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

std::string Ms(double ms) { return absl::StrFormat("%.3f", ms); }

namespace {
const bool kTerminal = isatty(STDERR_FILENO) == 1;
bool g_open_line = false;
}  // namespace

void Progress(const std::string& line, double elapsed_seconds) {
  if (kTerminal) {
    std::fprintf(stderr, "\r%-100s", line.c_str());
    g_open_line = true;
  } else if (static_cast<int>(elapsed_seconds + 0.5) % 5 == 0) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void EndProgress() {
  if (g_open_line) std::fprintf(stderr, "\n");
  g_open_line = false;
}

CycleResult RunCycles(const CyclerFactory& make, int clients, double seconds,
                      const std::string& label) {
  std::atomic<bool> go{false}, stop{false};
  std::atomic<uint64_t> cycles{0};
  std::atomic<size_t> errors{0}, ready{0};
  std::mutex mu;
  CycleResult r;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::vector<int64_t> mine;
      auto cycler = make(c);
      auto fail = [&](const absl::Status& s) {
        ++errors;
        std::lock_guard<std::mutex> guard(mu);
        if (r.first_error.empty()) r.first_error = s.ToString();
      };
      if (!cycler.ok()) fail(cycler.status());
      ++ready;
      while (!go.load()) std::this_thread::yield();
      while (!stop.load() && cycler.ok()) {
        auto took = (*cycler)->Cycle();
        if (!took.ok()) {
          fail(took.status());
          break;
        }
        mine.push_back(*took);
        ++cycles;
      }
      std::lock_guard<std::mutex> guard(mu);
      r.acquire_ns.insert(r.acquire_ns.end(), mine.begin(), mine.end());
    });
  }
  while (ready.load() < static_cast<size_t>(clients)) absl::SleepFor(absl::Milliseconds(5));
  const MonoTime start = Now();
  const MonoTime end = start + absl::Seconds(seconds);
  go = true;
  uint64_t last = 0;
  for (MonoTime t = Now(); t < end; t = Now()) {
    const absl::Duration step = std::min(absl::Seconds(1), end - t);
    absl::SleepFor(step);
    const uint64_t now = cycles.load();
    Progress(absl::StrFormat("  %-58s %5.1fs  %9.0f cycles/s", label,
                             absl::ToDoubleSeconds(Now() - start),
                             static_cast<double>(now - last) / absl::ToDoubleSeconds(step)),
             absl::ToDoubleSeconds(Now() - start));
    last = now;
  }
  const uint64_t counted = cycles.load();
  const double elapsed = absl::ToDoubleSeconds(Now() - start);
  stop = true;
  for (std::thread& t : threads) t.join();
  EndProgress();
  r.cycles_per_second = static_cast<double>(counted) / elapsed;
  r.errors = errors;
  const Percentiles p = Summarize(r.acquire_ns);
  std::fprintf(stderr, "  %-58s %9.0f cycles/s  acquire p50 %.3f ms  p99 %.3f ms%s%s\n",
               label.c_str(), r.cycles_per_second, p.p50, p.p99, r.errors > 0 ? "  ERROR " : "",
               r.first_error.c_str());
  return r;
}

}  // namespace fencelock::bench
