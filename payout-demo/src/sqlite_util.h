// A small RAII layer over the SQLite C API for the payout store and the rail ledger.
#ifndef FENCELOCK_PAYOUT_DEMO_SQLITE_UTIL_H_
#define FENCELOCK_PAYOUT_DEMO_SQLITE_UTIL_H_

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fencelock::payout::sql {

// A status for SQLite's latest error on `db`: kUnavailable for busy, locked, full and I/O
// errors (retryable or environmental), kInternal otherwise.
absl::Status Error(sqlite3* db, std::string_view what);

// Opens `path` (creating it unless `read_only`) with WAL, synchronous=FULL and a 10 s busy
// timeout, then runs `schema` (any number of statements).
absl::StatusOr<sqlite3*> Open(const std::string& path, const char* schema, bool read_only = false);

// Open() for a resource that fences on tokens: also creates fence 2's table (fence/fence.h).
absl::StatusOr<sqlite3*> OpenFenced(const std::string& path, const char* schema);

// Runs statements with no result rows.
absl::Status Exec(sqlite3* db, const char* sql);

// One prepared statement. Bind with 1-based indexes; Step() returns true for a row.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql);
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, std::string_view v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // A row (true), done (false), or an error.
  absl::StatusOr<bool> Step();
  // Steps a statement that returns no rows.
  absl::Status Run();
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) const {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t != nullptr ? reinterpret_cast<const char*>(t) : "";
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  absl::Status prepare_status_;
};

// BEGIN IMMEDIATE; `body()`; COMMIT if it returned OK, else ROLLBACK (and its status).
template <typename Body>
absl::Status Transaction(sqlite3* db, Body body) {
  if (absl::Status s = Exec(db, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status s = body();
  if (s.ok()) s = Exec(db, "COMMIT");
  if (!s.ok()) Exec(db, "ROLLBACK").IgnoreError();
  return s;
}

}  // namespace fencelock::payout::sql

#endif  // FENCELOCK_PAYOUT_DEMO_SQLITE_UTIL_H_
