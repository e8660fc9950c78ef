// Where lockd's records become committed: one interface, chosen at start-up in one place, that
// the core writes through and waits on. The rules never know which implementation is behind it.
//
// The core applies a record to its state machine, then Append()s it here; Flush() asks the log
// to commit everything appended so far as one batch. Every reply is tagged with newest_batch()
// when it is produced and held until committed_batch() reaches it (the reply gate), so nothing
// is acknowledged, and no state is shown, before it is committed. ReserveFor() makes a token and
// a session id durable before any batch queued after it, so a restart never reissues one.
//
// Implementations: the local WAL + snapshot store (OpenLocalCommitLog in
// lock-server/local_commit_log.h, the embedded default) and etcd (OpenEtcdCommitLog in
// lock-server/etcd_commit_log.h).
//
// A failed commit puts the log in a fault state for good: fault() says why, later batches are
// never committed, and the server stops taking mutations until it restarts and recovers.
// Whether this process may serve the log at all, and until when, is not the log's to say: the
// leadership beside it says that (leadership.h).
//
// Thread safety: every method is for the owner's thread (lockd's event loop); the listener is
// called on it too.
#ifndef FENCELOCK_LOCK_SERVER_COMMIT_LOG_H_
#define FENCELOCK_LOCK_SERVER_COMMIT_LOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "lock-server/leadership.h"
#include "lock-server/state_machine.h"

namespace fencelock::server {

// Whether a record goes into the log: renewals only move expiry times, which a restore resets
// anyway (every restored lease gets its full TTL), so they are never logged.
inline bool IsLogged(const Record& r) {
  return !std::holds_alternative<record::SessionRenewed>(r) &&
         !std::holds_alternative<record::LockRenewed>(r) &&
         !std::holds_alternative<record::PoolLeaseRenewed>(r);
}

// What the core learns from its log, on the owner's thread.
class CommitLogListener {
 public:
  virtual ~CommitLogListener() = default;
  // Every batch up to and including `batch` is committed. Never called with a batch below one
  // it was called with before (the simulator checks it).
  virtual void OnCommitted(uint64_t batch) = 0;
  // The log entered its fault state (once).
  virtual void OnCommitFault(const absl::Status& status) = 0;
  // The log asks for a snapshot of the current state (CommitLog::Snapshot).
  virtual void OnSnapshotDue() = 0;
};

struct CommitLogStats {
  uint64_t commits = 0;   // batches committed (for the local log: WAL fdatasyncs)
  uint64_t records = 0;   // records committed
  uint64_t bytes = 0;     // bytes of committed batches
  uint64_t snapshots = 0;
  bool snapshot_in_progress = false;  // local log: one is being read, written or applied
  uint64_t reservations = 0;
  uint64_t segment = 0;   // local log: the current WAL segment
  int64_t last_commit_ns = 0;
  int64_t total_commit_ns = 0;
  // etcd: transactions sent again after etcd failed them (no leader for a moment), and the
  // term: how many times a lockd has taken over the prefix, this one included.
  uint64_t commit_retries = 0;
  uint64_t term = 0;
};

class CommitLog {
 public:
  virtual ~CommitLog() = default;

  // Must be called before anything is appended. `listener` outlives the log.
  virtual void SetListener(CommitLogListener* listener) = 0;

  // Makes sure `token` and `session` are covered by a durable reservation before any batch
  // queued after this call.
  virtual void ReserveFor(FenceToken token, SessionId session) = 0;
  // Adds `record` (already applied to the state machine) to the pending batch. Renewals, which
  // only move expiry times, are not logged.
  virtual void Append(const Record& record) = 0;
  // Starts committing the pending batch unless a commit is already in flight (the pending
  // batch then follows it).
  virtual void Flush() = 0;
  // Called after each request: may start committing the pending batch before Flush(), when no
  // commit is in flight, so that the disk does not sit idle while the owner goes on with
  // requests that arrived together. Never syncs on the owner's thread. The local log does it
  // for a batch too large to sync inline; a log that does nothing here loses nothing.
  virtual void StartIfIdle() {}
  // Commits everything pending, then a snapshot of `state` (which reflects every record
  // appended so far), then drops what the snapshot makes redundant.
  virtual void Snapshot(const StateMachine& state) = 0;

  // The batch the next Append() joins, as of the last Append(); 0 before any.
  virtual uint64_t newest_batch() const = 0;
  // The newest batch known committed; it never goes back.
  virtual uint64_t committed_batch() const = 0;
  // The lsn of the newest record appended.
  virtual uint64_t last_lsn() const = 0;
  // Null while healthy; otherwise the failure that stopped the log.
  virtual const absl::Status* fault() const = 0;
  // Where the records go, for operators: "state directory /var/lib/lockd".
  virtual std::string Describe() const = 0;
  virtual CommitLogStats stats() const = 0;
};

// Runs `task` on the owner's thread (lockd's event loop), after what is already due.
using PostToOwner = std::function<void(std::function<void()>)>;

// The log of a standby replica's core (with StandingBy, leadership.h) while it waits for
// etcd prefix `prefix`: it commits nothing, and its fault says it stands by.
std::unique_ptr<CommitLog> StandbyCommitLog(const std::string& prefix);

// A log opened on recovered state: what the core starts from.
struct OpenedCommitLog {
  StateMachine state;                   // every committed record applied, floors raised
  std::unique_ptr<CommitLog> log;
  // Whether this process serves the log, beside it (leadership.h). It may refer to the log
  // (etcd's does): it is destroyed first, and the two move together. Null: SoleLeadership().
  std::unique_ptr<Leadership> leadership;
  std::vector<std::string> summary;     // what recovery found, one line per fact, for the log
  uint64_t snapshot_lsn = 0;  // the snapshot recovery began from (the local log); else 0
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_COMMIT_LOG_H_
