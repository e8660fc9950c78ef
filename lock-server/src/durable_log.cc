#include "durable_log.h"

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace fencelock::server {
namespace {

std::string Path(const std::string& dir, const std::string& name) { return dir + "/" + name; }

bool IsLogged(const Record& r) {
  return !std::holds_alternative<record::SessionRenewed>(r) &&
         !std::holds_alternative<record::LockRenewed>(r);
}

const uint64_t kSealBytes = EncodeSealFrame(UINT64_MAX).size();

}  // namespace

DurableLog::DurableLog(const DurableLogOptions& options, Post post)
    : options_(options), post_(std::move(post)) {}

absl::StatusOr<std::unique_ptr<DurableLog>> DurableLog::Open(const DurableLogOptions& options,
                                                            const RecoveryReport& recovered,
                                                            Post post) {
  std::unique_ptr<DurableLog> log(new DurableLog(options, std::move(post)));
  Env* env = options.env;
  const std::string segment_path = Path(options.dir, SegmentName(recovered.last_segment));
  auto file = env->OpenSegment(segment_path);
  if (!file.ok()) return file.status();
  if (recovered.torn_tail_bytes > 0) {
    // Appends continue where the good records end, so the torn bytes must not stay behind
    // them: a later recovery would read them as damage in the middle of the log.
    const std::string zeros(recovered.torn_tail_bytes, '\0');
    if (absl::Status s = (*file)->WriteAt(recovered.torn_tail_offset, zeros); !s.ok()) return s;
    if (absl::Status s = (*file)->Sync(); !s.ok()) return s;
  }
  log->reserved_ = Sequences{recovered.token_floor + options.reservation_block,
                             recovered.session_floor + options.reservation_block};
  if (absl::Status s = env->WriteFileAtomically(Path(options.dir, kSequencesFile),
                                                EncodeSequences(log->reserved_));
      !s.ok()) {
    return s;
  }
  log->file_ = std::move(*file);
  log->segment_ = recovered.last_segment;
  log->segment_size_ = recovered.last_segment_size;
  log->offset_ = recovered.append_offset;
  log->segment_last_lsn_ = recovered.segment_last_lsn;
  for (const std::string& name : recovered.snapshot_files) {
    log->snapshot_lsns_.push_back(std::stoull(name.substr(sizeof("snapshot-") - 1)));
  }
  log->next_lsn_ = recovered.last_lsn + 1;
  log->last_snapshot_bytes_ = recovered.snapshot_bytes;
  for (const std::string& name : recovered.stale_temp_files) {
    (void)env->RemoveFile(Path(options.dir, name));
  }
  log->current_segment_ = log->segment_;
  log->writer_ = std::thread([l = log.get()] { l->WriterLoop(); });
  return log;
}

DurableLog::~DurableLog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();  // Open() may fail before starting it
}

DurableLogStats DurableLog::stats() const {
  DurableLogStats s;
  s.syncs = syncs_.load();
  s.batches = batches_.load();
  s.records = records_.load();
  s.bytes = bytes_.load();
  s.snapshots = snapshots_.load();
  s.reservations = reservations_.load();
  s.segment = current_segment_.load();
  s.last_sync_ns = last_sync_ns_.load();
  s.total_sync_ns = total_sync_ns_.load();
  return s;
}

void DurableLog::ReserveFor(FenceToken token, SessionId session) {
  if (token <= reserved_.token_hwm && session <= reserved_.session_hwm) return;
  reserved_.token_hwm = std::max(reserved_.token_hwm, token + options_.reservation_block);
  reserved_.session_hwm = std::max(reserved_.session_hwm, session + options_.reservation_block);
  const std::string bytes = EncodeSequences(reserved_);
  Enqueue(Job{[this, bytes] {
                ++reservations_;
                return options_.env->WriteFileAtomically(Path(options_.dir, kSequencesFile), bytes);
              },
              [this](const absl::Status& s) { OnJobDone(s); }});
}

void DurableLog::Append(const Record& r) {
  if (!IsLogged(r)) return;
  const uint64_t lsn = next_lsn_++;
  pending_ += EncodeRecordFrame(lsn, r);
  pending_last_lsn_ = lsn;
  ++pending_records_;
  newest_batch_ = next_batch_;
}

void DurableLog::Flush() {
  if (fault_.ok() && in_flight_ == 0 && !pending_.empty()) SendPending();
}

void DurableLog::SendPending() {
  const uint64_t batch = next_batch_++;
  auto bytes = std::make_shared<std::string>(std::move(pending_));
  const uint64_t last_lsn = pending_last_lsn_;
  const uint64_t records = pending_records_;
  wal_bytes_queued_ += bytes->size();
  pending_.clear();
  pending_records_ = 0;
  ++in_flight_;
  auto rotated = std::make_shared<bool>(false);
  Job job{[this, bytes, last_lsn, records, rotated] {
                absl::Status s = WriteBatch(*bytes, last_lsn, rotated.get());
                if (s.ok()) records_ += records;
                return s;
              },
              [this, batch, rotated](const absl::Status& s) {
                --in_flight_;
                OnJobDone(s);
                if (!s.ok()) return;
                durable_batch_ = batch;
                if (on_durable_) on_durable_(batch);
                if (*rotated && on_snapshot_due_ &&
                    wal_bytes_queued_ - wal_bytes_at_snapshot_ >= last_snapshot_bytes_) {
                  on_snapshot_due_();
                }
                Flush();
              }};
  if (records <= options_.inline_sync_max_records && RunInlineIfIdle(job)) return;
  Enqueue(std::move(job));
}

