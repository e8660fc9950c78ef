#include "margin_sweep.h"

#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench.h"
#include "common.h"
#include "lock-client/client.h"
#include "logging/logging.h"
#include "metrics/http_get.h"
#include "payout-demo/cluster.h"

namespace fencelock::bench {
namespace {

// The last non-empty line of a worker's log: why it exited.
std::string LastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

absl::StatusOr<int64_t> Paid(payout::PayoutStore& store) {
  auto summary = store.Summary();
  if (!summary.ok()) return summary.status();
  auto it = summary->by_state.find(payout::PayoutState::kPaid);
  return it == summary->by_state.end() ? 0 : it->second;
}

// Heartbeats the worker on metrics port `port` has sent: its RTT histogram's count.
double Heartbeats(int port) {
  auto n = metrics::ScrapeSample("127.0.0.1", port, "lock_heartbeat_rtt_seconds_count");
  return n.ok() ? *n : 0;
}

absl::StatusOr<MarginPoint> RunPoint(const MarginSweepOptions& o, absl::Duration ttl,
                                     double margin) {
  MarginPoint p;
  p.ttl = ttl;
  p.margin = margin;
  p.usable = ttl * (1.0 - margin);
  p.submit_cost = StepCost::RailSubmit(o.rail_read_timeout).worst_case;
  const std::string dir = absl::StrCat(o.dir, "/margin-", absl::FormatDuration(ttl), "-",
                                       absl::StrFormat("%.2f", margin));
  std::filesystem::create_directories(dir);
  auto cluster = payout::Cluster::Start({.dir = dir,
                                         .lockd_binary = o.lockd_binary,
                                         .rail_binary = o.rail_binary,
                                         .worker_binary = o.worker_binary,
                                         .rail_latency = o.rail_latency,
                                         .rail_jitter = absl::ZeroDuration(),
                                         .rail_read_timeout = o.rail_read_timeout,
                                         .session_ttl = ttl,
                                         .lock_ttl = ttl,
                                         .margin = margin});
  if (!cluster.ok()) return cluster.status();
  payout::Cluster& c = **cluster;
  std::vector<int> ports;
  for (int i = 0; i < o.workers; ++i) {
    const std::string name = absl::StrCat("w", i);
    auto w = c.StartWorker(name, {"--wait-for-work", "--metrics-port=0",
                                   "--metrics-port-file=" + dir + "/" + name + ".port"});
    if (!w.ok()) return w.status();
  }
  for (int i = 0; i < o.workers; ++i) {
    const std::string name = absl::StrCat("w", i);
    auto port = process::AwaitPortFile(dir + "/" + name + ".port", *c.worker(name), absl::Seconds(30));
    if (port.ok()) {
      ports.push_back(*port);
    } else if (!c.worker(name)->running()) {
      // Client::Create refused the TTL and margin: no worker can pay anything.
      p.refused = true;
      if (p.refusal.empty()) p.refusal = LastLine(c.Path("logs/" + name + ".log"));
    } else {
      return port.status();
    }
  }
  const std::string label = absl::StrFormat("  margin sweep: TTL %s, margin %.2f",
                                            absl::FormatDuration(ttl), margin);
  double heartbeats_before = 0;
  for (int port : ports) heartbeats_before += Heartbeats(port);
  const MonoTime measured = Now();

  // 1. Arrivals: --arrival-rate payouts a second, loaded every 50 ms onto an empty store.
  {
    const MonoTime start = Now();
    const MonoTime end = start + absl::Seconds(o.arrival_seconds);
    double owed = 0;
    MonoTime last = start, shown = start;
    int64_t arrived = 0;
    for (MonoTime t = Now(); t < end; t = Now()) {
      owed += o.arrival_rate * absl::ToDoubleSeconds(t - last);
      last = t;
      if (const int64_t n = static_cast<int64_t>(owed); n > 0) {
        if (absl::Status s = c.Load(n, 100); !s.ok()) return s;
        owed -= static_cast<double>(n);
        arrived += n;
      }
      if (t - shown >= absl::Seconds(1)) {
        shown = t;
        auto age = c.store().OldestUnpaidAge();
        Progress(absl::StrFormat("%-44s %5.1fs  arrivals: %lld  oldest unpaid %.2f s", label,
                                 absl::ToDoubleSeconds(t - start), static_cast<long long>(arrived),
                                 age.ok() ? absl::ToDoubleSeconds(*age) : 0.0),
                 absl::ToDoubleSeconds(t - start));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    auto age = c.store().OldestUnpaidAge();
    if (!age.ok()) return age.status();
    p.backlog_age_seconds = absl::ToDoubleSeconds(*age);
    auto paid = Paid(c.store());
    if (!paid.ok()) return paid.status();
    p.arrived = arrived;
    p.paid_of_arrivals = *paid;
  }

  // 2. Capacity: a backlog larger than the workers can pay, and how fast they pay it.
  if (!p.refused) {
    if (absl::Status s = c.Load(o.payouts, 100); !s.ok()) return s;
    auto paid_before = Paid(c.store());
    if (!paid_before.ok()) return paid_before.status();
    const MonoTime start = Now();
    const MonoTime end = start + absl::Seconds(o.seconds);
    int64_t last = *paid_before;
    for (MonoTime t = Now(); t < end; t = Now()) {
      const absl::Duration step = std::min(absl::Seconds(1), end - t);
      absl::SleepFor(step);
      auto paid = Paid(c.store());
      if (!paid.ok()) return paid.status();
      Progress(absl::StrFormat("%-44s %5.1fs  capacity: %6.0f payouts/s", label,
                               absl::ToDoubleSeconds(Now() - start),
                               static_cast<double>(*paid - last) / absl::ToDoubleSeconds(step)),
               absl::ToDoubleSeconds(Now() - start));
      last = *paid;
    }
    auto paid_after = Paid(c.store());
    if (!paid_after.ok()) return paid_after.status();
    p.paid = *paid_after - *paid_before;
    p.payouts_per_second = static_cast<double>(p.paid) / absl::ToDoubleSeconds(Now() - start);
  }
  double heartbeats_after = 0;
  for (int port : ports) heartbeats_after += Heartbeats(port);
  p.renewals_per_second =
      (heartbeats_after - heartbeats_before) / absl::ToDoubleSeconds(Now() - measured);
  EndProgress();
  for (const std::string& name : c.worker_names()) c.worker(name)->Signal(SIGTERM);
  for (const std::string& name : c.worker_names()) (void)c.worker(name)->Wait(absl::Seconds(10));
  auto reconciled = c.Reconcile();
  if (!reconciled.ok()) return reconciled.status();
  p.abandoned = reconciled->abandoned;
  for (const auto& [reason, n] : p.abandoned) p.abandoned_total += n;
  p.paid_twice = reconciled->paid_twice;
  p.rail_duplicates = reconciled->rail_duplicates;
  p.lock_fenced_out = reconciled->lock_fenced_out;
  std::fprintf(stderr, "%-44s %6.0f payouts/s  %5.1f renewals/s  %lld abandoned  backlog %.2f s%s\n",
               label.c_str(), p.payouts_per_second, p.renewals_per_second,
               static_cast<long long>(p.abandoned_total), p.backlog_age_seconds,
               p.refused ? "  (the workers refused to start)" : "");
  return p;
}

}  // namespace

std::vector<MarginPoint> RunMarginSweep(const MarginSweepOptions& options, std::string* error) {
  std::vector<MarginPoint> points;
  for (absl::Duration ttl : options.ttls) {
    for (double margin : options.margins) {
      auto p = RunPoint(options, ttl, margin);
      if (!p.ok()) {
        *error = absl::StrCat("margin sweep, TTL ", absl::FormatDuration(ttl), ", margin ", margin,
                              ": ", p.status().ToString());
        return points;
      }
      if (p->refused) {
        std::fprintf(stderr, "  margin sweep: TTL %s, margin %.2f: the workers refuse to start: %s\n",
                     absl::FormatDuration(ttl).c_str(), margin, p->refusal.c_str());
      }
      points.push_back(*std::move(p));
    }
  }
  return points;
}

void RunMarginSweepWorkload(const Settings& s, Report& report) {
  if (!s.rail.empty()) {
    logging::Program().Info(absl::StrFormat(
        "margin sweep: %zu TTLs x %zu margins, %d workers, %.1f s each", s.margin_ttls.size(),
        s.margins.size(), s.margin_workers, s.margin_seconds));
    std::string sweep_error;
    report.points = RunMarginSweep({.dir = s.root + "/margin",
                             .lockd_binary = s.binary,
                             .rail_binary = s.rail,
                             .worker_binary = s.worker,
                             .ttls = s.margin_ttls,
                             .margins = s.margins,
                             .arrival_seconds = s.arrival_seconds,
                             .arrival_rate = s.arrival_rate,
                             .seconds = s.margin_seconds,
                             .workers = s.margin_workers},
                            &sweep_error);
    if (!sweep_error.empty()) {
      logging::Program().Error(sweep_error);
      report.broken = true;
    }
    report.margin_table =
        "| TTL | margin | usable lease | capacity payouts/s | of the TTL's best | arrivals paid | "
        "backlog age s | abandoned | renewals/s | paid twice |\n|---|---|---|---|---|---|---|---|---|---|\n";
    Json& sweep = report.json["margin_sweep"] = {
        {"submit_cost_ms",
         report.points.empty() ? 0.0 : absl::ToDoubleMilliseconds(report.points[0].submit_cost)},
        {"workers", s.margin_workers},
        {"capacity_seconds", s.margin_seconds},
        {"arrival_seconds", s.arrival_seconds},
        {"arrival_rate", s.arrival_rate},
        {"points", Json::array()}};
    for (size_t i = 0; i < report.points.size(); ++i) {
      const MarginPoint& p = report.points[i];
      double best = 0;
      for (const MarginPoint& q : report.points) {
        if (q.ttl == p.ttl) best = std::max(best, q.payouts_per_second);
      }
      // A point whose workers started and paid nothing measured nothing.
      if (p.paid_twice > 0 || p.rail_duplicates > 0 || p.lock_fenced_out != 0 ||
          (!p.refused && p.paid == 0)) {
        report.broken = true;
      }
      std::string reasons;
      for (const auto& [reason, n] : p.abandoned) absl::StrAppend(&reasons, reasons.empty() ? "" : ", ", reason, " ", n);
      sweep["points"].push_back({{"ttl_s", absl::ToDoubleSeconds(p.ttl)},
                                 {"margin", p.margin},
                                 {"usable_s", absl::ToDoubleSeconds(p.usable)},
                                 {"refused", p.refused},
                                 {"payouts_per_s", p.payouts_per_second},
                                 {"arrived", p.arrived},
                                 {"paid_of_arrivals", p.paid_of_arrivals},
                                 {"backlog_age_s", p.backlog_age_seconds},
                                 {"abandoned", p.abandoned_total},
                                 {"renewals_per_s", p.renewals_per_second},
                                 {"paid_twice", p.paid_twice},
                                 {"rail_duplicates", p.rail_duplicates}});
      absl::StrAppend(&report.margin_table, "| ", absl::FormatDuration(p.ttl), " | ", absl::StrFormat("%.2f", p.margin),
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
  }
}

}  // namespace fencelock::bench
