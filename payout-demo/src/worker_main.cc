// payout-worker: one worker process of the payout demo. For each unpaid payout it takes the
// payout's lock from lockd, claims the payout in the store under the lock's fencing token, and
// pays it through the rail, abandoning the moment its lease may no longer cover what it is
// about to do (docs/payout-flow.md). It exits 0 when no payout is left unpaid.
//
//   payout-worker --name=w1 --lockd=127.0.0.1:7420 --rail=127.0.0.1:7500 --store=payouts.db
//
// This is the worker users run: it has no fault points (payout-worker-faults has them).
#include "worker.h"

int main(int argc, char** argv) {
  return fencelock::payout::WorkerMain(argc, argv, /*make_faults=*/nullptr);
}
