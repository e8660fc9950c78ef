// fencelock-harness: runs the pause-and-fault scenarios against real processes and checks each
// run's history (docs/harness.md).
//
//   fencelock-harness list
//   fencelock-harness run <scenario>... [--seed=N] [--quick] [--report-md=F] [--report-json=F]
//   fencelock-harness run all ...        every scenario on one lockd
//   fencelock-harness run ha ...         every replicated one (etcd cluster, three lockds)
//   fencelock-harness soak [--count=N] [--duration=D] [--seed=N] [--quick] [--ha] [--report-md=F] ...
//   fencelock-harness check <history-dir>
//
// Every run prints its scenario and seed; `run <scenario> --seed=<seed>` repeats it. A run's
// directory (state, logs, history) is kept when it fails or with --keep.
//
// Exit status: 0 when every run passed, 1 when one failed, 2 for bad arguments.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "harness/checker.h"
#include "logging/logging.h"
#include "scenario.h"
#include "fencelock/report.pb.h"
#include "process/flags.h"
#include "process/json.h"

ABSL_FLAG(uint64_t, seed, 0, "seed of the first run; 0 draws one from the clock (printed)");
ABSL_FLAG(bool, quick, false, "the short variants (fewer payouts, fewer faults), as in CTest");
ABSL_FLAG(int, count, 0, "soak: number of runs (0: until --duration)");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(), "soak: run for this long");
ABSL_FLAG(std::string, dir, "", "where run directories go; default: a fresh one under $TMPDIR");
ABSL_FLAG(std::string, tls_dir, "",
          "run lockd and the workers over TLS with the certificates in this directory, made by "
          "scripts/make-certs.sh DIR lockd worker; default: plaintext loopback");
ABSL_FLAG(std::string, etcd_tls_dir, "",
          "replicated scenarios: etcd requires client certificates, from this directory made by "
          "scripts/make-certs.sh DIR etcd lockd; default: plaintext to etcd");
ABSL_FLAG(bool, keep, false, "keep every run's directory, not only the failed ones");
ABSL_FLAG(std::string, report_md, "", "write the report as a markdown table to this file");
ABSL_FLAG(std::string, report_json, "", "write the report as JSON to this file");
ABSL_FLAG(std::string, lockd_binary, LOCKD_BINARY, "the lockd executable");
ABSL_FLAG(std::string, rail_binary, RAIL_BINARY, "the payout-rail executable");
ABSL_FLAG(std::string, etcd_binary, "/usr/bin/etcd",
          "the etcd executable of the replicated scenarios (Debian's etcd-server)");
ABSL_FLAG(absl::Duration, etcd_owner_ttl, absl::ZeroDuration(),
          "replicated scenarios: the replicas' --etcd-owner-ttl (0: each scenario's own, 2s for "
          "most)");
ABSL_FLAG(int, elections, 0,
          "ha-etcd-elections: how many times the etcd leader is killed (0: 3 with --quick, else "
          "10; at most 100)");
ABSL_FLAG(bool, ha, false, "soak: draw from the replicated scenarios instead of the others");
ABSL_FLAG(std::string, worker_binary, WORKER_BINARY,
          "the worker executable: payout-worker-faults (payout-worker with fault points)");

