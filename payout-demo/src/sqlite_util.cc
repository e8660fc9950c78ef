#include "sqlite_util.h"

#include "fence/fence.h"

#include "absl/strings/str_cat.h"

namespace fencelock::payout::sql {

absl::Status Error(sqlite3* db, std::string_view what) {
  const int code = sqlite3_extended_errcode(db) & 0xff;
  std::string message = absl::StrCat(absl::string_view(what.data(), what.size()), ": ",
                                     sqlite3_errmsg(db));
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED || code == SQLITE_FULL ||
      code == SQLITE_IOERR || code == SQLITE_CANTOPEN) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status s = Error(db, sql);
    sqlite3_free(error);
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<sqlite3*> Open(const std::string& path, const char* schema, bool read_only) {
  sqlite3* db = nullptr;
  const int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("cannot open ", path, ": ", db != nullptr ? sqlite3_errmsg(db) : "no memory"));
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, 10'000);
  absl::Status s = read_only ? absl::OkStatus()
                             : Exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL");
  if (s.ok() && schema != nullptr && !read_only) s = Exec(db, schema);
  if (!s.ok()) {
    sqlite3_close(db);
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return db;
}

absl::StatusOr<sqlite3*> OpenFenced(const std::string& path, const char* schema) {
  auto db = Open(path, schema);
  if (!db.ok()) return db;
  if (absl::Status s = fence::CreateFenceTable(*db); !s.ok()) {
    sqlite3_close(*db);
    return s;
  }
  return db;
}

Stmt::Stmt(sqlite3* db, const char* sql) : db_(db) {
  if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
    prepare_status_ = Error(db, absl::StrCat("prepare ", sql));
  }
}

absl::StatusOr<bool> Stmt::Step() {
  if (!prepare_status_.ok()) return prepare_status_;
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return Error(db_, sqlite3_sql(stmt_));
}

absl::Status Stmt::Run() {
  auto row = Step();
  if (!row.ok()) return row.status();
  return absl::OkStatus();
}

}  // namespace fencelock::payout::sql
