#include "lock-server/local_commit_log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "logging/logging.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "clock/clock.h"
#include "lock-server/storage.h"
#include "local_commit_log_internal.h"

namespace fencelock::server {
namespace local_log {
namespace {

const uint64_t kSealBytes = EncodeSealFrame(UINT64_MAX).size();

}  // namespace


LocalCommitLog::LocalCommitLog(const LocalCommitLogOptions& options, PostToOwner post)
    : options_(options),
      post_(std::move(post)),
      now_(options.now ? options.now : [] { return Clock::Real()->Now(); }),
      mark_timer_(options.time != nullptr ? options.time->NewTimer() : nullptr) {}

absl::StatusOr<std::unique_ptr<LocalCommitLog>> LocalCommitLog::Open(
    const LocalCommitLogOptions& options, const RecoveryReport& recovered, PostToOwner post) {
  std::unique_ptr<LocalCommitLog> log(new LocalCommitLog(options, std::move(post)));
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
  log->writer_synced_lsn_ = recovered.last_lsn;
  log->writer_marked_lsn_ = recovered.committed_mark;
  log->last_snapshot_bytes_ = recovered.snapshot_bytes;
  for (const std::string& name : recovered.stale_temp_files) {
    (void)env->RemoveFile(Path(options.dir, name));
  }
  log->current_segment_ = log->segment_;
  env->PrepareSegment(Path(options.dir, SegmentName(log->segment_ + 1)), options.segment_bytes);
  if (!options.schedule_writer) {
    log->writer_ = std::thread([l = log.get()] { l->WriterLoop(); });
  }
  return log;
}

LocalCommitLog::~LocalCommitLog() {
  if (mark_timer_) mark_timer_->Cancel();
  // An unfinished snapshot ends its reading of the state, which outlives the log (the core
  // holds the state before its log).
  snapshot_.reset();
  // A clean stop records how far the log reached. An injected writer stands for a crash: it
  // abandons its queue and writes nothing more.
  if (!options_.schedule_writer && fault_.ok()) QueueCommittedMark();
  *alive_ = false;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();  // Open() may fail before starting it
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
}

CommitLogStats LocalCommitLog::stats() const {
  CommitLogStats s;
  s.commits = syncs_.load();
  s.records = records_.load();
  s.bytes = bytes_.load();
  s.snapshots = snapshots_.load();
  s.snapshot_in_progress = snapshot_busy_.load();
  s.reservations = reservations_.load();
  s.segment = current_segment_.load();
  s.last_commit_ns = last_sync_ns_.load();
  s.total_commit_ns = total_sync_ns_.load();
  return s;
}

void LocalCommitLog::ReserveFor(FenceToken token, SessionId session) {
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

void LocalCommitLog::Append(const Record& r) {
  if (!IsLogged(r)) return;
  const uint64_t lsn = next_lsn_++;
  pending_ += EncodeRecordFrame(lsn, r);
  pending_last_lsn_ = lsn;
  ++pending_records_;
  newest_batch_ = next_batch_;
}

void LocalCommitLog::Flush() {
  // Every flush hands its records over at once, even while batches are in flight: the writer
  // takes everything queued when its sync ends and writes it with one sync, so the disk never
  // waits for this thread to come round (replying, say) between two syncs.
  if (fault_.ok() && !pending_.empty()) SendPending();
}

void LocalCommitLog::StartIfIdle() {
  // Only a batch too large to sync inline: a small one waits for Flush(), which may sync it on
  // this thread without a hand-off (one client's request), and a large one goes to the writer
  // either way, so starting it now costs nothing.
  if (fault_.ok() && in_flight_ == 0 && pending_records_ > options_.inline_sync_max_records) {
    SendPending();
  }
}

void LocalCommitLog::SendPending() {
  const uint64_t batch = next_batch_++;
  auto bytes = std::make_shared<std::string>(std::move(pending_));
  const uint64_t last_lsn = pending_last_lsn_;
  const uint64_t records = pending_records_;
  wal_bytes_queued_ += bytes->size();
  pending_.clear();
  pending_records_ = 0;
  auto rotated = std::make_shared<bool>(false);
  ++in_flight_;
  Job job{nullptr,
          [this, batch, rotated](const absl::Status& s) {
            --in_flight_;
            OnJobDone(s);
            if (!s.ok()) return;
            durable_batch_ = batch;
            if (listener_ != nullptr) listener_->OnCommitted(batch);
            MaybeWriteSnapshot();
            const MonoTime now = now_();
            if (now - last_mark_at_ >= options_.committed_mark_interval) {
              last_mark_at_ = now;
              if (mark_timer_) mark_timer_->Cancel();
              QueueCommittedMark();
            } else if (mark_timer_ && mark_timer_->armed_for() == MonoTime::Max()) {
              // No commit may follow this one for a long time: mark it all the same.
              mark_timer_->ArmAt(last_mark_at_ + options_.committed_mark_interval, [this] {
                if (!fault_.ok()) return;
                last_mark_at_ = now_();
                QueueCommittedMark();
              });
            }
            if (*rotated && listener_ != nullptr &&
                wal_bytes_queued_ - wal_bytes_at_snapshot_ >= last_snapshot_bytes_) {
              listener_->OnSnapshotDue();
            }
            Flush();
          },
          BatchBytes{bytes, last_lsn, records, rotated}};
  // Inline only behind no other batch: the writer may have synced one whose completion is
  // still on its way here, and completions must run in batch order.
  if (records <= options_.inline_sync_max_records && in_flight_ == 1 && RunInlineIfIdle(job)) {
    return;
  }
  Enqueue(std::move(job));
}

absl::Status LocalCommitLog::RunJobOnce(Job& job) {
  // After the first failure nothing more is written: the disk state stays exactly what
  // recovery will find, and nothing queued behind the failure is acknowledged.
  return !writer_fault_.ok() ? writer_fault_
         : job.batch ? WriteBatch(*job.batch->bytes, job.batch->last_lsn,
                                  job.batch->rotated.get(), job.batch->records)
                     : job.run();
}

bool LocalCommitLog::Stopping() {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void LocalCommitLog::Warn(const std::string& line) {
  if (options_.log) {
    options_.log(line);
  } else {
    logging::Lockd().Warning(line);
  }
}

absl::Status LocalCommitLog::RunJob(Job& job) {
  absl::Status s = RunJobOnce(job);
  // Out of descriptors (a flood of connections, or anything else in the process) is not a
  // disk fault: the job did nothing durable, so it runs again once descriptors are back, and
  // the replies behind it wait meanwhile. The writer thread waits; an injected writer's disk
  // never runs out of them. A log that is stopping gives up.
  for (absl::Duration pause = absl::Milliseconds(10);
       OutOfDescriptors(s) && !options_.schedule_writer && !Stopping();
       pause = std::min(pause * 2, absl::Milliseconds(200))) {
    if (pause == absl::Milliseconds(10)) {
      Warn(absl::StrCat("out of file descriptors (", s.message(),
                        "); the commit waits and tries again"));
    }
    absl::SleepFor(pause);
    s = RunJobOnce(job);
  }
  RecordFault(s);
  return s;
}

void LocalCommitLog::RecordFault(const absl::Status& s) {
  if (s.ok() || !writer_fault_.ok()) return;
  writer_fault_ = s;
  const std::string line =
      absl::StrCat("disk fault, no longer accepting mutations: ", s.ToString());
  if (options_.log) {
    options_.log(line);
  } else {
    logging::Lockd().Error(line);
  }
}

bool LocalCommitLog::RunInlineIfIdle(Job& job) {
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    if (!jobs_.empty() || writer_busy_ || !writer_fault_.ok()) return false;
    // Holding mu_ keeps the writer from starting anything while the owner uses the writer's
    // state; only the owner enqueues, and it is here.
    s = RunJobOnce(job);
    // Out of descriptors: the writer runs it again until they are back (RunJob); the owner
    // never waits.
    if (OutOfDescriptors(s) && !options_.schedule_writer) return false;
    RecordFault(s);
  }
  job.done(s);
  return true;
}

void LocalCommitLog::QueueCommittedMark() {
  Enqueue(Job{[this] { return WriteCommittedMark(); },
              [this](const absl::Status& s) { OnJobDone(s); }});
}

absl::Status LocalCommitLog::WriteCommittedMark() {
  // Runs after every batch queued before it: what it records is synced.
  if (writer_synced_lsn_ <= writer_marked_lsn_) return absl::OkStatus();
  const uint64_t lsn = writer_synced_lsn_;
  if (absl::Status s = options_.env->WriteFileAtomically(Path(options_.dir, kCommittedFile),
                                                         EncodeCommittedMark(lsn));
      !s.ok()) {
    return s;
  }
  writer_marked_lsn_ = lsn;
  return absl::OkStatus();
}

void LocalCommitLog::OnJobDone(const absl::Status& s) {
  if (s.ok() || !fault_.ok()) return;
  fault_ = s;
  if (listener_ != nullptr) listener_->OnCommitFault(s);
}

void LocalCommitLog::Enqueue(Job job) {
  bool schedule = false;
  {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
    if (options_.schedule_writer && !writer_scheduled_) {
      writer_scheduled_ = true;
      schedule = true;
    }
  }
  if (schedule) {
    options_.schedule_writer([this, alive = alive_] {
      if (*alive) RunScheduledJob();
    });
  }
}

std::vector<LocalCommitLog::Job> LocalCommitLog::TakeJobsLocked() {
  std::vector<Job> taken;
  taken.push_back(std::move(jobs_.front()));
  jobs_.pop_front();
  while (taken.front().batch && !jobs_.empty() && jobs_.front().batch) {
    taken.push_back(std::move(jobs_.front()));
    jobs_.pop_front();
  }
  return taken;
}

absl::Status LocalCommitLog::RunJobs(std::vector<Job>& jobs) {
  if (jobs.size() == 1) return RunJob(jobs.front());
  // Consecutive batches: their records are consecutive in the log, so one write of them all
  // and one sync commit every one of them.
  BatchBytes merged{std::make_shared<std::string>(), jobs.back().batch->last_lsn, 0,
                    jobs.back().batch->rotated};
  for (const Job& job : jobs) {
    merged.bytes->append(*job.batch->bytes);
    merged.records += job.batch->records;
  }
  Job all{nullptr, nullptr, std::move(merged)};
  return RunJob(all);
}

void LocalCommitLog::PostDone(std::vector<Job> jobs, const absl::Status& s) {
  post_([alive = alive_, jobs = std::make_shared<std::vector<Job>>(std::move(jobs)), s] {
    if (!*alive) return;
    for (Job& job : *jobs) job.done(s);
  });
}

void LocalCommitLog::RunScheduledJob() {
  std::vector<Job> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs = TakeJobsLocked();
    writer_busy_ = true;
  }
  const absl::Status s = RunJobs(jobs);
  bool more = false;
  {
    absl::MutexLock lock(&mu_);
    writer_busy_ = false;
    more = !jobs_.empty();
    writer_scheduled_ = more;
  }
  PostDone(std::move(jobs), s);
  if (more) {
    options_.schedule_writer([this, alive = alive_] {
      if (*alive) RunScheduledJob();
    });
  }
}

void LocalCommitLog::WriterLoop() {
  for (;;) {
    std::vector<Job> jobs;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &LocalCommitLog::HasWorkOrStopping));
      if (jobs_.empty()) return;  // stopping, and every queued job has run
      jobs = TakeJobsLocked();
      writer_busy_ = true;
    }
    const absl::Status s = RunJobs(jobs);
    {
      absl::MutexLock lock(&mu_);
      writer_busy_ = false;
    }
    PostDone(std::move(jobs), s);
  }
}