namespace fencelock::harness {
namespace {

volatile sig_atomic_t g_interrupted = 0;

// Replicated runs: per scenario, min / median / max of the takeover (figure "takeover: <name>
// serving <seconds> s ...": the standby began to serve) and of the failover (figure "failover:
// <seconds> s ...": the first grant by another replica), both from the fault.
std::string FailoverSummary(const std::vector<Outcome>& runs) {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by_scenario;
  for (const Outcome& o : runs) {
    for (const auto& [name, value] : o.figures) {
      if (name == "takeover") {
        const size_t at = value.find(" serving ");
        if (at != std::string::npos) {
          by_scenario[o.scenario].first.push_back(std::strtod(value.c_str() + at + 9, nullptr));
        }
      } else if (name == "failover") {
        by_scenario[o.scenario].second.push_back(std::strtod(value.c_str(), nullptr));
      }
    }
  }
  if (by_scenario.empty()) return "";
  auto spread = [](std::vector<double> v) {
    if (v.empty()) return std::string("- | - | -");
    std::sort(v.begin(), v.end());
    return absl::StrFormat("%.2f s | %.2f s | %.2f s", v.front(), v[v.size() / 2], v.back());
  };
  std::string md =
      "From the fault to a standby serving (takeover) and to the first grant by another lockd "
      "replica (failover); the lease on the prefix is 2 s, the target at most the TTL + 1 s:\n\n"
      "| scenario | runs | takeover min | median | max | failover min | median | max | failover over 3 s |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& [scenario, figures] : by_scenario) {
    const auto& failovers = figures.second;
    const auto over = std::count_if(failovers.begin(), failovers.end(), [](double s) { return s > 3.0; });
    absl::StrAppend(&md, "| ", scenario, " | ", failovers.size(), " | ", spread(figures.first), " | ",
                    spread(failovers), " | ", over, " |\n");
  }
  return md + "\n";
}

std::string Markdown(const std::vector<Outcome>& runs, const std::string& title) {
  int failed = 0;
  for (const auto& o : runs) failed += o.passed() ? 0 : 1;
  std::string md = absl::StrCat("# ", title, "\n\n", runs.size(), " runs, ", runs.size() - failed,
                                " passed, ", failed, " failed; history violations: ");
  int64_t violations = 0, overlaps = 0;
  for (const auto& o : runs) {
    violations += static_cast<int64_t>(o.check.violations.size());
    overlaps += static_cast<int64_t>(o.check.client_overlaps.size());
  }
  absl::StrAppend(&md, violations, "; client-believed overlaps: ", overlaps,
                  " (expected only in uc03-unchecked)\n\n");
  absl::StrAppend(&md, FailoverSummary(runs));
  absl::StrAppend(&md, "| # | scenario | seed | result | wall | figures |\n|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < runs.size(); ++i) {
    const Outcome& o = runs[i];
    std::vector<std::string> figures;
    for (const auto& [name, value] : o.figures) figures.push_back(absl::StrCat(name, ": ", value));
    std::string result = o.passed() ? "pass" : "FAIL: " + absl::StrJoin(o.failures, "; ");
    absl::StrAppend(&md, "| ", i + 1, " | ", o.scenario, " | ", o.seed, " | ",
                    absl::StrReplaceAll(result, {{"|", "/"}}), " | ",
                    absl::StrFormat("%.1f s", absl::ToDoubleSeconds(o.wall)), " | ",
                    absl::StrReplaceAll(absl::StrJoin(figures, "; "), {{"|", "/"}}), " |\n");
  }
  return md;
}

std::string Json(const std::vector<Outcome>& runs) {
  report::HarnessReport report;
  for (const Outcome& o : runs) {
    report::HarnessReport::Run* run = report.add_runs();
    run->set_scenario(o.scenario);
    run->set_seed(o.seed);
    run->set_passed(o.passed());
    run->set_wall_seconds(absl::ToDoubleSeconds(o.wall));
    for (const auto& [name, value] : o.figures) {
      auto* figure = run->add_figures();
      figure->set_name(name);
      figure->set_value(value);
    }
    for (const auto& f : o.failures) run->add_failures(f);
    auto* history = run->mutable_history();
    history->set_records(static_cast<int32_t>(o.check.records));
    history->set_grants(static_cast<int32_t>(o.check.grants));
    history->set_fence_decisions(static_cast<int32_t>(o.check.fence_decisions));
    history->set_payments(static_cast<int32_t>(o.check.payments));
    for (const auto& v : o.check.violations) history->add_violations(v);
    for (const auto& v : o.check.client_overlaps) history->add_client_overlaps(v);
  }
  return process::ToJson(report);
}

int WriteReports(const std::vector<Outcome>& runs, const std::string& title) {
  for (const auto& [path, text] : {std::pair{absl::GetFlag(FLAGS_report_md), Markdown(runs, title)},
                                   std::pair{absl::GetFlag(FLAGS_report_json), Json(runs)}}) {
    if (path.empty()) continue;
    std::ofstream out(path, std::ios::trunc);
    out << text;
    if (!out.flush()) {
      logging::Program().Error(absl::StrFormat("cannot write %s", path.c_str()));
      return 1;
    }
    std::printf("report written to %s\n", path.c_str());
  }
  return 0;
}

class Runner {
 public:
  Runner() {
    root_ = absl::GetFlag(FLAGS_dir);
    if (root_.empty()) {
      const char* tmp = getenv("TMPDIR");
      root_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/fencelock-harness-XXXXXX";
      if (mkdtemp(root_.data()) == nullptr) root_ = "/tmp/fencelock-harness";
    }
    std::filesystem::create_directories(root_);
  }

