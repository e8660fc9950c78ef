// The payout store: one SQLite database shared by every payout worker process. A payout moves
//
//   PENDING ──claim──▶ CLAIMED ──mark submitted──▶ SUBMITTED ──mark paid──▶ PAID
//      ▲                  │                           │  ▲
//      └────abandon───────┘          abandon keeps it ┘  └ claim (a later worker)
//
// Every transition carries the fencing token of the worker's lock on the payout and is
// admitted by the store's own fence (fence 2, fence::AdmitInTransaction) in the same
// transaction as the change: a worker whose lock was taken over cannot change the payout any
// more, whatever it believes about time. A SUBMITTED payout is never returned to PENDING: its
// submit may have reached the rail, so the next worker asks the rail before submitting again.
#ifndef FENCELOCK_PAYOUT_DEMO_STORE_H_
#define FENCELOCK_PAYOUT_DEMO_STORE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct sqlite3;

namespace fencelock::payout {

enum class PayoutState { kPending, kClaimed, kSubmitted, kPaid };
const char* PayoutStateName(PayoutState state);

struct Payout {
  int64_t id = 0;
  int64_t amount_cents = 0;
  PayoutState state = PayoutState::kPending;
  uint64_t token = 0;      // the token of the latest claim (0 before any)
  std::string worker;      // who holds the latest claim ("" when none)
  int64_t rail_txn = 0;    // the rail's transaction id once PAID
  int claims = 0;          // how many times it was claimed
};

// The fence key and the lock name of a payout: "payout/<id>".
std::string PayoutKey(int64_t id);

struct StoreSummary {
  std::map<PayoutState, int64_t> by_state;
  // Abandonments recorded by workers, by reason (LossReason names and "store_fenced_out",
  // "rail_fenced_out", "rail_unavailable").
  std::map<std::string, int64_t> abandoned;
  int64_t total = 0;
  int64_t claims = 0;  // claims over all payouts; above `total` means retries
};

class PayoutStore {
 public:
  // Opens (creating if needed) the store at `path`: WAL journal, synchronous=FULL, waits up to
  // 10 s for another process's write lock.
  static absl::StatusOr<std::unique_ptr<PayoutStore>> Open(const std::string& path);
  ~PayoutStore();

  // Adds `count` PENDING payouts of `amount_cents` each; returns the first new id.
  absl::StatusOr<int64_t> Load(int64_t count, int64_t amount_cents);

  // Claims the payout under `token` for `worker` and returns it as it was before the claim.
  // PENDING and CLAIMED (a claim whose worker died) become CLAIMED; SUBMITTED stays SUBMITTED
  // under the new claim; PAID changes nothing. kAborted (fenced out) if a higher token has been
  // admitted for it; kNotFound for an unknown id.
  absl::StatusOr<Payout> Claim(int64_t id, uint64_t token, const std::string& worker);

  // CLAIMED → SUBMITTED, before the submit is sent. kAborted when fenced out or when `token`
  // is not the latest claim's; kFailedPrecondition from another state.
  absl::Status MarkSubmitted(int64_t id, uint64_t token);

  // SUBMITTED → PAID with the rail's transaction id. Idempotent for the same transaction.
  absl::Status MarkPaid(int64_t id, uint64_t token, int64_t rail_txn);

  // The worker gives the payout up: CLAIMED → PENDING; SUBMITTED stays SUBMITTED. Fenced like
  // every transition (a refusal means a later worker already took it over). The abandonment
  // is recorded under `reason` whatever the outcome.
  absl::Status Abandon(int64_t id, uint64_t token, const std::string& worker,
                       const std::string& reason);

  // Records an abandonment that changes no payout (e.g. the claim itself was fenced out).
  absl::Status RecordAbandon(int64_t id, uint64_t token, const std::string& worker,
                             const std::string& reason);

  absl::StatusOr<Payout> Get(int64_t id);
  // Ids of payouts not PAID, lowest first, at most `limit`.
  absl::StatusOr<std::vector<int64_t>> Unpaid(int64_t limit);
  // The payout currently claimed (CLAIMED or SUBMITTED) by `worker`, if any.
  absl::StatusOr<std::optional<Payout>> HeldBy(const std::string& worker);
  // How long the oldest unpaid payout has been waiting (wall clock, for the backlog gauge);
  // zero when none is.
  absl::StatusOr<absl::Duration> OldestUnpaidAge();
  absl::StatusOr<StoreSummary> Summary();

 private:
  explicit PayoutStore(sqlite3* db) : db_(db) {}
  // Admits `token` at the payout's fence and returns the payout; kAborted, naming the holder's
  // token, when `token` is not the latest claim's (`claim_must_match`).
  absl::StatusOr<Payout> Fenced(int64_t id, uint64_t token, bool claim_must_match);

  sqlite3* db_;
};

}  // namespace fencelock::payout

#endif  // FENCELOCK_PAYOUT_DEMO_STORE_H_