absl::Status LocalCommitLog::WriteBatch(const std::string& bytes, uint64_t last_lsn,
                                        bool* rotated, uint64_t records) {
  const auto start = std::chrono::steady_clock::now();
  if (offset_ + bytes.size() + kSealBytes > segment_size_) {
    if (absl::Status s = Rotate(bytes.size()); !s.ok()) return s;
    *rotated = true;
  }
  if (absl::Status s = file_->WriteAt(offset_, bytes); !s.ok()) return s;
  if (absl::Status s = file_->Sync(); !s.ok()) return s;
  offset_ += bytes.size();
  segment_last_lsn_[segment_] = last_lsn;
  writer_synced_lsn_ = last_lsn;
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - start)
                         .count();
  ++syncs_;
  records_ += records;
  bytes_ += bytes.size();
  last_sync_ns_ = ns;
  total_sync_ns_ += ns;
  if (options_.on_sync) options_.on_sync(ns);
  return absl::OkStatus();
}

absl::Status LocalCommitLog::Rotate(uint64_t needed) {
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
  options_.env->PrepareSegment(Path(options_.dir, SegmentName(next + 1)), options_.segment_bytes);
  return absl::OkStatus();
}

}  // namespace local_log

namespace {

using local_log::LocalCommitLog;
using local_log::Path;

std::vector<std::string> Summary(const StateMachine& state, const std::string& dir,
                                 const RecoveryReport& report) {
  std::vector<std::string> lines = {
      absl::StrCat("restored ", state.session_count(), " sessions and ", state.held_lock_count(),
                   " held locks from ", dir, " (snapshot lsn ", report.snapshot_lsn, ", ",
                   report.records_replayed, " records replayed, last lsn ", report.last_lsn, ")"),
      absl::StrCat("next token above ", report.token_floor, ", next session id above ",
                   report.session_floor)};
  for (const std::string& w : report.warnings) lines.push_back("warning: " + w);
  return lines;
}

}  // namespace