  Outcome Run(const Scenario& scenario, uint64_t seed) {
    Env env;
    env.seed = seed;
    env.quick = absl::GetFlag(FLAGS_quick);
    env.tls_dir = absl::GetFlag(FLAGS_tls_dir);
    env.etcd_tls_dir = absl::GetFlag(FLAGS_etcd_tls_dir);
    env.etcd_owner_ttl = absl::GetFlag(FLAGS_etcd_owner_ttl);
    env.elections = absl::GetFlag(FLAGS_elections);
    env.binaries = {absl::GetFlag(FLAGS_lockd_binary), absl::GetFlag(FLAGS_rail_binary),
                    absl::GetFlag(FLAGS_worker_binary), absl::GetFlag(FLAGS_etcd_binary)};
    env.dir = absl::StrCat(root_, "/", runs_.size() + 1, "-", scenario.name, "-", seed);
    std::filesystem::remove_all(env.dir);
    std::filesystem::create_directories(env.dir);
    std::printf("[%zu] %s --seed=%lu%s%s ...\n", runs_.size() + 1, scenario.name.c_str(),
                static_cast<unsigned long>(seed),
                env.tls_dir.empty() ? "" : absl::StrCat(" --tls-dir=", env.tls_dir).c_str(),
                env.etcd_tls_dir.empty() || !scenario.replicated
                    ? ""
                    : absl::StrCat(" --etcd-tls-dir=", env.etcd_tls_dir).c_str());
    std::fflush(stdout);
    Outcome out = RunScenario(scenario, env);
    std::printf("[%zu] %s --seed=%lu: %s in %.1f s\n", runs_.size() + 1, scenario.name.c_str(),
                static_cast<unsigned long>(seed), out.passed() ? "pass" : "FAIL",
                absl::ToDoubleSeconds(out.wall));
    for (const auto& [name, value] : out.figures) std::printf("      %s: %s\n", name.c_str(), value.c_str());
    for (const auto& f : out.failures) std::printf("      FAILED: %s\n", f.c_str());
    if (!out.passed() || absl::GetFlag(FLAGS_keep)) {
      std::printf("      kept: %s\n", env.dir.c_str());
    } else {
      std::filesystem::remove_all(env.dir);
    }
    std::fflush(stdout);
    runs_.push_back(out);
    return out;
  }

  int Finish(const std::string& title) {
    int failed = 0;
    for (const auto& o : runs_) failed += o.passed() ? 0 : 1;
    std::printf("\n%s", Markdown(runs_, title).c_str());
    if (int rc = WriteReports(runs_, title); rc != 0) return rc;
    if (failed == 0 && !absl::GetFlag(FLAGS_keep) && absl::GetFlag(FLAGS_dir).empty()) {
      std::filesystem::remove_all(root_);
    }
    return failed == 0 && g_interrupted == 0 ? 0 : 1;
  }

 private:
  std::string root_;
  std::vector<Outcome> runs_;
};

uint64_t FirstSeed() {
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) % 1'000'000'007;
  return seed;
}

int Usage() {
  std::fprintf(stderr,
               "usage: fencelock-harness list | run <scenario>...|all|ha | soak [--ha] | check <history-dir>\n"
               "  (fencelock-harness --help for the flags)\n");
  return 2;
}

