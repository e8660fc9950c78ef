// lockd's commit log on etcd, inside (the interface is lock-server/etcd_commit_log.h): one
// class, defined in two files. etcd_commit_log.cc holds the writer (batches, snapshots, the
// member probe) and the openers; etcd_log_restore.cc the start (format, ownership, snapshot,
// log, term). Only those two files include this.
#ifndef FENCELOCK_LOCK_SERVER_ETCD_LOG_H_
#define FENCELOCK_LOCK_SERVER_ETCD_LOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "clock/std_mutex.h"
#include "etcd_keys.h"
#include "etcd_ownership.h"
#include "lock-server/etcd_commit_log.h"
#include "lock-server/etcd_store.h"
#include "lock-server/storage.h"
#include "logging/logging.h"

namespace fencelock::server::etcd_log {

using etcd_keys::Keys;
using etcdserverpb::RequestOp;
using etcdserverpb::TxnRequest;

// P/format: what lockd init writes first, and every start checks.
inline constexpr char kEtcdFormat[] = "fencelock-lockd-etcd\nformat 1\n";

class EtcdCommitLog final : public CommitLog {
 public:
  EtcdCommitLog(const EtcdCommitLogOptions& options, TimeSource* time,
                std::unique_ptr<EtcdCalls> etcd)
      : options_(options),
        keys_(options.prefix),
        time_(time),
        etcd_(std::move(etcd)),
        ownership_(std::make_unique<EtcdOwnership>(
            EtcdOwnershipOptions{.prefix = options.prefix,
                                 .owner = options.owner,
                                 .ttl = options.owner_ttl,
                                 .margin = options.owner_margin,
                                 .wait = options.owner_wait,
                                 .hold_off = options.campaign_hold_off,
                                 .on_owned = options.on_owned,
                                 .on_standby = options.on_standby,
                                 .log = [this](const std::string& line) { Log(line); }},
            time, etcd_.get())),
        commit_timer_(time->NewTimer()),
        read_timer_(time->NewTimer()),
        probe_timer_(time->NewTimer()) {}
  ~EtcdCommitLog() override { *alive_ = false; }

  // Checks the format, takes P/owner, restores, reserves; then `started` with the state and
  // what recovery found, or why not (posted, never inside this call). Called once.
  using Started = std::function<void(absl::StatusOr<StateMachine>, std::vector<std::string>)>;
  void Start(Started started);
  // lockd destroy: deletes every key lockd wrote under P/ (Keys::IsOwn), P/owner included, in
  // one transaction guarded by the ownership, after what is queued; `done` with how many and
  // the keys under P/ that are not lockd's, which it leaves. Nothing may be appended after.
  struct Deleted {
    int64_t deleted = 0;
    std::vector<std::string> left;
  };
  void DeleteEverything(std::function<void(absl::StatusOr<Deleted>)> done);

  void SetListener(CommitLogListener* listener) override { listener_ = listener; }
  void ReserveFor(FenceToken token, SessionId session) override;
  void Append(const Record& r) override;
  void Flush() override;
  void Snapshot(const StateMachine& state) override;
  uint64_t newest_batch() const override { return newest_batch_; }
  uint64_t committed_batch() const override { return committed_batch_; }
  uint64_t last_lsn() const override { return next_lsn_ - 1; }
  // Also the moment the ownership deadline passes, before any timer notices: no request is
  // answered from this lockd's state after it.
  const absl::Status* fault() const override {
    if (!fault_.ok()) return &fault_;
    if (!lapsed_.ok()) return &lapsed_;
    if (ownership_->HoldsAt(time_->Now())) return nullptr;
    lapsed_ = ownership_->why_lost().ok()
                  ? absl::UnavailableError(absl::StrCat("the ownership of etcd prefix ",
                                                        options_.prefix, " has ended"))
                  : ownership_->why_lost();
    stopped_ = true;
    // Tells the listener later, from the event loop, not from inside this query.
    Later([self = const_cast<EtcdCommitLog*>(this)] { self->Fail(self->lapsed_); });
    return &lapsed_;
  }
  CommitLogStats stats() const override;
  std::string Describe() const override {
    return absl::StrCat("etcd prefix ", options_.prefix, " on ",
                        absl::StrJoin(etcd_->endpoints(), ","));
  }
  // For its leadership (EtcdLeadership, in etcd_commit_log.cc).
  MonoTime OwnedUntil() const { return stopped_ ? MonoTime::Min() : ownership_->until(); }
  std::vector<StoreMember> Members() const {
    StdMutexLock lock(&members_mu_);
    return members_;
  }

 private:
  template <typename T>
  void Ask(std::function<T(EtcdClient&)> call, std::function<void(T)> reply) {
    CallEtcd<T>(*etcd_, std::move(call),
                [alive = alive_, reply = std::move(reply)](T answer) mutable {
                  if (*alive) reply(std::move(answer));
                });
  }
  // Runs `task` from the event loop, unless the log is gone by then.
  void Later(std::function<void()> task) const {
    time_->Post([alive = alive_, task = std::move(task)] {
      if (*alive) task();
    });
  }
  // One read of the start; a member that timed out or was away is asked again (a read changes
  // nothing, so asking twice is safe) until the ownership's wait ends, or while it holds.
  void Read(etcdserverpb::RangeRequest r,
            std::function<void(absl::StatusOr<etcdserverpb::RangeResponse>)> reply,
            absl::Duration pause = absl::Milliseconds(10));
  void Get(const std::string& key,
           std::function<void(absl::StatusOr<std::optional<std::string>>)> reply);
  // Every key in [key, end), in key order, a page at a time (values can be large).
  void RangeAll(std::string key, std::string end,
                std::function<void(absl::StatusOr<std::vector<etcdserverpb::KeyValue>>)> reply,
                std::vector<etcdserverpb::KeyValue> so_far = {});

