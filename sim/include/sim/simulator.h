// The deterministic simulator: one seed drives lockd's real core (lock service, dispatch, reply
// gate, expiry, stall watch) and its real local commit log over a simulated disk, with clients
// that are the client library's own core (lock-client/core: every rule of ADR-006), over a
// simulated network, on simulated clocks that may run at different rates. Faults: network
// delay, cuts and one-way partitions; slow, failed and torn disk writes; pauses of clients and of
// lockd; lockd crashes that lose everything after the last sync, then recovery.
//
// Every run checks, as it goes:
//   - tokens strictly increase and are never reissued, across crashes;
//   - no committed (hence no acknowledged) grant, release or session is lost by a crash: the
//     recovered state is the committed log replayed;
//   - the reply gate: no reply leaves lockd before the records it may reflect are committed;
//   - no client passes checkStillHeld for a lock while another session holds it on lockd, as long
//     as the clock-rate bound and the margin hold (with them broken on purpose, such overlaps are
//     counted and reported instead, and every stale request must still be fenced out);
//   - waiters are granted in FIFO order;
//   - no lease of a session passes a check once lockd told its client the session is gone;
//   - what a client gives up is given back, again after a resume on a new connection, and no
//     grant is kept for a client that holds no handle for it;
//   - the client core completes every operation once.
// The same seed and options give the same run, event for event: trace_hash repeats.
//
// Nothing here is global: a Simulation owns everything it runs. Not thread-safe.
#ifndef FENCELOCK_SIM_SIMULATOR_H_
#define FENCELOCK_SIM_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "protocol/defaults.h"

namespace fencelock::sim {

struct SimOptions {
  uint64_t seed = 1;
  // Simulated duration of one run. Default: 20 s.
  absl::Duration duration = absl::Seconds(20);
  // lockd replicas: 1 runs lockd on its local log over the simulated disk; 2 or 3 run replicas
  // on the simulated etcd (sim_etcd.h), one serving and the others standing by. Default: 1.
  int replicas = 1;
  // Clients, and the locks they contend for. Defaults: 4 and 3.
  int clients = 4;
  int locks = 3;
  // The client's safety margin (lock.client.safety-margin). Default: 0.30.
  double safety_margin = defaults::kSafetyMargin;
  // Each node's clock runs at a rate within 1 ± this bound of true time. The lease rules are
  // safe while the bound is well under the margin. Default: 0.02 (2 %).
  double clock_rate_bound = 0.02;
  // Break the bound on purpose: lockd's clock runs this much faster than true time (and the
  // clients' at most clock_rate_bound). Overlaps are then reported, not failures; the fences
  // must still hold. Default: 0 (off).
  double lockd_fast_clock = 0;
  // Enable faults. Default: all on.
  bool network_faults = true;
  bool disk_faults = true;
  bool crashes = true;
  bool pauses = true;
};

struct SimResult {
  uint64_t seed = 0;
  bool ok = true;
  std::vector<std::string> failures;  // each violated property, with the time and the detail
  uint64_t trace_hash = 0;            // FNV-1a over every event of the run
  // What happened, for summaries.
  uint64_t events = 0;
  uint64_t grants = 0;                // grants acknowledged to clients
  uint64_t checks_passed = 0;         // checkStillHeld calls that said "held"
  uint64_t overlaps = 0;              // checkStillHeld passes while another session held it
  uint64_t fenced_out = 0;            // stale requests lockd refused (fence 1)
  uint64_t crashes = 0;
  uint64_t disk_faults = 0;
  uint64_t pauses = 0;
  uint64_t cuts = 0;
  uint64_t withdrawals = 0;           // queued Acquires lockd said it withdrew
  uint64_t takeovers = 0;             // replicas that began to serve (on etcd)
  uint64_t etcd_faults = 0;           // elections, lost replies, slow or cut-off members, ...
  uint64_t shared_grants = 0;         // grants in shared mode (ADR 0006)
  uint64_t delays_started = 0;        // lock delays started by a lost holder
};

// Empty if `options` can be simulated; otherwise what is wrong with them.
std::string CheckOptions(const SimOptions& options);

// Runs one simulation. `options` must pass CheckOptions.
SimResult Simulate(const SimOptions& options);

// The command that replays `options` exactly (for a failing seed's report).
std::string ReplayCommand(const SimOptions& options);

}  // namespace fencelock::sim

#endif  // FENCELOCK_SIM_SIMULATOR_H_