int Main(const std::vector<std::string>& args) {
  if (args.empty()) return Usage();
  const std::string& command = args[0];
  if (command == "list") {
    for (const Scenario& s : Scenarios()) std::printf("%-19s %s\n", s.name.c_str(), s.proves.c_str());
    return 0;
  }
  if (command == "check") {
    if (args.size() != 2) return Usage();
    auto r = CheckDirectory(args[1]);
    if (!r.ok()) {
      logging::Program().Error(r.status().ToString());
      return 2;
    }
    std::printf("%ld records, %ld grants, %ld fence decisions, %ld payments\n",
                static_cast<long>(r->records), static_cast<long>(r->grants),
                static_cast<long>(r->fence_decisions), static_cast<long>(r->payments));
    for (const auto& v : r->violations) std::printf("VIOLATION: %s\n", v.c_str());
    for (const auto& o : r->client_overlaps) std::printf("client-believed overlap: %s\n", o.c_str());
    std::printf("%s\n", r->ok() ? "no violations" : "VIOLATIONS FOUND");
    return r->ok() ? 0 : 1;
  }
  if (const int e = absl::GetFlag(FLAGS_elections); e < 0 || e > 100) {
    logging::Program().Error(absl::StrFormat("--elections must be 0 to 100, got %d", e));
    return 2;
  }
  if (const absl::Duration ttl = absl::GetFlag(FLAGS_etcd_owner_ttl);
      ttl != absl::ZeroDuration() && (ttl < absl::Seconds(2) || ttl > absl::Minutes(1))) {
    logging::Program().Error(absl::StrFormat(
        "--etcd-owner-ttl must be 0 or 2s to 1m, got %s", absl::FormatDuration(ttl).c_str()));
    return 2;
  }
  for (const auto& [flag, files] :
       {std::pair<std::string, std::vector<const char*>>{
            absl::GetFlag(FLAGS_tls_dir), {"ca.crt", "lockd.crt", "lockd.key", "worker.crt", "worker.key"}},
        {absl::GetFlag(FLAGS_etcd_tls_dir), {"ca.crt", "etcd.crt", "etcd.key", "lockd.crt", "lockd.key"}}}) {
    for (const char* file : files) {
      if (!flag.empty() && !std::filesystem::is_regular_file(flag + "/" + file)) {
        logging::Program().Error(absl::StrFormat(
            "%s/%s is missing (scripts/make-certs.sh %s %s)", flag.c_str(), file, flag.c_str(),
            files[1] == std::string("lockd.crt") ? "lockd worker" : "etcd lockd"));
        return 2;
      }
    }
  }
  uint64_t seed = FirstSeed();
  if (command == "run") {
    std::vector<const Scenario*> chosen;
    for (size_t i = 1; i < args.size(); ++i) {
      if (args[i] == "all" || args[i] == "ha") {
        for (const Scenario& s : Scenarios()) {
          if (s.replicated == (args[i] == "ha")) chosen.push_back(&s);
        }
      } else if (const Scenario* s = FindScenario(args[i])) {
        chosen.push_back(s);
      } else {
        logging::Program().Error(absl::StrFormat(
            "no scenario \"%s\" (see: fencelock-harness list)", args[i].c_str()));
        return 2;
      }
    }
    if (chosen.empty()) return Usage();
    Runner runner;
    for (const Scenario* s : chosen) {
      if (g_interrupted) break;
      runner.Run(*s, seed++);
    }
    return runner.Finish("fencelock harness run");
  }
  if (command == "soak") {
    const int count = absl::GetFlag(FLAGS_count);
    const absl::Duration duration = absl::GetFlag(FLAGS_duration);
    if (count < 0 || (count == 0 && duration <= absl::ZeroDuration())) {
      logging::Program().Error("soak needs --count=N (N > 0) or --duration=D");
      return 2;
    }
    std::printf("soak: %s, first seed %lu; each run draws its scenario from its seed\n",
                count > 0 ? absl::StrCat(count, " runs").c_str()
                          : absl::StrCat("for ", absl::FormatDuration(duration)).c_str(),
                static_cast<unsigned long>(seed));
    Runner runner;
    const absl::Time until = absl::Now() + duration;
    for (int i = 0; (count == 0 || i < count) && (duration <= absl::ZeroDuration() || absl::Now() < until);
         ++i, ++seed) {
      if (g_interrupted) break;
      std::vector<const Scenario*> mix;
      for (const Scenario& s : Scenarios()) {
        if (s.replicated == absl::GetFlag(FLAGS_ha)) mix.push_back(&s);
      }
      runner.Run(*mix[seed % mix.size()], seed);
    }
    return runner.Finish("fencelock harness soak");
  }
  return Usage();
}

}  // namespace
}  // namespace fencelock::harness

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("fencelock-harness");
  absl::SetProgramUsageMessage(
      "pause-and-fault scenarios against real processes, with a history checker\n"
      "  fencelock-harness list | run <scenario>...|all|ha | soak --count=N [--ha] | check <history-dir>");
  std::vector<std::string> positional = fencelock::process::ParseFlags(argc, argv);
  positional.erase(positional.begin());  // the program name
  struct sigaction on_signal = {};
  on_signal.sa_handler = [](int) { fencelock::harness::g_interrupted = 1; };
  sigaction(SIGINT, &on_signal, nullptr);
  sigaction(SIGTERM, &on_signal, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return fencelock::harness::Main(positional);
}
