#include "payout-demo/store.h"

#include "absl/strings/str_cat.h"
#include "fence/fence.h"
#include "sqlite_util.h"

namespace fencelock::payout {
namespace {

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS payouts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  amount_cents INTEGER NOT NULL CHECK (amount_cents > 0),
  state TEXT NOT NULL CHECK (state IN ('PENDING', 'CLAIMED', 'SUBMITTED', 'PAID')),
  token INTEGER NOT NULL DEFAULT 0,
  worker TEXT NOT NULL DEFAULT '',
  rail_txn INTEGER NOT NULL DEFAULT 0,
  claims INTEGER NOT NULL DEFAULT 0,
  created_unix_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS payouts_by_state ON payouts (state, id);
CREATE TABLE IF NOT EXISTS abandons (
  seq INTEGER PRIMARY KEY,
  payout INTEGER NOT NULL,
  token INTEGER NOT NULL,
  worker TEXT NOT NULL,
  reason TEXT NOT NULL,
  at_unix_ms INTEGER NOT NULL);
)sql";

constexpr const char* kStateNames[] = {"PENDING", "CLAIMED", "SUBMITTED", "PAID"};

PayoutState ParseState(const std::string& name) {
  for (int i = 0; i < 4; ++i) {
    if (name == kStateNames[i]) return static_cast<PayoutState>(i);
  }
  return PayoutState::kPending;  // unreachable: the CHECK constraint admits only these
}

// The backlog gauge is operational, not a safety input, so wall-clock time is fine here.
int64_t NowUnixMs() { return absl::ToUnixMillis(absl::Now()); }

constexpr char kSelect[] =
    "SELECT id, amount_cents, state, token, worker, rail_txn, claims FROM payouts";

Payout Row(const sql::Stmt& q) {
  return Payout{.id = q.Int(0),
                .amount_cents = q.Int(1),
                .state = ParseState(q.Text(2)),
                .token = static_cast<uint64_t>(q.Int(3)),
                .worker = q.Text(4),
                .rail_txn = q.Int(5),
                .claims = static_cast<int>(q.Int(6))};
}

absl::Status SetState(sqlite3* db, int64_t id, PayoutState state) {
  return sql::Stmt(db, "UPDATE payouts SET state = ?1 WHERE id = ?2")
      .Bind(1, kStateNames[static_cast<int>(state)])
      .Bind(2, id)
      .Run();
}

}  // namespace

const char* PayoutStateName(PayoutState state) { return kStateNames[static_cast<int>(state)]; }

std::string PayoutKey(int64_t id) { return absl::StrCat("payout/", id); }

absl::StatusOr<std::unique_ptr<PayoutStore>> PayoutStore::Open(const std::string& path) {
  auto db = sql::OpenFenced(path, kSchema);
  if (!db.ok()) return db.status();
  return std::unique_ptr<PayoutStore>(new PayoutStore(*db));
}

PayoutStore::~PayoutStore() { sqlite3_close(db_); }

absl::StatusOr<int64_t> PayoutStore::Load(int64_t count, int64_t amount_cents) {
  if (count <= 0 || amount_cents <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load ", count, " payouts of ",
                                                   amount_cents, " cents: both must be > 0"));
  }
  int64_t first = 0;
  absl::Status s = sql::Transaction(db_, [&]() -> absl::Status {
    const int64_t now = NowUnixMs();
    for (int64_t i = 0; i < count; ++i) {
      sql::Stmt insert(db_,
                       "INSERT INTO payouts (amount_cents, state, created_unix_ms) "
                       "VALUES (?1, 'PENDING', ?2)");
      if (absl::Status s = insert.Bind(1, amount_cents).Bind(2, now).Run(); !s.ok()) return s;
      if (i == 0) first = sqlite3_last_insert_rowid(db_);
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return first;
}

absl::StatusOr<Payout> PayoutStore::Get(int64_t id) {
  sql::Stmt q(db_, absl::StrCat(kSelect, " WHERE id = ?1").c_str());
  auto row = q.Bind(1, id).Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("no payout ", id));
  return Row(q);
}

absl::StatusOr<Payout> PayoutStore::Fenced(int64_t id, uint64_t token, bool claim_must_match) {
  auto p = Get(id);
  if (!p.ok()) return p.status();
  if (absl::Status s = fence::AdmitInTransaction(db_, PayoutKey(id), token); !s.ok()) return s;
  if (claim_must_match && p->token != token) {
    return absl::AbortedError(absl::StrCat("payout ", id, " is claimed under token ", p->token,
                                           ", not ", token));
  }
  return p;
}

absl::StatusOr<Payout> PayoutStore::Claim(int64_t id, uint64_t token, const std::string& worker) {
  Payout before;
  absl::Status s = sql::Transaction(db_, [&]() -> absl::Status {
    auto p = Fenced(id, token, /*claim_must_match=*/false);
    if (!p.ok()) return p.status();
    before = *p;
    if (p->state == PayoutState::kPaid) return absl::OkStatus();
    const PayoutState next =
        p->state == PayoutState::kSubmitted ? PayoutState::kSubmitted : PayoutState::kClaimed;
    return sql::Stmt(db_,
                     "UPDATE payouts SET state = ?1, token = ?2, worker = ?3, claims = claims + 1 "
                     "WHERE id = ?4")
        .Bind(1, PayoutStateName(next))
        .Bind(2, static_cast<int64_t>(token))
        .Bind(3, worker)
        .Bind(4, id)
        .Run();
  });
  if (!s.ok()) return s;
  return before;
}

absl::Status PayoutStore::MarkSubmitted(int64_t id, uint64_t token) {
  return sql::Transaction(db_, [&]() -> absl::Status {
    auto p = Fenced(id, token, /*claim_must_match=*/true);
    if (!p.ok()) return p.status();
    if (p->state == PayoutState::kSubmitted) return absl::OkStatus();
    if (p->state != PayoutState::kClaimed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "payout ", id, " is ", PayoutStateName(p->state), ", not CLAIMED: cannot submit it"));
    }
    return SetState(db_, id, PayoutState::kSubmitted);
  });
}

