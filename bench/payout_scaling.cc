// One run of the payout demo without faults, for the payout scaling workload (bench.h): its
// figures from the report it writes (--report_json).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench.h"
#include "logging/logging.h"

namespace fencelock::bench {
namespace {

// The number after "key": in the demo's report (a flat JSON object of numbers and booleans).
// A number (or a boolean, as 1 or 0) at the top level of the demo's report.
absl::StatusOr<double> ReportNumber(const Json& report, const std::string& key) {
  const auto it = report.find(key);
  if (it == report.end()) return absl::DataLossError(absl::StrCat("no \"", key, "\" in the demo's report"));
  if (it->is_boolean()) return it->get<bool>() ? 1 : 0;
  if (!it->is_number()) {
    return absl::DataLossError(absl::StrCat("\"", key, "\" in the demo's report is not a number"));
  }
  return it->get<double>();
}

}  // namespace

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
  const Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::DataLossError(absl::StrCat("the payout demo's report ", report, " is not JSON"));
  }
  DemoRun run;
  for (auto [key, field] : std::vector<std::pair<const char*, int64_t*>>{
           {"paid_once", &run.paid_once}, {"paid_twice", &run.paid_twice}, {"left", &run.left},
           {"lock_fenced_out_total", &run.lock_fenced_out},
           {"rail_duplicate_attempted_total", &run.rail_duplicates}}) {
    auto v = ReportNumber(parsed, key);
    if (!v.ok()) return v.status();
    *field = static_cast<int64_t>(*v);
  }
  auto rate = ReportNumber(parsed, "payouts_per_second");
  if (!rate.ok()) return rate.status();
  run.payouts_per_second = *rate;
  auto ok = ReportNumber(parsed, "ok");
  if (!ok.ok()) return ok.status();
  run.ok = *ok != 0 && *status == 0;
  return run;
}

void RunPayoutScaling(const Settings& s, Report& report) {
  if (!s.demo.empty()) {
    logging::Program().Info(absl::StrFormat(
        "payout scaling: %d payouts, workers %s, %d rounds", s.scaling_payouts,
        absl::StrJoin(s.scaling_workers, ",").c_str(), s.rounds));
    std::map<int, Runs> rates;
    std::map<int, DemoRun> worst;  // per worker count: the sum of what must be zero
    for (int round = 0; round < s.rounds && !report.broken; ++round) {
      for (int w : s.scaling_workers) {
        auto run = RunDemo(s.demo, s.binary, s.rail, s.worker,
                           absl::StrCat(s.root, "/scaling-", w, "-", round), w, s.scaling_payouts);
        if (!run.ok()) {
          logging::Program().Info(absl::StrFormat(
              "payout scaling: %s", run.status().ToString().c_str()));
          report.broken = true;
          break;
        }
        std::fprintf(stderr, "  %d workers, round %d: %.1f payouts/s, %lld of %d paid once\n", w,
                     round + 1, run->payouts_per_second, static_cast<long long>(run->paid_once),
                     s.scaling_payouts);
        rates[w].rates.push_back(run->payouts_per_second);
        DemoRun& bad = worst[w];
        bad.paid_twice += run->paid_twice;
        bad.left += run->left;
        bad.lock_fenced_out += run->lock_fenced_out;
        bad.rail_duplicates += run->rail_duplicates;
        bad.paid_once += run->paid_once;
        if (run->paid_twice > 0 || run->left > 0 || run->lock_fenced_out > 0 ||
            run->rail_duplicates > 0 || !run->ok) {
          report.broken = true;
        }
      }
    }
    const double one = rates.count(s.scaling_workers.front()) > 0
                           ? rates[s.scaling_workers.front()].median() : 0;
    report.scaling_table =
        "| workers | payouts/s min | median | max | median / the first row | paid once | paid twice | "
        "left unpaid | lock_fenced_out_total | rail_duplicate_attempted_total |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
    Json& scaling = report.json["payout_scaling"] = {{"payouts", s.scaling_payouts},
                                                     {"runs", Json::array()}};
    for (int w : s.scaling_workers) {
      if (rates.count(w) == 0) continue;
      const Runs& r = rates[w];
      const DemoRun& bad = worst[w];
      scaling["runs"].push_back({{"workers", w},
                                 {"payouts_per_s_median", r.median()},
                                 {"min", r.min()},
                                 {"max", r.max()},
                                 {"paid_once", bad.paid_once},
                                 {"paid_twice", bad.paid_twice},
                                 {"left", bad.left},
                                 {"lock_fenced_out", bad.lock_fenced_out},
                                 {"rail_duplicates", bad.rail_duplicates}});
      absl::StrAppend(&report.scaling_table, "| ", w, " | ",
                      absl::StrFormat("%.1f | %.1f | %.1f", r.min(), r.median(), r.max()), " | ",
                      absl::StrFormat("%.2f", one > 0 ? r.median() / one : 0.0), " | ",
                      bad.paid_once, " | ", bad.paid_twice, " | ", bad.left, " | ",
                      bad.lock_fenced_out, " | ", bad.rail_duplicates, " |\n");
    }
  }
}

}  // namespace fencelock::bench
