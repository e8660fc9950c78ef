#include "fence/fence.h"

#include <sqlite3.h>

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace fencelock::fence {
namespace {

absl::Status FencedOut(std::string_view key, uint64_t token, uint64_t highest,
                       const char* admitted = "admitted") {
  return absl::AbortedError(absl::StrCat("fenced out: token ", token, " for \"",
                                         absl::string_view(key.data(), key.size()),
                                         "\" is lower than the highest ", admitted, ", ",
                                         highest));
}

// Both registers of one key.
struct Registers {
  uint64_t any = 0;    // the highest token admitted for any operation
  uint64_t write = 0;  // the highest admitted for a write
};

// The rules, on a key's registers: whether `token` is admitted for a write (or a read), and the
// registers after it.
absl::Status AdmitWrite(std::string_view key, uint64_t token, Registers& r) {
  if (token < r.any) return FencedOut(key, token, r.any);
  r.any = r.write = token;
  return absl::OkStatus();
}
absl::Status AdmitReadOf(std::string_view key, uint64_t token, Registers& r) {
  if (token < r.write) return FencedOut(key, token, r.write, "admitted for a write");
  r.any = std::max(r.any, token);
  return absl::OkStatus();
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
    return AdmitWith(key, token, AdmitWrite);
  }
  absl::Status AdmitRead(std::string_view key, uint64_t token) override {
    return AdmitWith(key, token, AdmitReadOf);
  }
  absl::StatusOr<uint64_t> Highest(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    auto it = registers_.find(std::string(key));
    return it == registers_.end() ? 0 : it->second.any;
  }
  absl::StatusOr<uint64_t> HighestWrite(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    auto it = registers_.find(std::string(key));
    return it == registers_.end() ? 0 : it->second.write;
  }

 private:
  // A refused admit changes nothing.
  absl::Status AdmitWith(std::string_view key, uint64_t token,
                         absl::Status (*rule)(std::string_view, uint64_t, Registers&)) {
    absl::MutexLock lock(&mu_);
    Registers r = registers_[std::string(key)];
    absl::Status s = rule(key, token, r);
    if (s.ok()) registers_[std::string(key)] = r;
    return s;
  }

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Registers> registers_ ABSL_GUARDED_BY(mu_);
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
    return InTransaction(key, token, AdmitInTransaction);
  }
  absl::Status AdmitRead(std::string_view key, uint64_t token) override {
    return InTransaction(key, token, AdmitReadInTransaction);
  }

  absl::StatusOr<uint64_t> Highest(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    return HighestInTransaction(db_, key);
  }
  absl::StatusOr<uint64_t> HighestWrite(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    return HighestWriteInTransaction(db_, key);
  }

 private:
  absl::Status InTransaction(std::string_view key, uint64_t token,
                             absl::Status (*admit)(sqlite3*, std::string_view, uint64_t)) {
    absl::MutexLock lock(&mu_);
    if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
      return SqliteError(db_, "begin");
    }
    absl::Status s = admit(db_, key, token);
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

// The table has a column for each register. A table made before the write register existed
// gets it, empty: an empty write register reads as the highest of any operation, since every
// token admitted then was admitted for a write.
absl::Status CreateFenceTable(sqlite3* db) {
  if (absl::Status s = Exec(db,
                            "CREATE TABLE IF NOT EXISTS fence (key TEXT PRIMARY KEY, highest "
                            "INTEGER NOT NULL, highest_write INTEGER)");
      !s.ok()) {
    return s;
  }
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT 1 FROM pragma_table_info('fence') WHERE name = "
                             "'highest_write'", -1, &stmt, nullptr) != SQLITE_OK) {
    return SqliteError(db, "prepare");
  }
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc == SQLITE_ROW) return absl::OkStatus();
  if (rc != SQLITE_DONE) return SqliteError(db, "table_info");
  return Exec(db, "ALTER TABLE fence ADD COLUMN highest_write INTEGER");
}

namespace {

absl::StatusOr<Registers> ReadRegisters(sqlite3* db, std::string_view key) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT highest, COALESCE(highest_write, highest) FROM fence "
                             "WHERE key = ?1", -1, &stmt, nullptr) != SQLITE_OK) {
    return SqliteError(db, "prepare");
  }
  sqlite3_bind_text(stmt, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
  Registers r;
  const int rc = sqlite3_step(stmt);
  if (rc == SQLITE_ROW) {
    r.any = static_cast<uint64_t>(sqlite3_column_int64(stmt, 0));
    r.write = static_cast<uint64_t>(sqlite3_column_int64(stmt, 1));
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return SqliteError(db, "select");
  return r;
}

absl::Status WriteRegisters(sqlite3* db, std::string_view key, const Registers& r) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO fence (key, highest, highest_write) VALUES (?1, ?2, ?3) "
                         "ON CONFLICT(key) DO UPDATE SET highest = excluded.highest, "
                         "highest_write = excluded.highest_write",
                         -1, &stmt, nullptr) != SQLITE_OK) {
    return SqliteError(db, "prepare");
  }
  sqlite3_bind_text(stmt, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 2, static_cast<sqlite3_int64>(r.any));
  sqlite3_bind_int64(stmt, 3, static_cast<sqlite3_int64>(r.write));
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return SqliteError(db, "upsert");
  return absl::OkStatus();
}

absl::Status AdmitWith(sqlite3* db, std::string_view key, uint64_t token,
                       absl::Status (*rule)(std::string_view, uint64_t, Registers&)) {
  auto registers = ReadRegisters(db, key);
  if (!registers.ok()) return registers.status();
  Registers after = *registers;
  if (absl::Status s = rule(key, token, after); !s.ok()) return s;
  if (after.any == registers->any && after.write == registers->write) return absl::OkStatus();
  return WriteRegisters(db, key, after);
}

}  // namespace

absl::StatusOr<uint64_t> HighestInTransaction(sqlite3* db, std::string_view key) {
  auto r = ReadRegisters(db, key);
  if (!r.ok()) return r.status();
  return r->any;
}

absl::StatusOr<uint64_t> HighestWriteInTransaction(sqlite3* db, std::string_view key) {
  auto r = ReadRegisters(db, key);
  if (!r.ok()) return r.status();
  return r->write;
}

absl::Status AdmitInTransaction(sqlite3* db, std::string_view key, uint64_t token) {
  return AdmitWith(db, key, token, AdmitWrite);
}

absl::Status AdmitReadInTransaction(sqlite3* db, std::string_view key, uint64_t token) {
  return AdmitWith(db, key, token, AdmitReadOf);
}

}  // namespace fencelock::fence