absl::Status PayoutStore::MarkPaid(int64_t id, uint64_t token, int64_t rail_txn) {
  return sql::Transaction(db_, [&]() -> absl::Status {
    auto p = Fenced(id, token, /*claim_must_match=*/true);
    if (!p.ok()) return p.status();
    if (p->state == PayoutState::kPaid) {
      if (p->rail_txn == rail_txn) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(
          "payout ", id, " is already PAID by rail transaction ", p->rail_txn, ", not ", rail_txn));
    }
    if (p->state != PayoutState::kSubmitted) {
      return absl::FailedPreconditionError(absl::StrCat(
          "payout ", id, " is ", PayoutStateName(p->state), ", not SUBMITTED: cannot mark it paid"));
    }
    return sql::Stmt(db_, "UPDATE payouts SET state = 'PAID', rail_txn = ?1, worker = '' WHERE id = ?2")
        .Bind(1, rail_txn)
        .Bind(2, id)
        .Run();
  });
}

absl::Status PayoutStore::Abandon(int64_t id, uint64_t token, const std::string& worker,
                                  const std::string& reason) {
  absl::Status s = sql::Transaction(db_, [&]() -> absl::Status {
    auto p = Fenced(id, token, /*claim_must_match=*/true);
    if (!p.ok()) return p.status();
    if (p->state == PayoutState::kPaid) return absl::OkStatus();
    // A SUBMITTED payout keeps its state: the rail may have its submit.
    return sql::Stmt(db_,
                     "UPDATE payouts SET state = CASE state WHEN 'CLAIMED' THEN 'PENDING' "
                     "ELSE state END, worker = '' WHERE id = ?1")
        .Bind(1, id)
        .Run();
  });
  absl::Status recorded = RecordAbandon(id, token, worker, reason);
  return s.ok() ? recorded : s;
}

absl::Status PayoutStore::RecordAbandon(int64_t id, uint64_t token, const std::string& worker,
                                        const std::string& reason) {
  return sql::Stmt(db_,
                   "INSERT INTO abandons (payout, token, worker, reason, at_unix_ms) "
                   "VALUES (?1, ?2, ?3, ?4, ?5)")
      .Bind(1, id)
      .Bind(2, static_cast<int64_t>(token))
      .Bind(3, worker)
      .Bind(4, reason)
      .Bind(5, NowUnixMs())
      .Run();
}

absl::StatusOr<std::vector<int64_t>> PayoutStore::Unpaid(int64_t limit) {
  sql::Stmt q(db_, "SELECT id FROM payouts WHERE state != 'PAID' ORDER BY id LIMIT ?1");
  q.Bind(1, limit);
  std::vector<int64_t> ids;
  for (;;) {
    auto row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) return ids;
    ids.push_back(q.Int(0));
  }
}

absl::StatusOr<std::optional<Payout>> PayoutStore::HeldBy(const std::string& worker) {
  sql::Stmt q(db_, absl::StrCat(kSelect,
                                " WHERE worker = ?1 AND state IN ('CLAIMED', 'SUBMITTED') LIMIT 1")
                       .c_str());
  auto row = q.Bind(1, worker).Step();
  if (!row.ok()) return row.status();
  if (!*row) return std::optional<Payout>();
  return std::optional<Payout>(Row(q));
}

absl::StatusOr<absl::Duration> PayoutStore::OldestUnpaidAge() {
  sql::Stmt q(db_, "SELECT MIN(created_unix_ms) FROM payouts WHERE state != 'PAID'");
  auto row = q.Step();
  if (!row.ok()) return row.status();
  if (q.Text(0).empty()) return absl::ZeroDuration();  // MIN() of no rows is NULL
  return std::max(absl::ZeroDuration(), absl::Milliseconds(NowUnixMs() - q.Int(0)));
}

absl::StatusOr<StoreSummary> PayoutStore::Summary() {
  StoreSummary summary;
  {
    sql::Stmt q(db_, "SELECT state, COUNT(*), SUM(claims) FROM payouts GROUP BY state");
    for (;;) {
      auto row = q.Step();
      if (!row.ok()) return row.status();
      if (!*row) break;
      summary.by_state[ParseState(q.Text(0))] = q.Int(1);
      summary.total += q.Int(1);
      summary.claims += q.Int(2);
    }
  }
  sql::Stmt q(db_, "SELECT reason, COUNT(*) FROM abandons GROUP BY reason");
  for (;;) {
    auto row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    summary.abandoned[q.Text(0)] = q.Int(1);
  }
  return summary;
}

}  // namespace fencelock::payout
