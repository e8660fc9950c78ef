#include "payout-demo/rail.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fence/fence.h"
#include "sqlite_util.h"

namespace fencelock::payout {
namespace {

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS payments (
  txn INTEGER PRIMARY KEY AUTOINCREMENT,
  payout TEXT NOT NULL,
  token INTEGER NOT NULL,
  amount_cents INTEGER NOT NULL,
  at_unix_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS payments_by_payout ON payments (payout);
CREATE TABLE IF NOT EXISTS attempts (
  seq INTEGER PRIMARY KEY,
  payout TEXT NOT NULL,
  token INTEGER NOT NULL,
  outcome TEXT NOT NULL,
  at_unix_ms INTEGER NOT NULL);
)sql";

absl::Status Invalid(const std::string& line, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad rail line \"", line, "\": ", why));
}

bool ValidPayout(absl::string_view p) {
  if (p.empty() || p.size() > 128) return false;
  for (char c : p) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<RailRequest> ParseRailRequest(const std::string& line) {
  if (line.size() > kMaxRailLine) return Invalid(line.substr(0, 32) + "...", "longer than 512 bytes");
  std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (f.empty()) return Invalid(line, "empty");
  RailRequest r;
  auto want = [&](size_t n) -> absl::Status {
    if (f.size() != n) return Invalid(line, absl::StrCat(f[0], " takes ", n - 1, " arguments"));
    return absl::OkStatus();
  };
  if (f[0] == "HELLO" || f[0] == "STATS") {
    if (absl::Status s = want(1); !s.ok()) return s;
    r.kind = f[0] == "HELLO" ? RailRequest::Kind::kHello : RailRequest::Kind::kStats;
    return r;
  }
  if (f[0] != "SUBMIT" && f[0] != "STATUS") return Invalid(line, "unknown command");
  const bool submit = f[0] == "SUBMIT";
  if (absl::Status s = want(submit ? 4 : 3); !s.ok()) return s;
  r.kind = submit ? RailRequest::Kind::kSubmit : RailRequest::Kind::kStatus;
  if (!ValidPayout(f[1])) return Invalid(line, "payout must be 1 to 128 printable characters");
  r.payout = std::string(f[1]);
  if (!absl::SimpleAtoi(f[2], &r.token) || r.token == 0) {
    return Invalid(line, "token must be a positive integer");
  }
  if (submit && (!absl::SimpleAtoi(f[3], &r.amount_cents) || r.amount_cents <= 0)) {
    return Invalid(line, "amount must be a positive number of cents");
  }
  return r;
}

std::string FormatRailRequest(const RailRequest& r) {
  switch (r.kind) {
    case RailRequest::Kind::kHello:
      return "HELLO";
    case RailRequest::Kind::kStats:
      return "STATS";
    case RailRequest::Kind::kSubmit:
      return absl::StrCat("SUBMIT ", r.payout, " ", r.token, " ", r.amount_cents);
    case RailRequest::Kind::kStatus:
      return absl::StrCat("STATUS ", r.payout, " ", r.token);
  }
  return "";
}

absl::StatusOr<RailReply> ParseRailReply(const std::string& line) {
  std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  RailReply r;
  if (f.empty()) return Invalid(line, "empty reply");
  auto number = [&](size_t i, auto* out) {
    return f.size() == i + 1 && absl::SimpleAtoi(f[i], out);
  };
  if (f[0] == "ERROR") {
    r.kind = RailReply::Kind::kError;
    r.error = line.size() > 6 ? line.substr(6) : "";
    return r;
  }
  if (f[0] == "UNPAID" && f.size() == 1) {
    r.kind = RailReply::Kind::kUnpaid;
    return r;
  }
  if ((f[0] == "PAID" || f[0] == "DUPLICATE") && number(1, &r.txn)) {
    r.kind = f[0] == "PAID" ? RailReply::Kind::kPaid : RailReply::Kind::kDuplicate;
    return r;
  }
  if (f[0] == "FENCED" && number(1, &r.highest)) {
    r.kind = RailReply::Kind::kFenced;
    return r;
  }
  if (f[0] == "HELLO" && f.size() == 2 && absl::ConsumePrefix(&f[1], "read_timeout_ms=") &&
      absl::SimpleAtoi(f[1], &r.read_timeout_ms) && r.read_timeout_ms > 0) {
    r.kind = RailReply::Kind::kHello;
    return r;
  }
  if (f[0] == "STATS") {
    r.kind = RailReply::Kind::kStats;
    for (size_t i = 1; i < f.size(); ++i) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(f[i], '=');
      int64_t v = 0;
      if (!absl::SimpleAtoi(kv.second, &v)) return Invalid(line, "bad STATS field");
      r.stats[std::string(kv.first)] = v;
    }
    return r;
  }
  return Invalid(line, "unknown reply");
}

std::string FormatRailReply(const RailReply& r) {
  switch (r.kind) {
    case RailReply::Kind::kHello:
      return absl::StrCat("HELLO read_timeout_ms=", r.read_timeout_ms);
    case RailReply::Kind::kPaid:
      return absl::StrCat("PAID ", r.txn);
    case RailReply::Kind::kDuplicate:
      return absl::StrCat("DUPLICATE ", r.txn);
    case RailReply::Kind::kFenced:
      return absl::StrCat("FENCED ", r.highest);
    case RailReply::Kind::kUnpaid:
      return "UNPAID";
    case RailReply::Kind::kStats: {
      std::string out = "STATS";
      for (const auto& [k, v] : r.stats) absl::StrAppend(&out, " ", k, "=", v);
      return out;
    }
    case RailReply::Kind::kError:
      return absl::StrCat("ERROR ", r.error);
  }
  return "ERROR unknown reply";
}

