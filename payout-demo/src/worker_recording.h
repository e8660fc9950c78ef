// The payout worker's observation, kept out of its payment flow (worker.cc's Pay()): each step
// of the flow goes through one of these wrappers, which does the step and records it. A record
// is a line on the worker's log ("<name> <event> payout/<id> token <t> ...") and, with
// --history, a timed record for the harness's checker (process/history.h) whose begin was read
// before the step was tried.
#ifndef FENCELOCK_PAYOUT_DEMO_WORKER_RECORDING_H_
#define FENCELOCK_PAYOUT_DEMO_WORKER_RECORDING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lock-client/client.h"
#include "payout-demo/rail.h"
#include "payout-demo/store.h"
#include "process/history.h"

namespace fencelock::payout {

// The worker's log and history.
class Recorder {
 public:
  Recorder(std::string name, std::unique_ptr<history::Writer> history)
      : name_(std::move(name)), history_(std::move(history)) {}

  const std::string& name() const { return name_; }
  // A line on the log, after the worker's name.
  void Log(const std::string& line);
  // A log line about payout `id`.
  void Event(const char* event, int64_t id, uint64_t token, const std::string& detail = "");
  // A history record about payout `id`, begun at `begin` (history::NowNanos()).
  void Record(int64_t begin, const char* event, int64_t id, uint64_t token,
              const std::string& detail = "");
  // An event that is also a step of the run's history: the log line and the record.
  void Step(int64_t begin, const char* event, int64_t id, uint64_t token,
            const std::string& detail = "");
  // A fence's refusal (kAborted) is a "fenced" record; other errors are no fence decision.
  void Fenced(int64_t begin, const char* fence, int64_t id, uint64_t token, const absl::Status& s);

 private:
  const std::string name_;
  const std::unique_ptr<history::Writer> history_;
};

// The payout store's transitions under a lock, recorded.
class RecordedStore {
 public:
  RecordedStore(std::unique_ptr<PayoutStore> store, Recorder* recorder)
      : store_(std::move(store)), rec_(recorder) {}

  // What the worker reads and records about on its own (the backlog, abandonments).
  PayoutStore& store() { return *store_; }
  // "claimed" (with the state it found), or "claim-refused" and, from the fence, "fenced".
  absl::StatusOr<Payout> Claim(int64_t id, uint64_t token);
  // "marked-submitted", or "submit-mark-refused" (and "fenced").
  absl::Status MarkSubmitted(int64_t id, uint64_t token);
  // "paid", or "paid-mark-refused" (and "fenced").
  absl::Status MarkPaid(int64_t id, uint64_t token, int64_t rail_txn);

 private:
  const std::unique_ptr<PayoutStore> store_;
  Recorder* const rec_;
};

// The rail's two questions about a payout, recorded.
class RecordedRail {
 public:
  RecordedRail(std::unique_ptr<RailClient> rail, Recorder* recorder)
      : rail_(std::move(rail)), rec_(recorder) {}

  absl::Duration read_timeout() const { return rail_->read_timeout(); }
  // Whether payout `id` was paid, fenced by `token`: "status-asked" (and "found-paid"), or
  // "fenced".
  absl::StatusOr<RailReply> Status(int64_t id, uint64_t token);
  // The irreversible submit: "submitting", then "submitted", "duplicate", "rail-fenced" (and
  // "fenced"), "rail-error", or "submit-unknown" when no answer came.
  absl::StatusOr<RailReply> Submit(int64_t id, uint64_t token, int64_t amount_cents);

 private:
  const std::unique_ptr<RailClient> rail_;
  Recorder* const rec_;
};

// The client's checks on a held lock (ADR-006's checkStillHeld and D4), recorded. With
// `checks_off` (only the faults binary asks for it) they are skipped, so that a stale worker
// reaches the fences; the records are made either way.
class RecordedChecks {
 public:
  RecordedChecks(Client* client, Recorder* recorder, bool checks_off)
      : client_(client), rec_(recorder), checks_off_(checks_off) {}

  // Throws LockLostException when the lock may no longer be held.
  void CheckStillHeld(const LockHandle& lock);
  // "step-started" once the lease covers `step`'s worst case; throws StepRefusedException or
  // LockLostException when it does not.
  void BeginIrreversibleStep(int64_t id, const LockHandle& lock, const StepCost& step);

 private:
  Client* const client_;
  Recorder* const rec_;
  const bool checks_off_;
};

}  // namespace fencelock::payout

#endif  // FENCELOCK_PAYOUT_DEMO_WORKER_RECORDING_H_
