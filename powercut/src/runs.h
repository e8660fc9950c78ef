// The two power-cut runs of fencelock-powercut (powercut_main.cc): lockd alone under load
// (lockd_cuts.cc), and the payout demo's whole host (payout_cuts.cc). Each returns the run's
// exit status: 0 when every check held, 1 otherwise.
#ifndef FENCELOCK_POWERCUT_RUNS_H_
#define FENCELOCK_POWERCUT_RUNS_H_

#include <cstdint>
#include <string>

namespace fencelock::powercut {

struct RunOptions {
  std::string dir;  // the run's folder: the mount, the store, the logs
  uint64_t seed = 1;
  int cuts = 50;
  std::string lockd_binary, forgetfs_binary;
  // lockd --wal-segment-bytes: small, so that segments roll and snapshots follow often.
  uint64_t wal_segment_bytes = 64 << 10;
  // A lockd that refuses to start (naming the damaged file) passes, and the run goes on from a
  // fresh state; by default a refusal fails the run.
  bool allow_refusals = false;
  // The payout run only.
  std::string rail_binary, worker_binary;
  int workers = 3;
  int payouts_per_round = 100;
};

int RunLockdCuts(const RunOptions& options);
int RunPayoutCuts(const RunOptions& options);

}  // namespace fencelock::powercut

#endif  // FENCELOCK_POWERCUT_RUNS_H_
