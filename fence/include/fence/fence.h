// Fence 2: the resource-side fence. Durable registers per resource key of the highest fencing
// token admitted for any operation and of the highest admitted for a write, with atomic
// admits (ADR 0006):
//   - a write (Admit) is admitted when its token is not lower than the highest of any
//     operation, and raises both;
//   - a read (AdmitRead), by a holder of a shared lock, is admitted when its token is not lower
//     than the highest write, and raises the highest of any operation.
// So a writer is fenced out once any newer holder has touched the resource, a reader once a
// newer writer has written, and readers that hold together never fence each other out. The
// same holder may repeat. Safety of the resource never depends on the lock client being right
// about time: a stale holder that wakes up and acts is stopped here.
//
// Knows nothing of Asio or protobuf. Thread-safe.
#ifndef FENCELOCK_FENCE_FENCE_H_
#define FENCELOCK_FENCE_FENCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "api/export.h"

struct sqlite3;

namespace fencelock::fence {

class FENCELOCK_API TokenFence {
 public:
  virtual ~TokenFence() = default;

  // Admits `token` for `key` if it is not lower than the highest token admitted for `key` so
  // far, and records it as the new highest (durably, for the SQLite fence) before returning OK.
  // Returns kAborted ("fenced out", naming both tokens) for a lower token, and kUnavailable or
  // kInternal if the record could not be made durable; a refused or failed admit changes
  // nothing.
  virtual absl::Status Admit(std::string_view key, uint64_t token) = 0;
  // A read under a shared lock: admits `token` for `key` if it is not lower than the highest
  // token admitted for a write, and raises the highest of any operation to it. Errors as for
  // Admit.
  virtual absl::Status AdmitRead(std::string_view key, uint64_t token) = 0;

  // The highest token admitted for `key`, for any operation; 0 if none.
  virtual absl::StatusOr<uint64_t> Highest(std::string_view key) = 0;
  // The highest token admitted for `key` for a write; 0 if none.
  virtual absl::StatusOr<uint64_t> HighestWrite(std::string_view key) = 0;

  // A fence in memory, for tests.
  static std::unique_ptr<TokenFence> InMemory();

  // A fence in the SQLite database at `path` (created if missing), synchronous=FULL: an
  // admitted token survives a crash of the process or the machine.
  static absl::StatusOr<std::unique_ptr<TokenFence>> OpenSqlite(const std::string& path);
};

// For a resource that keeps its own SQLite database: the same fence rules applied inside a
// transaction the caller has already begun on `db`, so that the admit and the resource's own
// change commit together or not at all. The table is created by CreateFenceTable(), which also
// adds the write register to a table made before it existed (its keys then read as if every
// token admitted had been a write, which is what they were).
FENCELOCK_API absl::Status CreateFenceTable(sqlite3* db);
FENCELOCK_API absl::Status AdmitInTransaction(sqlite3* db, std::string_view key, uint64_t token);
FENCELOCK_API absl::Status AdmitReadInTransaction(sqlite3* db, std::string_view key, uint64_t token);
FENCELOCK_API absl::StatusOr<uint64_t> HighestInTransaction(sqlite3* db, std::string_view key);
FENCELOCK_API absl::StatusOr<uint64_t> HighestWriteInTransaction(sqlite3* db, std::string_view key);

}  // namespace fencelock::fence

#endif  // FENCELOCK_FENCE_FENCE_H_