absl::StatusOr<OpenedCommitLog> OpenLocalCommitLog(const LocalCommitLogOptions& options,
                                                   MonoTime now, PostToOwner post) {
  if (options.env == nullptr || options.dir.empty()) {
    return absl::InvalidArgumentError("the local commit log needs an Env and a directory");
  }
  // One state directory, one server, for the whole life of the log: a second lockd on the same
  // directory is refused here, before it reads anything. Only an initialized directory is
  // locked: recovery explains what is wrong with any other, and `lockd init` must still find a
  // directory it was refused on empty.
  std::unique_ptr<FileLock> dir_lock;
  if (auto format = options.env->ReadFile(Path(options.dir, kFormatFile)); format.ok()) {
    auto locked = options.env->LockFile(Path(options.dir, kLockFile),
                                        options.owner.empty() ? "lockd" : options.owner);
    if (!locked.ok()) return locked.status();
    dir_lock = std::move(*locked);
  }
  // A destroy that was interrupted meant this state to go: it is finished, not served.
  if (options.env->ReadFile(Path(options.dir, kDestroyMarkerFile)).ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        options.dir, " is being destroyed (", kDestroyMarkerFile,
        "): lockd destroy was interrupted; run lockd destroy --data-dir=", options.dir,
        " to finish it"));
  }
  // Restore before anything is written: a directory we cannot trust is never appended to.
  auto recovered = Recover(options.env, options.dir, now);
  if (!recovered.ok()) return recovered.status();
  auto log = LocalCommitLog::Open(options, recovered->report, std::move(post));
  if (!log.ok()) return log.status();
  (*log)->HoldDirectory(std::move(dir_lock));
  // Records that held secrets in clear may sit in the segment appending continues in: the
  // snapshot that upgrades them (ServerCore::Start) moves to a new segment first, so that
  // every segment holding them can go.
  if (recovered->state.secrets_read_in_clear() > 0) (*log)->RotateAtNextSnapshot();
  OpenedCommitLog out;
  out.summary = Summary(recovered->state, options.dir, recovered->report);
  out.snapshot_lsn = recovered->report.snapshot_lsn;
  out.state = std::move(recovered->state);
  out.log = std::move(*log);
  return out;
}

}  // namespace fencelock::server