  // Every key in [key, end), without values, in key order, a thousand at a time.
  void ListKeys(std::string key, std::string end,
                std::function<void(absl::StatusOr<std::vector<std::string>>)> reply,
                std::vector<std::string> so_far = {});
  // kFailedPrecondition, naming it, if a prefix `around` this one or one inside it holds a
  // lockd state (its P/format): their key ranges overlap, so neither may be served.
  void CheckNotNested(std::vector<std::string> around, std::function<void(absl::Status)> done);

  // The start, step by step.
  void Restore();
  void RestoreSnapshot(std::string head);
  void RestoreLog(std::string snapshot);
  void RestoreTerm();
  void FinishStart(absl::Status s);

  // The writer: one job at a time, in order; a failed job fails every later one.
  struct Job {
    std::function<void(std::function<void(absl::Status)>)> run;
    std::function<void(const absl::Status&)> done;
  };
  void Enqueue(Job job);
  void RunJobs();
  // One transaction of `ops`, guarded by our ownership of P/owner; `done` with its revision.
  // Fails (for good) once the ownership has ended or etcd says the prefix is no longer ours.
  // etcd without a leader for a moment answers "unavailable" or not at all: the same
  // transaction is sent again until the ownership deadline. That is safe because every
  // transaction is guarded by P/owner and writes the same values to the same keys (or
  // deletes), so one that committed although its answer was lost changes nothing the second
  // time.
  using Committed = std::function<void(absl::StatusOr<int64_t>)>;
  struct CommitTry {
    TxnRequest txn;
    MonoTime start;
    absl::Duration pause = absl::Milliseconds(25);
    absl::Status last;
    Committed done;
  };
  void Commit(std::vector<RequestOp> ops, Committed done);
  void SendCommit(std::shared_ptr<CommitTry> t);
  void WriteBatch(std::shared_ptr<const std::string> frames,
                  std::shared_ptr<const std::vector<size_t>> ends,
                  std::shared_ptr<const std::vector<uint64_t>> lsns, size_t from,
                  std::function<void(absl::Status)> done);
  void WriteSnapshot(std::shared_ptr<const std::string> bytes, uint64_t lsn,
                     std::function<void(absl::Status)> done);
  // Chunk `i` of `chunks`, then the next, then the head.
  void WriteChunk(std::shared_ptr<const std::string> bytes, uint64_t lsn, uint64_t first,
                  uint64_t chunks, uint64_t i, std::function<void(absl::Status)> done);
  void WriteSnapshotHead(uint64_t lsn, uint64_t first, uint64_t chunks,
                         std::function<void(absl::Status)> done);
  void SendPending();
  void OnJobDone(const absl::Status& s);
  void Fail(const absl::Status& s);
  // Asks every member for its status, once a second, for lockctl status and the metrics.
  void Probe();
  void Log(const std::string& line) {
    if (options_.log) {
      options_.log(line);
    } else {
      logging::Lockd().Warning(line);
    }
  }

  const EtcdCommitLogOptions options_;
  const Keys keys_;
  TimeSource* const time_;
  // First, so that it goes last: the ownership revokes its lease through it.
  const std::unique_ptr<EtcdCalls> etcd_;
  const std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  const std::unique_ptr<EtcdOwnership> ownership_;
  std::unique_ptr<Timer> commit_timer_, read_timer_, probe_timer_;
  CommitLogListener* listener_ = nullptr;
  Started started_;

  // The start's findings.
  struct Restoring {
    MonoTime now;
    std::vector<std::string> summary;
    Sequences sequences;
    uint64_t lsn = 0, chunks = 0, first_chunk = 0;
    std::optional<StateMachine> state;
    uint64_t last = 0, replayed = 0;
  };
  std::unique_ptr<Restoring> restoring_;
  MonoTime read_until_;  // the reads before the ownership retry until then

  uint64_t next_lsn_ = 1;
  std::string pending_;
  std::vector<size_t> pending_ends_;     // end offset of each frame in pending_
  std::vector<uint64_t> pending_lsns_;   // and its lsn
  uint64_t next_batch_ = 1;
  uint64_t newest_batch_ = 0;
  uint64_t committed_batch_ = 0;
  int in_flight_ = 0;
  Sequences reserved_;
  absl::Status fault_;
  mutable absl::Status lapsed_;  // set by fault() when it finds the ownership ended
  mutable bool stopped_ = false;  // with fault_ or lapsed_: nothing more commits
  uint64_t snapshot_bytes_ = 0;
  uint64_t logged_since_snapshot_ = 0;
  bool snapshot_asked_ = false;
  uint64_t snapshot_lsn_ = 0;         // the snapshot in force
  uint64_t snapshot_chunks_end_ = 0;  // the index after its last chunk
  bool rewrite_snapshot_ = false;     // it held secrets in clear: the next snapshot replaces it

  std::deque<Job> jobs_;
  bool job_running_ = false;
  absl::Status writer_fault_;

  CommitLogStats stats_;
  uint64_t term_ = 0;
  mutable StdMutex members_mu_;
  std::vector<StoreMember> members_ ABSL_GUARDED_BY(members_mu_);
  std::vector<StoreMember> probing_;  // the round under way
  size_t probes_left_ = 0;
};

}  // namespace fencelock::server::etcd_log

#endif  // FENCELOCK_LOCK_SERVER_ETCD_LOG_H_
