// The history checker: reads the timed records every process of a run appended
// (process/history.h) and verifies what must hold whatever the faults were:
//
//   1. no fencing token was granted twice;
//   2. a grant requested after another grant was received has the higher token;
//   3. each fence (the payout store's and the rail's, per payout) admitted non-decreasing
//      tokens: no token was admitted after a higher one had been, and no token refused that
//      was not lower than one admitted before;
//   4. no payout was paid twice (the rail's SUBMIT ... PAID records);
//   5. replicated runs (lockd --history): no lockd replica acted (granted, renewed, confirmed)
//      at or past the ownership deadline it held then, no replica acted inside the span another
//      one had claimed by acting (from an act to the deadline it held for it), and the tokens
//      granted by all replicas together rise strictly in the order they were granted.
//
// Timestamps are boot-time readings taken by different processes; each step is known only to
// have taken effect inside its [begin, end], so "after" means "began after the other ended".
// The rail serves one request at a time, so its records are in its fence's order.
//
// Client-believed overlaps are reported separately and are not violations: two holders of the
// same payout (or lock, for the replicated runs' long holders) whose holding intervals (from
// grant received to their last step taken as holder, or their last checkStillHeld that passed)
// overlap. With the client check on they are expected to be zero; with it disabled (UC-03) a
// paused worker makes one, and the fences must still hold.
#ifndef FENCELOCK_HARNESS_CHECKER_H_
#define FENCELOCK_HARNESS_CHECKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "process/history.h"

namespace fencelock::harness {

struct CheckResult {
  int64_t records = 0;
  int64_t grants = 0;
  int64_t fence_decisions = 0;  // store and rail, admitted or refused
  int64_t payments = 0;         // SUBMITs the rail paid
  int64_t lockd_acts = 0;       // grants, renewals and confirmations lockd replicas recorded
  std::vector<std::string> violations;
  std::vector<std::string> client_overlaps;
  bool ok() const { return violations.empty(); }
};

CheckResult Check(const std::vector<history::Record>& records);

// Reads every *.log in `dir` (one history file per process) and checks them together.
absl::StatusOr<CheckResult> CheckDirectory(const std::string& dir);

}  // namespace fencelock::harness

#endif  // FENCELOCK_HARNESS_CHECKER_H_
