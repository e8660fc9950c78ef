// The local commit log's class (local_commit_log.h opens it), shared by its two files:
// local_commit_log.cc (the WAL, the writer, recovery's hand-over) and
// local_commit_log_snapshot.cc (snapshots, read a slice at a time and written off the
// writer's queue). Not an interface: nothing outside these files includes it.
#ifndef FENCELOCK_LOCK_SERVER_LOCAL_COMMIT_LOG_INTERNAL_H_
#define FENCELOCK_LOCK_SERVER_LOCAL_COMMIT_LOG_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "clock/clock.h"
#include "lock-server/local_commit_log.h"
#include "lock-server/storage.h"

namespace fencelock::server::local_log {

inline std::string Path(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}


// The CommitLog over a state directory. The writer (a thread of its own, or steps run through
// the injected schedule_writer) touches only the writer's state; completions reach the owner
// through its post function.
class LocalCommitLog final : public CommitLog {
 public:
  // Takes over a recovered directory: zeroes a torn tail reported by recovery, and durably
  // reserves sequence blocks above the recovered floors, before returning.
  static absl::StatusOr<std::unique_ptr<LocalCommitLog>> Open(
      const LocalCommitLogOptions& options, const RecoveryReport& recovered, PostToOwner post);
  // With the writer thread: finishes the queued jobs, then stops it. With an injected
  // schedule_writer: abandons them.
  ~LocalCommitLog() override;

  void SetListener(CommitLogListener* listener) override { listener_ = listener; }
  // Keeps the state directory's lock for the life of the log.
  void HoldDirectory(std::unique_ptr<FileLock> lock) { dir_lock_ = std::move(lock); }
  // Before the writer runs: the next snapshot first moves appending to a new segment, so that
  // every segment up to the snapshot can be removed (records that must not stay on disk).
  void RotateAtNextSnapshot() { rotate_at_next_snapshot_ = true; }
  void ReserveFor(FenceToken token, SessionId session) override;
  void Append(const Record& r) override;
  void Flush() override;
  void StartIfIdle() override;
  void Snapshot(const StateMachine& state) override;

  uint64_t newest_batch() const override { return newest_batch_; }
  uint64_t committed_batch() const override { return durable_batch_; }
  uint64_t last_lsn() const override { return next_lsn_ - 1; }
  const absl::Status* fault() const override { return fault_.ok() ? nullptr : &fault_; }
  std::string Describe() const override { return "state directory " + options_.dir; }
  CommitLogStats stats() const override;

 private:
  // A batch's records, as a job carries them: the writer writes the records of consecutive
  // queued batches with one write and one fdatasync.
  struct BatchBytes {
    std::shared_ptr<std::string> bytes;
    uint64_t last_lsn = 0;
    uint64_t records = 0;
    std::shared_ptr<bool> rotated;  // set if its write moved to a new segment
  };
  struct Job {
    std::function<absl::Status()> run;              // unless `batch` is set
    std::function<void(const absl::Status&)> done;  // on the owner thread
    std::optional<BatchBytes> batch;
  };
  LocalCommitLog(const LocalCommitLogOptions& options, PostToOwner post);

  void Enqueue(Job job);
  // Runs `job` on the calling (owner) thread if the writer is idle; false if it is not.
  bool RunInlineIfIdle(Job& job);
  // Takes the next job off the queue, with every batch queued right behind a batch (mu_ held).
  std::vector<Job> TakeJobsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs jobs taken together: batches in one write and sync, anything else alone.
  absl::Status RunJobs(std::vector<Job>& jobs);
  // Hands the jobs' completions to the owner, in order, in one post.
  void PostDone(std::vector<Job> jobs, const absl::Status& s);
  void SendPending();
  void WriterLoop();
  // One queued job, for an injected schedule_writer; schedules the next if there is one.
  void RunScheduledJob();
  // Runs `job` unless the writer already failed; records the first failure. Writer only: a
  // job that ran out of descriptors is run again until it gets them or the log stops.
  absl::Status RunJob(Job& job);
  // Runs `job` once unless the writer already failed.
  absl::Status RunJobOnce(Job& job);
  // The first failure becomes the writer's fault, said once.
  void RecordFault(const absl::Status& s);
  bool Stopping();
  void Warn(const std::string& line);
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !jobs_.empty();
  }
  // Writer only.
  absl::Status WriteBatch(const std::string& bytes, uint64_t last_lsn, bool* rotated,
                          uint64_t records);
  absl::Status Rotate(uint64_t needed);
  // Encodes the next slice of the snapshot in progress.
  void SnapshotStep();
  // Writes the encoded snapshot once the batch holding its last record is committed: on a
  // thread of its own (or an injected step), never in the writer's queue, where the WAL's
  // syncs would wait behind it.
  void MaybeWriteSnapshot();
  // Runs `work` on the snapshot's thread (joining the last one first), or as an injected step.
  void OffTheWriter(std::function<void()> work);
  void OnSnapshotWritten(uint64_t lsn, const absl::Status& s);
  // Writer only: the snapshot after `lsn` is durable; forgets what it covers and names the
  // files that can go, for RemoveCovered.
  std::vector<std::string> DropCoveredBy(uint64_t lsn);
  // Removes `files` and syncs the directory, on the snapshot's thread (or an injected step):
  // unlinking hundreds of MB on the writer held the WAL's syncs behind it.
  void RemoveCovered(std::vector<std::string> files);
  void OnCoveredRemoved(const absl::Status& s);
  void OnJobDone(const absl::Status& s);
  // Queues a COMMITTED write of the newest lsn the writer has synced.
  void QueueCommittedMark();
  absl::Status WriteCommittedMark();

