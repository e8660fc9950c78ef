// fencelock-sim: runs the deterministic simulator over a range of seeds.
//
//   fencelock-sim --seeds=10000 --from=1            # seeds 1..10000
//   fencelock-sim --seeds=1 --from=4711 --verbose   # one seed, with its figures
//   fencelock-sim --replicas=3 --seeds=2000         # three lockd replicas on the simulated etcd
//
// Prints progress, each failing seed with the properties it broke and the one-line command that
// replays it, and at the end seeds per second and a hash over every run's trace (the same range
// and flags always give the same hash). Exit status 1 if any seed failed, 2 for bad flags.
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "logging/logging.h"
#include "process/flags.h"
#include "protocol/defaults.h"
#include "sim/simulator.h"

ABSL_FLAG(uint64_t, seeds, 1000, "how many seeds to run");
ABSL_FLAG(uint64_t, from, 1, "the first seed");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(20), "simulated time per seed");
ABSL_FLAG(int, replicas, 1,
          "lockd replicas: 1 on its local log, or 2 to 3 on the simulated etcd (one serving, the "
          "others standing by)");
ABSL_FLAG(int, clients, 4, "simulated clients");
ABSL_FLAG(int, locks, 3, "locks they contend for");
ABSL_FLAG(double, margin, fencelock::defaults::kSafetyMargin, "the clients' safety margin (lock.client.safety-margin)");
ABSL_FLAG(double, clock_rate_bound, 0.02, "each clock runs within 1 +/- this of true time");
ABSL_FLAG(double, lockd_fast_clock, 0,
          "break the bound on purpose: lockd's clock runs this much fast (0.5: 1.5x); overlaps "
          "are then reported, not failures");
ABSL_FLAG(bool, network_faults, true, "delays, cuts and one-way partitions");
ABSL_FLAG(bool, disk_faults, true, "slow and failed syncs");
ABSL_FLAG(bool, crashes, true, "lockd crashes, losing what was not synced, and recovers");
ABSL_FLAG(bool, pauses, true, "pauses of clients and of lockd");
ABSL_FLAG(bool, verbose, false, "print every seed's figures");

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("fencelock-sim");
  absl::SetProgramUsageMessage(
      "runs lockd's core and the client lease rules under the deterministic simulator\n"
      "  fencelock-sim --seeds=N --from=S [--replicas=1] [--duration=20s] [--clients=4] [--locks=3]");
  fencelock::process::ParseFlags(argc, argv);
  fencelock::sim::SimOptions options;
  options.duration = absl::GetFlag(FLAGS_duration);
  options.replicas = absl::GetFlag(FLAGS_replicas);
  options.clients = absl::GetFlag(FLAGS_clients);
  options.locks = absl::GetFlag(FLAGS_locks);
  options.safety_margin = absl::GetFlag(FLAGS_margin);
  options.clock_rate_bound = absl::GetFlag(FLAGS_clock_rate_bound);
  options.lockd_fast_clock = absl::GetFlag(FLAGS_lockd_fast_clock);
  options.network_faults = absl::GetFlag(FLAGS_network_faults);
  options.disk_faults = absl::GetFlag(FLAGS_disk_faults);
  options.crashes = absl::GetFlag(FLAGS_crashes);
  options.pauses = absl::GetFlag(FLAGS_pauses);
  if (std::string problem = fencelock::sim::CheckOptions(options); !problem.empty()) {
    fencelock::logging::Program().Error(problem);
    return 2;
  }
  const uint64_t seeds = absl::GetFlag(FLAGS_seeds);
  const uint64_t from = absl::GetFlag(FLAGS_from);
  const bool verbose = absl::GetFlag(FLAGS_verbose);

  const auto start = std::chrono::steady_clock::now();
  uint64_t failed = 0, combined = 0xcbf29ce484222325ULL, overlaps = 0, events = 0;
  for (uint64_t i = 0; i < seeds; ++i) {
    options.seed = from + i;
    const fencelock::sim::SimResult r = fencelock::sim::Simulate(options);
    combined = (combined ^ r.trace_hash) * 0x100000001b3ULL;
    overlaps += r.overlaps;
    events += r.events;
    if (verbose || !r.ok) {
      std::printf(
          "seed %lu: %s trace %016lx events %lu grants %lu checks %lu overlaps %lu fenced %lu "
          "crashes %lu disk-faults %lu pauses %lu cuts %lu takeovers %lu etcd-faults %lu "
          "shared-grants %lu lock-delays %lu\n",
          static_cast<unsigned long>(r.seed), r.ok ? "ok" : "FAILED",
          static_cast<unsigned long>(r.trace_hash), static_cast<unsigned long>(r.events),
          static_cast<unsigned long>(r.grants), static_cast<unsigned long>(r.checks_passed),
          static_cast<unsigned long>(r.overlaps), static_cast<unsigned long>(r.fenced_out),
          static_cast<unsigned long>(r.crashes), static_cast<unsigned long>(r.disk_faults),
          static_cast<unsigned long>(r.pauses), static_cast<unsigned long>(r.cuts),
          static_cast<unsigned long>(r.takeovers), static_cast<unsigned long>(r.etcd_faults),
          static_cast<unsigned long>(r.shared_grants),
          static_cast<unsigned long>(r.delays_started));
    }
    if (!r.ok) {
      ++failed;
      for (const std::string& f : r.failures) std::printf("  %s\n", f.c_str());
      std::printf("  replay: %s\n", fencelock::sim::ReplayCommand(options).c_str());
    }
    if (!verbose && seeds >= 100 && (i + 1) % (seeds / 10) == 0) {
      fencelock::logging::Program().Info(absl::StrFormat(
          "%lu of %lu seeds, %lu failed", static_cast<unsigned long>(i + 1),
          static_cast<unsigned long>(seeds), static_cast<unsigned long>(failed)));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "fencelock-sim: seeds %lu..%lu: %lu failed, %lu overlaps, %lu events, %.1f s, %.0f seeds/s, "
      "combined trace %016lx\n",
      static_cast<unsigned long>(from), static_cast<unsigned long>(from + seeds - 1),
      static_cast<unsigned long>(failed), static_cast<unsigned long>(overlaps),
      static_cast<unsigned long>(events), seconds, seeds / seconds,
      static_cast<unsigned long>(combined));
  return failed == 0 ? 0 : 1;
}
