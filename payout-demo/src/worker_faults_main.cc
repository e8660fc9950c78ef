// payout-worker-faults: payout-worker with fault points, for the demo runner and the fault
// harness only. It takes every payout-worker flag, plus three that stop it at exact places in
// the payment path or turn its client checks off. Nothing installs or documents it for users;
// the worker users run (payout-worker) is built without this file.
//
// --stop-self-after-claim=<delay> is the demo's freeze "right after a claim": the window between
// the claim and the next step is a single SQLite write, too short for the runner to catch from
// outside on a loaded machine, so the worker stops itself there (once) and the runner resumes
// it. --pause-before-submit=<id> stops it right before the irreversible step of payout <id>, and
// --skip-client-checks turns off checkStillHeld and D4 so that a worker paused past its lease
// really attempts the submit (ADR-006: UC-03 can only fire with the client check disabled; the
// fences must still hold).
#include <signal.h>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "worker.h"

ABSL_FLAG(absl::Duration, stop_self_after_claim, absl::InfiniteDuration(),
          "this long after starting, SIGSTOP itself right after its next claim of an unpaid "
          "payout, once (the demo runner resumes it with SIGCONT); default: never");
ABSL_FLAG(int64_t, pause_before_submit, 0,
          "SIGSTOP itself right before submitting this payout id, once (0: never)");
ABSL_FLAG(bool, skip_client_checks, false,
          "skip checkStillHeld and D4, so that a stale worker reaches the fences");

namespace fencelock::payout {
namespace {

class SignalFaults : public FaultPoints {
 public:
  void AfterClaim(int64_t id, const Record& record) override {
    if (absl::Now() < stop_after_claim_at_) return;
    stop_after_claim_at_ = absl::InfiniteFuture();
    record("paused", "SIGSTOP to itself right after the claim (fault point)");
    raise(SIGSTOP);
  }
  void BeforeSubmit(int64_t id, const Record& record) override {
    if (id != pause_before_submit_) return;
    pause_before_submit_ = 0;
    record("paused", "SIGSTOP to itself before the submit (fault point)");
    raise(SIGSTOP);
  }
  bool client_checks_off() const override { return skip_client_checks_; }

 private:
  absl::Time stop_after_claim_at_ = absl::Now() + absl::GetFlag(FLAGS_stop_self_after_claim);
  int64_t pause_before_submit_ = absl::GetFlag(FLAGS_pause_before_submit);
  const bool skip_client_checks_ = absl::GetFlag(FLAGS_skip_client_checks);
};

}  // namespace
}  // namespace fencelock::payout

int main(int argc, char** argv) {
  return fencelock::payout::WorkerMain(
      argc, argv, [] { return std::unique_ptr<fencelock::payout::FaultPoints>(
                           new fencelock::payout::SignalFaults()); });
}