  const LocalCommitLogOptions options_;
  PostToOwner post_;
  const std::function<MonoTime()> now_;  // options.now, or the boot-time clock
  CommitLogListener* listener_ = nullptr;
  // Set by the destructor: scheduled steps and completions that arrive later do nothing.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::unique_ptr<FileLock> dir_lock_;

  // Owner thread.
  uint64_t next_lsn_ = 1;
  std::string pending_;
  uint64_t pending_last_lsn_ = 0;
  uint64_t pending_records_ = 0;
  uint64_t next_batch_ = 1;
  uint64_t newest_batch_ = 0;
  uint64_t durable_batch_ = 0;
  // Batches handed to the writer whose completion has not run here yet. A batch is synced
  // inline only when there are none: else its completion would run before theirs.
  int in_flight_ = 0;
  Sequences reserved_;
  absl::Status fault_;
  uint64_t last_snapshot_bytes_ = 0;
  // The snapshot being encoded (Snapshot), the lsn it is after and the batch that holds that
  // record; then encoded, waiting for that batch; then being written. One at a time.
  std::unique_ptr<SnapshotEncoder> snapshot_;
  std::shared_ptr<SnapshotEncoder> encoded_;
  bool snapshot_writing_ = false;
  // A snapshot was asked for while one was in progress: the next follows it, of that state.
  const StateMachine* snapshot_again_ = nullptr;
  uint64_t snapshot_lsn_ = 0;
  uint64_t snapshot_batch_ = 0;
  std::thread snapshot_thread_;
  bool rotate_at_next_snapshot_ = false;  // see RotateAtNextSnapshot()
  uint64_t wal_bytes_at_snapshot_ = 0;  // bytes_ when the last snapshot was queued
  uint64_t wal_bytes_queued_ = 0;       // bytes of every batch handed to the writer
  MonoTime last_mark_at_ = MonoTime::Min();
  // Writes the mark an interval after the last one when a commit since was left unmarked
  // (options_.time; null without it).
  std::unique_ptr<Timer> mark_timer_;

  // Writer.
  std::unique_ptr<SegmentFile> file_;
  uint64_t segment_ = 0;
  uint64_t segment_size_ = 0;
  uint64_t offset_ = 0;
  std::map<uint64_t, uint64_t> segment_last_lsn_;
  std::vector<uint64_t> snapshot_lsns_;
  absl::Status writer_fault_;
  uint64_t writer_synced_lsn_ = 0;  // every record up to it is synced
  uint64_t writer_marked_lsn_ = 0;  // as written to COMMITTED

  // Shared, read by stats().
  std::atomic<uint64_t> syncs_{0}, records_{0}, bytes_{0}, snapshots_{0}, reservations_{0},
      current_segment_{0};
  std::atomic<int64_t> last_sync_ns_{0}, total_sync_ns_{0};
  std::atomic<bool> snapshot_busy_{false};

  // The writer's state above is handed over by writer_busy_: the owner touches it only while
  // holding mu_ with no job queued or running (RunInlineIfIdle).
  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool writer_busy_ ABSL_GUARDED_BY(mu_) = false;  // a job is running on the writer
  bool writer_scheduled_ ABSL_GUARDED_BY(mu_) = false;  // schedule_writer holds a step
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
};

}  // namespace fencelock::server::local_log

#endif  // FENCELOCK_LOCK_SERVER_LOCAL_COMMIT_LOG_INTERNAL_H_
