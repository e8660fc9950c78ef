// fencelock-bench's plots (bench.h): gnuplot scripts over data files, rendered to PNG.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench.h"
#include "process/process.h"

namespace fencelock::bench {
namespace {

// Colours that stay apart on a white page, one per line of a plot.
const char* Colour(size_t i) {
  static constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                             "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  return kColours[i % (sizeof(kColours) / sizeof(kColours[0]))];
}

// gnuplot reads its data from a file; a title inside double quotes must not hold one.
std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

}  // namespace

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

std::string ScalePlot(const Json& points, const std::string& data_path) {
  std::ofstream data(data_path);
  data << "# held cycles_per_second acquire_p99_ms client_cpu_us_per_cycle\n";
  for (const Json& p : points) {
    data << p["held"].get<size_t>() << " " << p["cycles_per_second"].get<double>() << " "
         << p["acquire"]["p99_ms"].get<double>() << " "
         << p["client_cpu_us_per_cycle"].get<double>() << "\n";
  }
  return absl::StrCat(
      "set multiplot layout 2,1\nset logscale x\nset xlabel 'locks held by the process'\n"
      "set title 'Lock cycles of 8 Clients beside the locks the process holds'\n"
      "set ylabel 'cycles per second'\nset yrange [0:*]\n"
      "plot '", data_path, "' using 1:2 with linespoints lw 2 title 'cycles/s'\n"
      "set title 'CPU of the process per cycle (its heartbeats included)'\n"
      "set ylabel 'microseconds'\nset yrange [0:*]\n"
      "plot '", data_path, "' using 1:4 with linespoints lw 2 title 'CPU per cycle'\n"
      "unset multiplot\n");
}

}  // namespace fencelock::bench
