// fencelock-powercut: power cuts under load, on a file system that forgets what was never
// synced (fencelock-forgetfs; issue 38, docs/durability.md).
//
//   fencelock-powercut lockd --cuts=50 --seed=1     lockd alone (lockd_cuts.cc)
//   fencelock-powercut payout --cuts=10 --seed=1    the payout demo's whole host (payout_cuts.cc)
//
// Exits 0 when every check held, 1 otherwise, 2 on bad arguments.
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "logging/logging.h"
#include "process/flags.h"
#include "runs.h"

ABSL_FLAG(int, cuts, 50, "power cuts in the run (1 to 100000)");
ABSL_FLAG(uint64_t, seed, 0, "the run's seed; 0 draws one from the clock (printed)");
ABSL_FLAG(std::string, dir, "", "where the run goes; default: a fresh folder under $TMPDIR");
ABSL_FLAG(bool, keep, false, "keep the run's folder after a green run (a failed one is kept)");
ABSL_FLAG(std::string, lockd_binary, LOCKD_BINARY, "the lockd executable");
ABSL_FLAG(std::string, forgetfs_binary, FORGETFS_BINARY, "the fencelock-forgetfs executable");
ABSL_FLAG(std::string, rail_binary, RAIL_BINARY, "payout: the payout-rail executable");
ABSL_FLAG(std::string, worker_binary, WORKER_BINARY, "payout: the payout-worker executable");
ABSL_FLAG(bool, allow_refusals, false,
          "count a lockd that refuses to start (naming the damaged file) as a pass, and go on from "
          "a fresh state; by default a refusal fails the run");
ABSL_FLAG(uint64_t, wal_segment_bytes, 64 << 10,
          "lockd --wal-segment-bytes (4096 to 1 GiB): small, so that segments roll and "
          "snapshots follow often");
ABSL_FLAG(int, workers, 3, "payout: worker processes (1 to 16)");
ABSL_FLAG(int, payouts_per_round, 100, "payout: payouts loaded before each round (1 to 10000)");

namespace fencelock::powercut {
namespace {

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "fencelock-powercut: %s\nusage: fencelock-powercut lockd|payout [--cuts=N] "
               "[--seed=S] [--dir=D] [--keep]\n",
               why.c_str());
  return 2;
}

int Main(const std::vector<std::string>& args) {
  if (args.size() != 1 || (args[0] != "lockd" && args[0] != "payout")) {
    return Usage("name one run: lockd or payout");
  }
  RunOptions options{.cuts = absl::GetFlag(FLAGS_cuts),
                     .lockd_binary = absl::GetFlag(FLAGS_lockd_binary),
                     .forgetfs_binary = absl::GetFlag(FLAGS_forgetfs_binary),
                     .wal_segment_bytes = absl::GetFlag(FLAGS_wal_segment_bytes),
                     .allow_refusals = absl::GetFlag(FLAGS_allow_refusals),
                     .rail_binary = absl::GetFlag(FLAGS_rail_binary),
                     .worker_binary = absl::GetFlag(FLAGS_worker_binary),
                     .workers = absl::GetFlag(FLAGS_workers),
                     .payouts_per_round = absl::GetFlag(FLAGS_payouts_per_round)};
  if (options.cuts < 1 || options.cuts > 100000) {
    return Usage("--cuts must be 1 to 100000, got " + std::to_string(options.cuts));
  }
  if (options.wal_segment_bytes < 4096 || options.wal_segment_bytes > (uint64_t{1} << 30)) {
    return Usage("--wal-segment-bytes must be 4096 to 1 GiB");
  }
  if (options.workers < 1 || options.workers > 16) return Usage("--workers must be 1 to 16");
  if (options.payouts_per_round < 1 || options.payouts_per_round > 10000) {
    return Usage("--payouts-per-round must be 1 to 10000");
  }
  options.seed = absl::GetFlag(FLAGS_seed);
  if (options.seed == 0) {
    options.seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) % 1000000 + 1;
  }
  options.dir = absl::GetFlag(FLAGS_dir);
  if (options.dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    options.dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/fencelock-powercut-XXXXXX";
    if (mkdtemp(options.dir.data()) == nullptr) {
      logging::Program().Error(absl::StrFormat("cannot make %s", options.dir.c_str()));
      return 1;
    }
  } else if (std::error_code ec; !std::filesystem::create_directories(options.dir, ec) &&
                                 !std::filesystem::is_empty(options.dir, ec)) {
    return Usage("--dir " + options.dir + " must be new or empty");
  }
  std::printf("fencelock-powercut %s --cuts=%d --seed=%lu --dir=%s\n", args[0].c_str(),
              options.cuts, static_cast<unsigned long>(options.seed), options.dir.c_str());
  std::fflush(stdout);
  const int status = args[0] == "lockd" ? RunLockdCuts(options) : RunPayoutCuts(options);
  if (status == 0 && !absl::GetFlag(FLAGS_keep)) {
    std::filesystem::remove_all(options.dir);
  } else {
    std::printf("kept: %s\n", options.dir.c_str());
  }
  return status;
}

}  // namespace
}  // namespace fencelock::powercut

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("fencelock-powercut");
  std::vector<std::string> args = fencelock::process::ParseFlags(argc, argv);
  args.erase(args.begin());
  signal(SIGPIPE, SIG_IGN);
  return fencelock::powercut::Main(args);
}
