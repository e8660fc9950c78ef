// fencelock-bench's report (bench.h): the summary's tables on stdout and in summary.md,
// results.json and the plots.
#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench.h"
#include "logging/logging.h"

namespace fencelock::bench {

void WriteReport(const Settings& s, const Percentiles& fsync, const Percentiles& loopback,
                 Report& report) {

  std::string summary = absl::StrCat(
      "floors: fdatasync 4 KiB p50 ", Ms(fsync.p50), " ms, p99 ", Ms(fsync.p99),
      " ms; loopback round trip p50 ", Ms(loopback.p50), " ms, p99 ", Ms(loopback.p99), " ms\n");
  if (s.run_heartbeat) {
    absl::StrAppend(
        &summary, "\nheartbeat RTT (period ", absl::FormatDuration(s.heartbeat),
        "; ADR-006 6.5 threshold lease x margin / 3 = ", absl::StrFormat("%.0f", s.threshold_ms),
        " ms)\n\n", report.table,
        report.library_table.empty() ? "" : absl::StrCat("\nheartbeat RTT through the client library (its own "
                                                  "period; percentiles interpolated in its histogram's "
                                                  "buckets, as histogram_quantile does)\n\n", report.library_table));
  }
  if (s.run_cycles) {
    absl::StrAppend(&summary, "\nlock cycles (acquire + release; ", s.rounds,
                    " interleaved rounds of ", s.cycle_seconds, " s; ", report.versions,
                    "peers' data on the same disk)\n\n", report.cycles_table);
  }
  if (s.run_margin && !s.rail.empty()) {
    absl::StrAppend(&summary, "\nmargin sweep (payout workload, ", s.margin_workers,
                    " workers, rail latency 20 ms, submit cost ",
                    report.points.empty() ? std::string("?") : absl::FormatDuration(report.points[0].submit_cost),
                    "; each point: ", s.arrival_seconds, " s of ", s.arrival_rate,
                    " arrivals/s onto an empty store, then ", s.margin_seconds,
                    " s paying a backlog)\n\n", report.margin_table);
  }
  if (!report.scaling_table.empty()) {
    absl::StrAppend(&summary, "\npayout scaling (the payout demo without faults: ", s.scaling_payouts,
                    " payouts, rail latency 20 ms + up to 10 ms; ", s.rounds,
                    " interleaved rounds; paid counts summed over the rounds)\n\n", report.scaling_table);
  }
  absl::StrAppend(&summary, report.scale_names_table, report.scale_sessions_table,
                  report.scale_waiters_table,
                  report.scale_expiries_table, report.scale_standby_table, report.scale_table);
  std::printf("%s", summary.c_str());
  if (!s.out.empty()) {
    std::ofstream(s.out + "/results.json") << report.json.dump(2) << "\n";
    std::ofstream(s.out + "/summary.md") << "# fencelock-bench\n\n" << summary;
    if (!s.gnuplot.empty()) {
      logging::Program().Info(absl::StrFormat("plots: gnuplot into %s", s.out.c_str()));
      std::vector<std::pair<std::string, std::string>> plots;
      if (!report.variants.empty()) {
        plots.emplace_back("heartbeat_rtt", HeartbeatPlot(report.variants, s.threshold_ms, s.out + "/heartbeat_rtt.dat"));
      }
      if (s.run_cycles) {
        plots.emplace_back("lock_cycles", CyclesPlot(report.systems, s.clients, report.runs, s.out + "/lock_cycles.dat"));
      }
      if (!report.scale_points.empty()) {
        plots.emplace_back("scale_held_locks", ScalePlot(report.scale_points, s.out + "/scale_held_locks.dat"));
      }
      if (!report.points.empty()) plots.emplace_back("margin_sweep", MarginPlot(report.points, s.out + "/margin_sweep.dat"));
      for (const auto& [name, body] : plots) {
        if (absl::Status plotted = Gnuplot(s.gnuplot, s.out, name, body); !plotted.ok()) {
          logging::Program().Error(plotted.ToString());
          report.broken = true;
        }
      }
    }
  }
}

}  // namespace fencelock::bench
