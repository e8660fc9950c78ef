// Fence 2: the resource-side fence. A durable register of the highest fencing token seen per
// resource key, with one atomic admit(key, token): a token not lower than the highest is
// admitted (the same holder may repeat), a lower one is fenced out. Safety of the resource
// never depends on the lock client being right about time: a stale holder that wakes up and
// acts is stopped here.
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

struct sqlite3;

namespace fencelock::fence {

class TokenFence {
 public:
  virtual ~TokenFence() = default;

  // Admits `token` for `key` if it is not lower than the highest token admitted for `key` so
  // far, and records it as the new highest (durably, for the SQLite fence) before returning OK.
  // Returns kAborted ("fenced out", naming both tokens) for a lower token, and kUnavailable or
  // kInternal if the record could not be made durable; a refused or failed admit changes
  // nothing.
  virtual absl::Status Admit(std::string_view key, uint64_t token) = 0;

  // The highest token admitted for `key`; 0 if none.
  virtual absl::StatusOr<uint64_t> Highest(std::string_view key) = 0;

  // A fence in memory, for tests.
  static std::unique_ptr<TokenFence> InMemory();

  // A fence in the SQLite database at `path` (created if missing), synchronous=FULL: an
  // admitted token survives a crash of the process or the machine.
  static absl::StatusOr<std::unique_ptr<TokenFence>> OpenSqlite(const std::string& path);
};

// For a resource that keeps its own SQLite database: the same fence rule applied inside a
// transaction the caller has already begun on `db`, so that the admit and the resource's own
// change commit together or not at all. The table is created by CreateFenceTable().
absl::Status CreateFenceTable(sqlite3* db);
absl::Status AdmitInTransaction(sqlite3* db, std::string_view key, uint64_t token);
absl::StatusOr<uint64_t> HighestInTransaction(sqlite3* db, std::string_view key);

}  // namespace fencelock::fence

#endif  // FENCELOCK_FENCE_FENCE_H_
