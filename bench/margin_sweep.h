// The margin sweep (ADR-006 6.3 and 6.5's second trigger): the payout demo's own processes
// (lockd, the rail with a fixed latency, payout-worker) run at each safety margin and TTL, and
// the run reports what the margin costs: payouts per second, abandoned steps, lease renewals
// and the backlog's age.
#ifndef FENCELOCK_BENCH_MARGIN_SWEEP_H_
#define FENCELOCK_BENCH_MARGIN_SWEEP_H_

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace fencelock::bench {

struct MarginSweepOptions {
  std::string dir;  // each point runs in a fresh folder under it
  std::string lockd_binary, rail_binary, worker_binary;
  std::vector<absl::Duration> ttls;  // lock.session.ttl = lock.default.ttl at each point
  std::vector<double> margins;
  // Each point, once its workers have their sessions, runs two phases on one lockd and store:
  // `arrival_seconds` of payouts arriving at `arrival_rate` a second onto an empty store (the
  // backlog's age at the end), then `seconds` with `payouts` loaded at once (the workers'
  // capacity: payouts per second).
  double arrival_seconds = 5;
  double arrival_rate = 100;
  double seconds = 4;
  int workers = 4;
  absl::Duration rail_latency = absl::Milliseconds(20);        // each SUBMIT/STATUS, no jitter
  absl::Duration rail_read_timeout = absl::Milliseconds(500);  // a submit's D4 cost: this + 2 s
  int payouts = 5000;  // more than the workers can pay in `seconds`
};

struct MarginPoint {
  absl::Duration ttl;
  double margin = 0;
  absl::Duration usable;       // ttl x (1 - margin): a fresh lease's usable part
  absl::Duration submit_cost;  // D4's worst case for one rail submit
  // The workers refused to start: lease x (1 - margin) does not cover one submit, so
  // Client::Create refuses the configuration (ADR 0001). Nothing is paid.
  bool refused = false;
  std::string refusal;  // the first worker's own words
  double payouts_per_second = 0;  // capacity: paying a backlog larger than they can finish
  int64_t paid = 0;
  int64_t arrived = 0, paid_of_arrivals = 0;  // the arrivals phase
  std::map<std::string, int64_t> abandoned;  // by reason, over the point's whole run
  int64_t abandoned_total = 0;
  double renewals_per_second = 0;  // heartbeats of all workers
  double backlog_age_seconds = 0;  // the oldest unpaid payout's wait as the arrivals end
  int64_t paid_twice = 0, rail_duplicates = 0;
  double lock_fenced_out = 0;
};

// Runs every (ttl, margin) point in turn, TTL-major. Progress goes to stderr. A point that
// cannot run (a process that does not start) ends the sweep with that status.
std::vector<MarginPoint> RunMarginSweep(const MarginSweepOptions& options, std::string* error);

}  // namespace fencelock::bench

#endif  // FENCELOCK_BENCH_MARGIN_SWEEP_H_
