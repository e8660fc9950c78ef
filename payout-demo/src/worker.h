// The payout worker's body, shared by the two programs built from it: payout-worker, the one
// users run, and payout-worker-faults, the same worker with fault points that the demo runner
// and the harness use to stop it at exact places in the payment path. Fault points exist only
// in the second program: payout-worker passes none, has none of their flags and no code that
// stops it on request.
#ifndef FENCELOCK_PAYOUT_DEMO_WORKER_H_
#define FENCELOCK_PAYOUT_DEMO_WORKER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace fencelock::payout {

class FaultPoints {
 public:
  // Records one event on the worker's log and in its history, for the payout at hand.
  using Record = std::function<void(const char* event, const std::string& detail)>;

  virtual ~FaultPoints() = default;
  // Right after the worker claimed payout `id`, which was not yet paid, before the next step.
  virtual void AfterClaim(int64_t id, const Record& record) = 0;
  // Right before the irreversible submit of payout `id`, before D4 is checked.
  virtual void BeforeSubmit(int64_t id, const Record& record) = 0;
  // Whether checkStillHeld and D4 are skipped, so that a stale worker reaches the fences.
  virtual bool client_checks_off() const = 0;
};

// Parses the worker's flags, then calls `make_faults` (nullptr: no fault points) and runs the
// worker with what it returns. Returns the process's exit status.
int WorkerMain(int argc, char** argv, std::unique_ptr<FaultPoints> (*make_faults)());

}  // namespace fencelock::payout

#endif  // FENCELOCK_PAYOUT_DEMO_WORKER_H_
