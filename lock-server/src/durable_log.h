// Group commit of state-machine records to the WAL, plus the other durable writes (sequence
// reservations, snapshots), on one writer thread.
//
// The owner (lockd's I/O thread) appends records as the lock service applies them; Flush()
// hands everything appended so far to the writer as one batch, written with one write and one
// fdatasync. While a batch is being synced, new records pile up for the next one, so concurrent
// mutations share a sync. Every reply the server sends is tagged with newest_batch() at the
// time it was produced and held until durable_batch() reaches it: nothing is acknowledged, and
// no state is shown, before it is on disk.
//
// Jobs run in the order they are queued, so a sequence reservation queued before a batch is on
// disk before any token it covers is acknowledged. The first failed write or sync puts the log
// in a fault state for good: later jobs are refused without touching the disk, and the server
// stops taking mutations until it is restarted and recovers.
//
// Thread safety: all methods are for the owner thread; callbacks run on it too (through `post`).
#ifndef FENCELOCK_LOCK_SERVER_DURABLE_LOG_H_
#define FENCELOCK_LOCK_SERVER_DURABLE_LOG_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "lock-server/env.h"
#include "state_machine.h"
#include "storage.h"

namespace fencelock::server {

struct DurableLogOptions {
  Env* env = nullptr;
  std::string dir;
  // Size of each preallocated WAL segment. Default: 64 MiB.
  uint64_t segment_bytes = kDefaultSegmentBytes;
  // How many tokens (and session ids) one SEQUENCES write reserves ahead. Default: 10000.
  uint64_t reservation_block = 10000;
  // A batch of at most this many records is written and synced on the owner's thread when the
  // writer is idle: a light load then pays one fdatasync and no thread hand-offs. Larger
  // batches go to the writer thread so that the owner keeps serving while they sync.
  // Default: 4. Zero always uses the writer thread.
  uint64_t inline_sync_max_records = 4;
  // Called with the duration of every batch write + fdatasync, on whichever thread did it.
  std::function<void(int64_t ns)> on_sync;
};

struct DurableLogStats {
  uint64_t syncs = 0;          // fdatasyncs of WAL batches
  uint64_t batches = 0;
  uint64_t records = 0;
  uint64_t bytes = 0;
  uint64_t snapshots = 0;
  uint64_t reservations = 0;
  uint64_t segment = 0;        // current segment number
  int64_t last_sync_ns = 0;    // duration of the last batch write + sync
  int64_t total_sync_ns = 0;
};

class DurableLog {
 public:
  using Post = std::function<void(std::function<void()>)>;

  // Takes over a recovered directory: zeroes a torn tail reported by recovery, and durably
  // reserves sequence blocks above the recovered floors, before returning.
  static absl::StatusOr<std::unique_ptr<DurableLog>> Open(const DurableLogOptions& options,
                                                          const RecoveryReport& recovered,
                                                          Post post);
  // Finishes the queued jobs, then stops the writer thread.
  ~DurableLog();

  // Called with the number of the newest durable batch after each batch completes.
  void set_on_durable(std::function<void(uint64_t)> f) { on_durable_ = std::move(f); }
  // Called once, when the log enters its fault state.
  void set_on_fault(std::function<void(const absl::Status&)> f) { on_fault_ = std::move(f); }
  // Called after a batch went to a new segment, once the WAL written since the last snapshot
  // is at least as large as that snapshot: a snapshot then costs no more I/O than the log it
  // replaces, and the log stays within about twice the state plus a segment.
  void set_on_snapshot_due(std::function<void()> f) { on_snapshot_due_ = std::move(f); }

  // Makes sure `token` and `session` are covered by a durable reservation before any batch
  // queued after this call; queues a SEQUENCES write when they are not.
  void ReserveFor(FenceToken token, SessionId session);
  // Assigns the next lsn to `r` and adds it to the pending batch. Renewals are not logged.
  void Append(const Record& r);
  // Hands the pending batch to the writer unless a batch is already being synced.
  void Flush();
  // Queues everything pending, then a snapshot of `state` (which must reflect every record
  // appended so far), then removes what the snapshot makes redundant.
  void Snapshot(const StateMachine& state);

  uint64_t last_lsn() const { return next_lsn_ - 1; }
  uint64_t newest_batch() const { return newest_batch_; }
  uint64_t durable_batch() const { return durable_batch_; }
  bool faulted() const { return !fault_.ok(); }
  const absl::Status& fault() const { return fault_; }
  DurableLogStats stats() const;

 private:
  struct Job {
    std::function<absl::Status()> run;
    std::function<void(const absl::Status&)> done;  // on the owner thread
  };
  DurableLog(const DurableLogOptions& options, Post post);

  void Enqueue(Job job);
  // Runs `job` on the calling (owner) thread if the writer is idle; false if it is not.
  bool RunInlineIfIdle(Job& job);
  void SendPending();
  void WriterLoop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !jobs_.empty();
  }
  // Writer thread only.
  absl::Status WriteBatch(const std::string& bytes, uint64_t last_lsn, bool* rotated);
  absl::Status Rotate(uint64_t needed);
  absl::Status WriteSnapshot(const std::string& bytes, uint64_t lsn);
  void OnJobDone(const absl::Status& s);

  const DurableLogOptions options_;
  Post post_;
  std::function<void(uint64_t)> on_durable_;
  std::function<void(const absl::Status&)> on_fault_;
  std::function<void()> on_snapshot_due_;

  // Owner thread.
  uint64_t next_lsn_ = 1;
  std::string pending_;
  uint64_t pending_last_lsn_ = 0;
  uint64_t pending_records_ = 0;
  uint64_t next_batch_ = 1;
  uint64_t newest_batch_ = 0;
  uint64_t durable_batch_ = 0;
  int in_flight_ = 0;
  Sequences reserved_;
  absl::Status fault_;
  uint64_t last_snapshot_bytes_ = 0;
  uint64_t wal_bytes_at_snapshot_ = 0;  // bytes_ when the last snapshot was queued
  uint64_t wal_bytes_queued_ = 0;       // bytes of every batch handed to the writer

  // Writer thread.
  std::unique_ptr<SegmentFile> file_;
  uint64_t segment_ = 0;
  uint64_t segment_size_ = 0;
  uint64_t offset_ = 0;
  std::map<uint64_t, uint64_t> segment_last_lsn_;
  std::vector<uint64_t> snapshot_lsns_;
  absl::Status writer_fault_;

  // Shared, read by stats().
  std::atomic<uint64_t> syncs_{0}, batches_{0}, records_{0}, bytes_{0}, snapshots_{0},
      reservations_{0}, current_segment_{0};
  std::atomic<int64_t> last_sync_ns_{0}, total_sync_ns_{0};

  // The writer thread's own state above is handed over by writer_busy_: the owner touches it
  // only while holding mu_ with no job queued or running (RunInlineIfIdle).
  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool writer_busy_ ABSL_GUARDED_BY(mu_) = false;  // a job is running on the writer thread
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_DURABLE_LOG_H_
