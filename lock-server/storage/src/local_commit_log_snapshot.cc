// The local commit log's snapshots (local_commit_log_internal.h): read a slice at a time on
// the owner's thread while it serves, written on a thread of their own once their records are
// committed, then what they cover dropped by the writer.
#include <algorithm>
#include <utility>

#include "local_commit_log_internal.h"

namespace fencelock::server::local_log {

void LocalCommitLog::Snapshot(const StateMachine& state) {
  // One at a time: the one in progress covers what this one asked for (its records, up to
  // its lsn, leave the log once it is written), and a later one follows the log's growth.
  if (!fault_.ok()) return;
  if (snapshot_ != nullptr || encoded_ != nullptr || snapshot_writing_) {
    snapshot_again_ = &state;
    return;
  }
  snapshot_busy_ = true;
  // Its records go to the writer now; the snapshot is written once they are committed.
  if (!pending_.empty()) SendPending();
  snapshot_lsn_ = last_lsn();
  snapshot_batch_ = newest_batch_;
  if (rotate_at_next_snapshot_) {
    // The records from here on go to a new segment, so that the snapshot covers every segment
    // up to it and they can all go (see RotateAtNextSnapshot).
    rotate_at_next_snapshot_ = false;
    Enqueue(Job{[this] {
                  return segment_last_lsn_[segment_] != 0 ? Rotate(0) : absl::OkStatus();
                },
                [this](const absl::Status& s) { OnJobDone(s); }});
  }
  // At most about as large as the last one plus what the log added since: a record adds no
  // more to the state than its own bytes. (After a restart the log replayed is not counted: the
  // buffer may then double once.)
  const uint64_t expected =
      last_snapshot_bytes_ + (wal_bytes_queued_ - wal_bytes_at_snapshot_) + 4096;
  snapshot_ = std::make_unique<SnapshotEncoder>(state, snapshot_lsn_, expected);
  wal_bytes_at_snapshot_ = wal_bytes_queued_;
  SnapshotStep();
}

void LocalCommitLog::SnapshotStep() {
  if (snapshot_ == nullptr) return;
  if (!fault_.ok()) {
    snapshot_.reset();
    snapshot_busy_ = false;
    return;
  }
  // A slice of 0 would never end the snapshot: one entry at least.
  if (!snapshot_->EncodeSome(std::max<size_t>(1, options_.snapshot_slice))) {
    post_([this, alive = alive_] {
      if (*alive) SnapshotStep();
    });
    return;
  }
  encoded_ = std::shared_ptr<SnapshotEncoder>(std::move(snapshot_));
  last_snapshot_bytes_ = encoded_->size();
  MaybeWriteSnapshot();
}

void LocalCommitLog::MaybeWriteSnapshot() {
  if (encoded_ == nullptr || durable_batch_ < snapshot_batch_ || !fault_.ok()) return;
  snapshot_writing_ = true;
  auto write = [this, encoder = std::move(encoded_), lsn = snapshot_lsn_, alive = alive_] {
    const absl::Status s = options_.env->WriteFileAtomically(
        Path(options_.dir, SnapshotName(lsn)), std::move(*encoder).Finish());
    post_([this, alive, lsn, s] {
      if (*alive) OnSnapshotWritten(lsn, s);
    });
  };
  if (options_.schedule_writer) {
    options_.schedule_writer([alive = alive_, write = std::move(write)] {
      if (*alive) write();
    });
    return;
  }
  if (snapshot_thread_.joinable()) snapshot_thread_.join();  // the last one, long done
  snapshot_thread_ = std::thread(std::move(write));
}

void LocalCommitLog::OnSnapshotWritten(uint64_t lsn, const absl::Status& s) {
  // Through the writer either way: a failure becomes its fault (nothing more is written), and
  // what the snapshot covers is its to drop.
  Enqueue(Job{[this, lsn, s] { return s.ok() ? DropCoveredBy(lsn) : s; },
              [this](const absl::Status& st) {
                OnJobDone(st);
                snapshot_writing_ = false;
                snapshot_busy_ = false;
                if (const StateMachine* again = std::exchange(snapshot_again_, nullptr)) {
                  Snapshot(*again);
                }
              }});
}

absl::Status LocalCommitLog::DropCoveredBy(uint64_t lsn) {
  ++snapshots_;
  // The snapshot is durable: older snapshots, and the oldest segments whose records it holds,
  // are no longer needed. Removal failures are not faults: recovery copes with leftovers.
  for (uint64_t old : snapshot_lsns_) {
    if (old < lsn) (void)options_.env->RemoveFile(Path(options_.dir, SnapshotName(old)));
  }
  snapshot_lsns_.assign(1, lsn);
  for (auto it = segment_last_lsn_.begin(); it != segment_last_lsn_.end();) {
    if (it->first >= segment_ || it->second > lsn) break;
    (void)options_.env->RemoveFile(Path(options_.dir, SegmentName(it->first)));
    it = segment_last_lsn_.erase(it);
  }
  return options_.env->SyncDir(options_.dir);
}

}  // namespace fencelock::server::local_log
