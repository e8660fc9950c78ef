// The embedded default commit log: lockd's state directory (WAL segments + snapshots +
// SEQUENCES, the format in lock-server/storage.h and docs/durability.md), with group commit.
//
// OpenLocalCommitLog() locks the directory (one server per directory, for the life of the log),
// recovers it, takes it over (zeroes a torn tail, durably
// reserves sequence blocks above the recovered floors) and returns the state with a CommitLog
// that appends to it. A batch is committed once it is written and fdatasync'd. Every Flush()
// hands its records to the writer at once; the batches queued while one is being synced are
// written together with one write and one sync, so concurrent mutations share a sync and the
// disk does not wait for the owner's thread between two syncs.
// Sequence reservations and snapshots are queued in order with the batches, so a reservation
// queued before a batch is durable before any token it covers is acknowledged.
#ifndef FENCELOCK_LOCK_SERVER_LOCAL_COMMIT_LOG_H_
#define FENCELOCK_LOCK_SERVER_LOCAL_COMMIT_LOG_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clock/clock.h"
#include "clock/time_source.h"
#include "lock-server/commit_log.h"
#include "lock-server/env.h"

namespace fencelock::server {

struct LocalCommitLogOptions {
  // File system access. Required (Env::Posix() for the real one).
  Env* env = nullptr;
  // The state directory, created by InitDataDir (`lockd init`). Required.
  std::string dir;
  // Size of each preallocated WAL segment; a snapshot follows a move to a new one once the log
  // since the last snapshot is as large as that snapshot. Default: 64 MiB.
  uint64_t segment_bytes = uint64_t{64} << 20;
  // How many tokens (and session ids) one SEQUENCES write reserves ahead. Default: 10000.
  uint64_t reservation_block = 10000;
  // A batch of at most this many records is written and synced on the owner's thread when the
  // writer is idle: a light load then pays one fdatasync and no thread hand-offs. Larger
  // batches go to the writer so that the owner keeps serving while they sync. Default: 4. Zero
  // always uses the writer.
  uint64_t inline_sync_max_records = 4;
  // A snapshot is encoded this many sessions and locks at a time on the owner's thread, each
  // slice posted behind what is already due there (requests in between see no pause longer
  // than a slice), then checksummed and written on a thread of its own once its records are
  // committed, so that the WAL's syncs never wait behind it. Default: 512 (slices of 2,048
  // took about 3 ms at 1,000,000 locks on the benchmark machine).
  size_t snapshot_slice = 512;
  // How often, at most, the log records in COMMITTED the newest lsn it knows committed, so that
  // recovery can refuse a log that ends below it (lost committed records). It is also written
  // when the log is closed cleanly. Default: 1 s.
  absl::Duration committed_mark_interval = absl::Seconds(1);
  // The clock for that interval. Default: empty, the real boot-time clock.
  std::function<MonoTime()> now;
  // Timers on the owner's thread (on the same clock as `now`), so that the mark follows the
  // last commit within committed_mark_interval even when no commit comes after it: a grant
  // acknowledged just before an idle spell is then covered by the mark, and recovery refuses
  // a log that lost it. Default: null, the mark is written only after a commit (at most once
  // an interval) and at a clean stop.
  TimeSource* time = nullptr;
  // Called with the duration of every batch write + fdatasync, on whichever thread did it.
  // Default: none.
  std::function<void(int64_t ns)> on_sync;
  // Who serves the directory, written into its LOCK file so that a second server that is
  // refused can name it ("lockd pid 1234 on host h, tcp 127.0.0.1:7420"). Default: "lockd".
  std::string owner;
  // Where the log reports its fault state (once). Default: standard error, "lockd: " first.
  std::function<void(const std::string&)> log;
  // Runs the writer's disk work, one step per call, in the order given, and each snapshot's
  // write, a step of its own beside them (in order with nothing). Default: empty, a writer
  // thread of the log's own and a thread for each snapshot's write. The simulator passes one
  // that runs each step at a simulated time; it must not run a step after the log is
  // destroyed, and destroying the log then abandons the queued work, as a crash would.
  std::function<void(std::function<void()>)> schedule_writer;
};

// Locks `options.dir`, recovers it as of server time `now` (every restored lease gets its full
// TTL from `now`) and opens it for appending. Errors: kFailedPrecondition naming the holder when
// another server has the directory; recovery's (kNotFound, kDataLoss, kFailedPrecondition,
// naming the file and offset or reason); the disk's. Completions run
// through `post`. With the default writer, destroying the log finishes the queued work first.
absl::StatusOr<OpenedCommitLog> OpenLocalCommitLog(const LocalCommitLogOptions& options,
                                                   MonoTime now, PostToOwner post);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_LOCAL_COMMIT_LOG_H_