absl::StatusOr<std::unique_ptr<RailLedger>> RailLedger::Open(const std::string& path) {
  auto db = sql::OpenFenced(path, kSchema);
  if (!db.ok()) return db.status();
  return std::unique_ptr<RailLedger>(new RailLedger(*db));
}

RailLedger::~RailLedger() { sqlite3_close(db_); }

absl::Status RailLedger::RecordAttempt(const std::string& payout, uint64_t token,
                                       const char* outcome) {
  return sql::Stmt(db_,
                   "INSERT INTO attempts (payout, token, outcome, at_unix_ms) "
                   "VALUES (?1, ?2, ?3, ?4)")
      .Bind(1, payout)
      .Bind(2, static_cast<int64_t>(token))
      .Bind(3, outcome)
      .Bind(4, absl::ToUnixMillis(absl::Now()))
      .Run();
}

namespace {

// The payment for `payout`, if any (the first, should a broken rail ever hold two).
absl::StatusOr<int64_t> PaymentTxn(sqlite3* db, const std::string& payout) {
  sql::Stmt q(db, "SELECT MIN(txn) FROM payments WHERE payout = ?1");
  auto row = q.Bind(1, payout).Step();
  if (!row.ok()) return row.status();
  return q.Text(0).empty() ? 0 : q.Int(0);
}

// Admits `token` at the rail's fence; a refusal becomes a kFenced reply (not an error).
absl::StatusOr<bool> AdmitOrFence(sqlite3* db, const std::string& payout, uint64_t token,
                                  RailReply* reply) {
  absl::Status s = fence::AdmitInTransaction(db, payout, token);
  if (s.ok()) return true;
  if (s.code() != absl::StatusCode::kAborted) return s;
  auto highest = fence::HighestInTransaction(db, payout);
  if (!highest.ok()) return highest.status();
  reply->kind = RailReply::Kind::kFenced;
  reply->highest = *highest;
  return false;
}

}  // namespace

absl::StatusOr<RailReply> RailLedger::Submit(const std::string& payout, uint64_t token,
                                             int64_t amount_cents) {
  RailReply reply;
  absl::Status s = sql::Transaction(db_, [&]() -> absl::Status {
    auto admitted = AdmitOrFence(db_, payout, token, &reply);
    if (!admitted.ok()) return admitted.status();
    if (!*admitted) return RecordAttempt(payout, token, "fenced");
    auto existing = PaymentTxn(db_, payout);
    if (!existing.ok()) return existing.status();
    if (*existing != 0) {
      reply.kind = RailReply::Kind::kDuplicate;
      reply.txn = *existing;
      return RecordAttempt(payout, token, "duplicate");
    }
    absl::Status paid = sql::Stmt(db_,
                                  "INSERT INTO payments (payout, token, amount_cents, at_unix_ms) "
                                  "VALUES (?1, ?2, ?3, ?4)")
                            .Bind(1, payout)
                            .Bind(2, static_cast<int64_t>(token))
                            .Bind(3, amount_cents)
                            .Bind(4, absl::ToUnixMillis(absl::Now()))
                            .Run();
    if (!paid.ok()) return paid;
    reply.kind = RailReply::Kind::kPaid;
    reply.txn = sqlite3_last_insert_rowid(db_);
    return RecordAttempt(payout, token, "paid");
  });
  if (!s.ok()) return s;
  return reply;
}

absl::StatusOr<RailReply> RailLedger::Status(const std::string& payout, uint64_t token) {
  RailReply reply;
  absl::Status s = sql::Transaction(db_, [&]() -> absl::Status {
    auto admitted = AdmitOrFence(db_, payout, token, &reply);
    if (!admitted.ok()) return admitted.status();
    if (!*admitted) return RecordAttempt(payout, token, "status_fenced");
    auto existing = PaymentTxn(db_, payout);
    if (!existing.ok()) return existing.status();
    reply.kind = *existing != 0 ? RailReply::Kind::kPaid : RailReply::Kind::kUnpaid;
    reply.txn = *existing;
    return RecordAttempt(payout, token, "status");
  });
  if (!s.ok()) return s;
  return reply;
}

absl::StatusOr<RailStats> RailLedger::Stats() {
  RailStats stats;
  sql::Stmt q(db_, "SELECT outcome, COUNT(*) FROM attempts GROUP BY outcome");
  for (;;) {
    auto row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    const std::string outcome = q.Text(0);
    const int64_t n = q.Int(1);
    if (outcome == "paid" || outcome == "duplicate" || outcome == "fenced") stats.submits += n;
    if (outcome == "paid") stats.paid = n;
    if (outcome == "duplicate") stats.duplicate_attempted = n;
    if (outcome == "fenced" || outcome == "status_fenced") stats.fenced_out += n;
    if (outcome == "status" || outcome == "status_fenced") stats.status_queries += n;
  }
  return stats;
}

absl::StatusOr<std::map<std::string, int64_t>> RailLedger::PaymentsPerPayout() {
  std::map<std::string, int64_t> out;
  sql::Stmt q(db_, "SELECT payout, COUNT(*) FROM payments GROUP BY payout");
  for (;;) {
    auto row = q.Step();
    if (!row.ok()) return row.status();
    if (!*row) return out;
    out[q.Text(0)] = q.Int(1);
  }
}

}  // namespace fencelock::payout
