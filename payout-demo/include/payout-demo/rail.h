// The payment rail simulator's pieces: its durable ledger with its own fence, the line protocol
// it speaks, and the client a worker uses. The rail binary (payout-rail) puts the ledger behind
// a TCP port on loopback.
//
// Protocol: one request line, one reply line, ASCII, at most 512 bytes each.
//
//   HELLO                               → HELLO read_timeout_ms=<ms>
//   SUBMIT <payout> <token> <cents>     → PAID <txn> | DUPLICATE <txn> | FENCED <highest>
//   STATUS <payout> <token>             → PAID <txn> | UNPAID | FENCED <highest>
//   STATS                               → STATS submits=<n> paid=<n> duplicate_attempted=<n>
//                                               fenced_out=<n> status_queries=<n>
//   anything else                       → ERROR <reason>
//
// A SUBMIT that is answered PAID has moved money: it cannot be undone. The rail's fence admits a
// token per payout only if it is not lower than the highest it has seen (STATUS admits too, so
// that once a later worker has asked, an earlier holder's late submit is refused). A SUBMIT for
// a payout already paid is never paid again: it is answered DUPLICATE and counted in
// rail_duplicate_attempted_total, a counter whose healthy value is zero.
#ifndef FENCELOCK_PAYOUT_DEMO_RAIL_H_
#define FENCELOCK_PAYOUT_DEMO_RAIL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct sqlite3;

namespace fencelock::payout {

struct RailRequest {
  enum class Kind { kHello, kSubmit, kStatus, kStats };
  Kind kind = Kind::kHello;
  std::string payout;
  uint64_t token = 0;
  int64_t amount_cents = 0;
};

struct RailReply {
  enum class Kind { kHello, kPaid, kDuplicate, kFenced, kUnpaid, kStats, kError };
  Kind kind = Kind::kError;
  int64_t txn = 0;         // kPaid, kDuplicate: the payment's transaction id
  uint64_t highest = 0;    // kFenced: the highest token the rail has admitted for the payout
  int64_t read_timeout_ms = 0;  // kHello
  std::map<std::string, int64_t> stats;  // kStats
  std::string error;       // kError
};

// Parse errors are kInvalidArgument naming what was wrong.
absl::StatusOr<RailRequest> ParseRailRequest(const std::string& line);
std::string FormatRailRequest(const RailRequest& request);
absl::StatusOr<RailReply> ParseRailReply(const std::string& line);
std::string FormatRailReply(const RailReply& reply);

inline constexpr size_t kMaxRailLine = 512;

struct RailStats {
  int64_t submits = 0;
  int64_t paid = 0;
  int64_t duplicate_attempted = 0;  // must be zero
  int64_t fenced_out = 0;
  int64_t status_queries = 0;
};

// The rail's ledger: payments (txn, payout, token, amount), every attempt with its outcome,
// and the rail's fence, in one SQLite database with synchronous=FULL. Each request is one
// transaction. Not thread-safe: the rail serves requests one at a time.
class RailLedger {
 public:
  static absl::StatusOr<std::unique_ptr<RailLedger>> Open(const std::string& path);
  ~RailLedger();

  // The irreversible step. Returns kPaid (now paid), kDuplicate (already paid: nothing moved),
  // or kFenced (a higher token was admitted for this payout: nothing moved).
  absl::StatusOr<RailReply> Submit(const std::string& payout, uint64_t token, int64_t amount_cents);
  // Whether the payout was paid; admits `token` first (kFenced if lower than the highest).
  absl::StatusOr<RailReply> Status(const std::string& payout, uint64_t token);
  absl::StatusOr<RailStats> Stats();
  // How many payments the ledger holds for each payout (reconciliation reads this).
  absl::StatusOr<std::map<std::string, int64_t>> PaymentsPerPayout();

 private:
  explicit RailLedger(sqlite3* db) : db_(db) {}
  absl::Status RecordAttempt(const std::string& payout, uint64_t token, const char* outcome);
  sqlite3* db_;
};

// A worker's connection to the rail. Every exchange waits at most the rail's read timeout
// (learned from HELLO); a timed-out exchange closes the connection, and its outcome is unknown
// (the submit may have been paid). Not thread-safe.
class RailClient {
 public:
  // Connects to "host:port" and says HELLO, waiting at most `connect_timeout`.
  static absl::StatusOr<std::unique_ptr<RailClient>> Connect(const std::string& address,
                                                             absl::Duration connect_timeout);
  ~RailClient();

  absl::Duration read_timeout() const { return read_timeout_; }
  // kDeadlineExceeded after the read timeout, kUnavailable when the connection fails; either
  // way the request may or may not have been applied. Reconnects on the next call.
  absl::StatusOr<RailReply> Call(const RailRequest& request);

 private:
  struct Impl;
  explicit RailClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  absl::Duration read_timeout_;
};

}  // namespace fencelock::payout

#endif  // FENCELOCK_PAYOUT_DEMO_RAIL_H_