bool DurableLog::RunInlineIfIdle(Job& job) {
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    if (!jobs_.empty() || writer_busy_ || !writer_fault_.ok()) return false;
    // Holding mu_ keeps the writer thread from starting anything while the owner uses the
    // writer's state; only the owner enqueues, and it is here.
    s = job.run();
    if (!s.ok()) {
      writer_fault_ = s;
      std::fprintf(stderr, "lockd: disk fault, no longer accepting mutations: %s\n",
                   s.ToString().c_str());
    }
  }
  job.done(s);
  return true;
}

void DurableLog::Snapshot(const StateMachine& state) {
  if (!pending_.empty()) SendPending();
  const uint64_t lsn = last_lsn();
  auto bytes = std::make_shared<std::string>(EncodeSnapshot(state, lsn));
  last_snapshot_bytes_ = bytes->size();
  wal_bytes_at_snapshot_ = wal_bytes_queued_;
  Enqueue(Job{[this, bytes, lsn] { return WriteSnapshot(*bytes, lsn); },
              [this](const absl::Status& s) { OnJobDone(s); }});
}

void DurableLog::OnJobDone(const absl::Status& s) {
  if (s.ok() || !fault_.ok()) return;
  fault_ = s;
  if (on_fault_) on_fault_(s);
}

void DurableLog::Enqueue(Job job) {
  {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
  }
}

void DurableLog::WriterLoop() {
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &DurableLog::HasWorkOrStopping));
      if (jobs_.empty()) return;  // stopping, and every queued job has run
      job = std::move(jobs_.front());
      jobs_.pop_front();
      writer_busy_ = true;
    }
    // After the first failure nothing more is written: the disk state stays exactly what
    // recovery will find, and nothing queued behind the failure is acknowledged.
    absl::Status s = writer_fault_.ok() ? job.run() : writer_fault_;
    if (!s.ok() && writer_fault_.ok()) {
      writer_fault_ = s;
      std::fprintf(stderr, "lockd: disk fault, no longer accepting mutations: %s\n",
                   s.ToString().c_str());
    }
    {
      absl::MutexLock lock(&mu_);
      writer_busy_ = false;
    }
    post_([done = std::move(job.done), s] { done(s); });
  }
}

absl::Status DurableLog::WriteBatch(const std::string& bytes, uint64_t last_lsn, bool* rotated) {
  const auto start = std::chrono::steady_clock::now();
  if (offset_ + bytes.size() + kSealBytes > segment_size_) {
    if (absl::Status s = Rotate(bytes.size()); !s.ok()) return s;
    *rotated = true;
  }
  if (absl::Status s = file_->WriteAt(offset_, bytes); !s.ok()) return s;
  if (absl::Status s = file_->Sync(); !s.ok()) return s;
  offset_ += bytes.size();
  segment_last_lsn_[segment_] = last_lsn;
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - start)
                         .count();
  ++syncs_;
  ++batches_;
  bytes_ += bytes.size();
  last_sync_ns_ = ns;
  total_sync_ns_ += ns;
  if (options_.on_sync) options_.on_sync(ns);
  return absl::OkStatus();
}

absl::Status DurableLog::Rotate(uint64_t needed) {
  const uint64_t next = segment_ + 1;
  const uint64_t size =
      std::max(options_.segment_bytes, kSegmentHeaderBytes + needed + kSealBytes);
  // The new segment exists (durably) before the old one is sealed, so a seal always names a
  // segment that is there.
  auto file = options_.env->CreateSegment(Path(options_.dir, SegmentName(next)),
                                          EncodeSegmentHeader(next, size), size);
  if (!file.ok()) return file.status();
  if (absl::Status s = file_->WriteAt(offset_, EncodeSealFrame(next)); !s.ok()) return s;
  if (absl::Status s = file_->Sync(); !s.ok()) return s;
  file_ = std::move(*file);
  segment_ = next;
  segment_size_ = size;
  offset_ = kSegmentHeaderBytes;
  segment_last_lsn_[next] = 0;
  current_segment_ = next;
  return absl::OkStatus();
}

absl::Status DurableLog::WriteSnapshot(const std::string& bytes, uint64_t lsn) {
  if (absl::Status s = options_.env->WriteFileAtomically(Path(options_.dir, SnapshotName(lsn)),
                                                         bytes);
      !s.ok()) {
    return s;
  }
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

}  // namespace fencelock::server
