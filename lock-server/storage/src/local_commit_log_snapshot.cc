// The local commit log's snapshots (local_commit_log_internal.h): read a slice at a time on
// the owner's thread while it serves, written on a thread of their own once their records are
// committed, then what they cover dropped by the writer.
#include <algorithm>
#include <system_error>
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
  OffTheWriter([this, encoder = std::move(encoded_), lsn = snapshot_lsn_, alive = alive_] {
    const absl::Status s = options_.env->WriteFileAtomically(
        Path(options_.dir, SnapshotName(lsn)), std::move(*encoder).Finish());
    post_([this, alive, lsn, s] {
      if (*alive) OnSnapshotWritten(lsn, s);
    });
  });
}

void LocalCommitLog::OffTheWriter(std::function<void()> work) {
  if (options_.schedule_writer) {
    options_.schedule_writer([alive = alive_, work = std::move(work)] {
      if (*alive) work();
    });
    return;
  }
  if (snapshot_thread_.joinable()) snapshot_thread_.join();  // the last one, long done
  try {
    snapshot_thread_ = std::thread(work);
  } catch (const std::system_error&) {
    // No thread to be had (the process or the host at its limit): on the writer, as before
    // issue 60, where the WAL's syncs wait behind it but nothing is lost.
    Enqueue(Job{[work = std::move(work)] {
                  work();
                  return absl::OkStatus();
                },
                [](const absl::Status&) {}});
  }
}

void LocalCommitLog::OnSnapshotWritten(uint64_t lsn, const absl::Status& s) {
  // Through the writer either way: a failure becomes its fault (nothing more is written), and
  // what the snapshot covers is its to forget. The files themselves go off the writer.
  auto covered = std::make_shared<std::vector<std::string>>();
  Enqueue(Job{[this, lsn, s, covered] {
                if (!s.ok()) return s;
                *covered = DropCoveredBy(lsn);
                return absl::OkStatus();
              },
              [this, covered](const absl::Status& st) {
                OnJobDone(st);
                if (!st.ok()) return OnCoveredRemoved(absl::OkStatus());
                RemoveCovered(std::move(*covered));
              }});
}

std::vector<std::string> LocalCommitLog::DropCoveredBy(uint64_t lsn) {
  ++snapshots_;
  // The snapshot is durable: older snapshots, and the oldest segments whose records it holds,
  // are no longer needed.
  std::vector<std::string> files;
  for (uint64_t old : snapshot_lsns_) {
    if (old < lsn) files.push_back(Path(options_.dir, SnapshotName(old)));
  }
  snapshot_lsns_.assign(1, lsn);
  for (auto it = segment_last_lsn_.begin(); it != segment_last_lsn_.end();) {
    if (it->first >= segment_ || it->second > lsn) break;
    files.push_back(Path(options_.dir, SegmentName(it->first)));
    it = segment_last_lsn_.erase(it);
  }
  return files;
}

void LocalCommitLog::RemoveCovered(std::vector<std::string> files) {
  OffTheWriter([this, files = std::move(files), alive = alive_] {
    // Oldest first, so that a crash between two leaves the log contiguous. Removal failures
    // are not faults: recovery copes with leftovers.
    for (const std::string& file : files) (void)options_.env->RemoveFile(file);
    const absl::Status s = files.empty() ? absl::OkStatus() : options_.env->SyncDir(options_.dir);
    post_([this, alive, s] {
      if (*alive) OnCoveredRemoved(s);
    });
  });
}

void LocalCommitLog::OnCoveredRemoved(const absl::Status& s) {
  OnJobDone(s);
  snapshot_writing_ = false;
  snapshot_busy_ = false;
  if (const StateMachine* again = std::exchange(snapshot_again_, nullptr)) Snapshot(*again);
}

}  // namespace fencelock::server::local_log
