#include "fence/fence.h"

#include <sqlite3.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace fencelock::fence {
namespace {

absl::Status FencedOut(absl::string_view key, uint64_t token, uint64_t highest) {
  return absl::AbortedError(absl::StrCat("fenced out: token ", token, " for \"", key,
                                         "\" is lower than the highest admitted, ", highest));
}

absl::Status SqliteError(sqlite3* db, const char* what) {
  const int code = sqlite3_extended_errcode(db);
  std::string message = absl::StrCat(what, ": ", sqlite3_errmsg(db));
  if ((code & 0xff) == SQLITE_BUSY || (code & 0xff) == SQLITE_LOCKED) {
    return absl::UnavailableError(message);
  }
  if ((code & 0xff) == SQLITE_FULL || (code & 0xff) == SQLITE_IOERR) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

class MemoryFence final : public TokenFence {
 public:
  absl::Status Admit(std::string_view key, uint64_t token) override {
    absl::MutexLock lock(&mu_);
    uint64_t& highest = highest_[std::string(key)];
    if (token < highest) return FencedOut(absl::string_view(key.data(), key.size()), token, highest);
    highest = token;
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Highest(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    auto it = highest_.find(std::string(key));
    return it == highest_.end() ? 0 : it->second;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint64_t> highest_ ABSL_GUARDED_BY(mu_);
};

// Runs `sql` with no result rows.
absl::Status Exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat(sql, ": ", error ? error : "?"));
    sqlite3_free(error);
    return s;
  }
  return absl::OkStatus();
}

class SqliteFence final : public TokenFence {
 public:
  explicit SqliteFence(sqlite3* db) : db_(db) {}
  ~SqliteFence() override { sqlite3_close(db_); }

  absl::Status Admit(std::string_view key, uint64_t token) override {
    absl::MutexLock lock(&mu_);
    if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
      return SqliteError(db_, "begin");
    }
    absl::Status s = AdmitInTransaction(db_, key, token);
    if (!s.ok()) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return s;
    }
    if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
      absl::Status err = SqliteError(db_, "commit");
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return err;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Highest(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    return HighestInTransaction(db_, key);
  }

 private:
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);  // one connection, used by one caller at a time
};

}  // namespace

std::unique_ptr<TokenFence> TokenFence::InMemory() { return std::make_unique<MemoryFence>(); }

absl::StatusOr<std::unique_ptr<TokenFence>> TokenFence::OpenSqlite(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("cannot open fence database ", path, ": ", db ? sqlite3_errmsg(db) : "?"));
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, 10'000);
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
    if (absl::Status s = Exec(db, sql); !s.ok()) {
      sqlite3_close(db);
      return s;
    }
  }
  if (absl::Status s = CreateFenceTable(db); !s.ok()) {
    sqlite3_close(db);
    return s;
  }
  return std::unique_ptr<TokenFence>(std::make_unique<SqliteFence>(db));
}

absl::Status CreateFenceTable(sqlite3* db) {
  return Exec(db,
              "CREATE TABLE IF NOT EXISTS fence (key TEXT PRIMARY KEY, highest INTEGER NOT NULL)");
}

absl::StatusOr<uint64_t> HighestInTransaction(sqlite3* db, std::string_view key) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT highest FROM fence WHERE key = ?1", -1, &stmt, nullptr) !=
      SQLITE_OK) {
    return SqliteError(db, "prepare");
  }
  sqlite3_bind_text(stmt, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
  uint64_t highest = 0;
  const int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) highest = static_cast<uint64_t>(sqlite3_column_int64(stmt, 0));
  sqlite3_finalize(stmt);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return SqliteError(db, "select");
  return highest;
}

absl::Status AdmitInTransaction(sqlite3* db, std::string_view key, uint64_t token) {
  auto highest = HighestInTransaction(db, key);
  if (!highest.ok()) return highest.status();
  if (token < *highest) return FencedOut(absl::string_view(key.data(), key.size()), token, *highest);
  if (token == *highest) return absl::OkStatus();
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO fence (key, highest) VALUES (?1, ?2) "
                         "ON CONFLICT(key) DO UPDATE SET highest = excluded.highest",
                         -1, &stmt, nullptr) != SQLITE_OK) {
    return SqliteError(db, "prepare");
  }
  sqlite3_bind_text(stmt, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 2, static_cast<sqlite3_int64>(token));
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return SqliteError(db, "upsert");
  return absl::OkStatus();
}

}  // namespace fencelock::fence
