// lockd's commit log on etcd (lock-server/etcd_commit_log.h): the writer, the member probe and
// the openers. Its start is in etcd_log_restore.cc, the class in etcd_log.h.
#include "lock-server/etcd_commit_log.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "etcd_log.h"

namespace fencelock::server {
namespace etcd_log {

using etcd_keys::DeleteRange;
using etcd_keys::PrefixEnd;
using etcd_keys::Put;
using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;
using etcdserverpb::TxnResponse;

// The leadership of an etcd log: serving while the log holds the prefix, deposed from the
// moment its ownership ends (fault() sees it then, before any timer does).
class EtcdLeadership final : public Leadership {
 public:
  explicit EtcdLeadership(const EtcdCommitLog* log) : log_(log) {}
  Role role() const override {
    return log_->fault() == nullptr ? Role::kServing : Role::kDeposed;
  }
  MonoTime ServesUntil() const override { return log_->OwnedUntil(); }
  bool leased() const override { return true; }
  std::string FaultRemedy() const override {
    return "this lockd no longer serves the prefix; another replica takes over";
  }
  std::vector<StoreMember> Members() const override { return log_->Members(); }

 private:
  const EtcdCommitLog* const log_;  // destroyed after this (OpenedCommitLog)
};

CommitLogStats EtcdCommitLog::stats() const {
  CommitLogStats s = stats_;
  s.term = term_;
  return s;
}

void EtcdCommitLog::Probe() {
  probing_.assign(etcd_->endpoints().size(), StoreMember{});
  probes_left_ = probing_.size();
  for (size_t i = 0; i < probing_.size(); ++i) {
    probing_[i].endpoint = etcd_->endpoints()[i];
    Ask<absl::StatusOr<etcdserverpb::StatusResponse>>(
        [i](EtcdClient& c) { return c.MemberStatus(i); },
        [this, i](absl::StatusOr<etcdserverpb::StatusResponse> status) {
          StoreMember& m = probing_[i];
          if (status.ok()) {
            m.reachable = true;
            m.raft_index = status->raftindex();
            m.db_bytes = status->dbsize();
            m.leader = status->leader() != 0 && status->leader() == status->header().member_id();
            for (const std::string& e : status->errors()) {
              absl::StrAppend(&m.error, m.error.empty() ? "" : "; ", e);
            }
          } else {
            m.error = std::string(status.status().message());
          }
          if (--probes_left_ > 0) return;
          {
            StdMutexLock lock(&members_mu_);
            members_ = probing_;
          }
          probe_timer_->ArmAt(time_->Now() + options_.member_probe, [this] { Probe(); });
        });
  }
}

void EtcdCommitLog::Enqueue(Job job) {
  jobs_.push_back(std::move(job));
  RunJobs();
}

void EtcdCommitLog::RunJobs() {
  if (job_running_ || jobs_.empty()) return;
  job_running_ = true;
  Job job = std::move(jobs_.front());
  jobs_.pop_front();
  auto finish = [this, done = std::move(job.done)](absl::Status s) {
    if (!s.ok() && writer_fault_.ok()) writer_fault_ = s;
    job_running_ = false;
    done(s);
    RunJobs();
  };
  if (!writer_fault_.ok()) {
    Later([finish, s = writer_fault_] { finish(s); });
    return;
  }
  job.run(std::move(finish));
}

void EtcdCommitLog::Commit(std::vector<RequestOp> ops, Committed done) {
  auto t = std::make_shared<CommitTry>();
  *t->txn.add_compare() = etcd_keys::CreatedAt(keys_.owner(), ownership_->revision());
  for (auto& op : ops) *t->txn.add_success() = std::move(op);
  t->start = time_->Now();
  t->done = std::move(done);
  SendCommit(std::move(t));
}

void EtcdCommitLog::SendCommit(std::shared_ptr<CommitTry> t) {
  absl::Status refused;
  if (stopped_) {
    // Once the log has failed (its replies were answered UNAVAILABLE), nothing queued behind
    // the failure is committed: a record nobody was told about must not appear in the state
    // a successor restores.
    refused = absl::UnavailableError("the commit log stopped after a fault");
  } else if (!ownership_->HoldsAt(time_->Now())) {
    refused = absl::UnavailableError(absl::StrCat(
        ownership_->why_lost().message(), "; nothing more is committed",
        t->last.ok() ? "" : absl::StrCat("; etcd: ", t->last.message())));
    if (OwnershipTakenAway(ownership_->why_lost())) refused = TakenAway(std::move(refused));
  }
  if (!refused.ok()) {
    Later([t, refused] { t->done(refused); });
    return;
  }
  Ask<absl::StatusOr<TxnResponse>>(
      [txn = t->txn](EtcdClient& c) { return c.Txn(txn); },
      [this, t](absl::StatusOr<TxnResponse> r) {
        if (!r.ok()) {
          if (!IsTransient(r.status())) return t->done(r.status());
          t->last = r.status();
          ++stats_.commit_retries;
          commit_timer_->ArmAt(time_->Now() + t->pause, [this, t] { SendCommit(t); });
          t->pause = std::min(2 * t->pause, absl::Milliseconds(250));
          return;
        }
        if (!r->succeeded()) {
          return t->done(TakenAway(absl::FailedPreconditionError(absl::StrCat(
              "etcd prefix ", options_.prefix, " is no longer this lockd's (", keys_.owner(),
              " changed); nothing more is committed"))));
        }
        const int64_t ns = absl::ToInt64Nanoseconds(time_->Now() - t->start);
        ++stats_.commits;
        stats_.last_commit_ns = ns;
        stats_.total_commit_ns += ns;
        if (options_.on_commit) options_.on_commit(ns);
        t->done(r->header().revision());
      });
}

void EtcdCommitLog::ReserveFor(FenceToken token, SessionId session) {
  if (token <= reserved_.token_hwm && session <= reserved_.session_hwm) return;
  reserved_.token_hwm = std::max(reserved_.token_hwm, token + options_.reservation_block);
  reserved_.session_hwm = std::max(reserved_.session_hwm, session + options_.reservation_block);
  Enqueue(Job{[this, bytes = EncodeSequences(reserved_)](std::function<void(absl::Status)> done) {
                ++stats_.reservations;
                Commit({Put(keys_.sequences(), bytes)},
                       [done](absl::StatusOr<int64_t> r) { done(r.status()); });
              },
              [this](const absl::Status& s) { OnJobDone(s); }});
}

void EtcdCommitLog::Append(const Record& r) {
  if (!IsLogged(r)) return;
  const uint64_t lsn = next_lsn_++;
  pending_ += EncodeRecordFrame(lsn, r);
  pending_ends_.push_back(pending_.size());
  pending_lsns_.push_back(lsn);
  newest_batch_ = next_batch_;
}

void EtcdCommitLog::Flush() {
  if (fault_.ok() && in_flight_ == 0 && !pending_.empty()) SendPending();
}

void EtcdCommitLog::SendPending() {
  const uint64_t batch = next_batch_++;
  auto frames = std::make_shared<const std::string>(std::move(pending_));
  auto ends = std::make_shared<const std::vector<size_t>>(std::move(pending_ends_));
  auto lsns = std::make_shared<const std::vector<uint64_t>>(std::move(pending_lsns_));
  pending_.clear();
  pending_ends_.clear();
  pending_lsns_.clear();
  logged_since_snapshot_ += frames->size();
  ++in_flight_;
  Enqueue(Job{[this, frames, ends, lsns](std::function<void(absl::Status)> done) {
                WriteBatch(frames, ends, lsns, 0, std::move(done));
              },
              [this, batch](const absl::Status& s) {
                --in_flight_;
                OnJobDone(s);
                if (!s.ok()) return;
                committed_batch_ = batch;
                if (listener_ != nullptr) listener_->OnCommitted(batch);
                // A snapshot once the log since the last one outgrows it (and the minimum).
                if (!snapshot_asked_ && listener_ != nullptr &&
                    logged_since_snapshot_ >=
                        std::max<uint64_t>(snapshot_bytes_, options_.snapshot_min_bytes)) {
                  snapshot_asked_ = true;
                  listener_->OnSnapshotDue();
                }
                Flush();
              }});
}

void EtcdCommitLog::WriteBatch(std::shared_ptr<const std::string> frames,
                               std::shared_ptr<const std::vector<size_t>> ends,
                               std::shared_ptr<const std::vector<uint64_t>> lsns, size_t from,
                               std::function<void(absl::Status)> done) {
  // Keys of at most max_value_bytes, each named by its last record, all in one transaction
  // when they fit one request, else in order over several: this sends the transaction that
  // begins with frame `from`, then the next.
  std::vector<RequestOp> ops;
  size_t ops_bytes = 0;
  size_t start = from == 0 ? 0 : (*ends)[from - 1];
  size_t next = from;  // the first frame of the first key not in `ops`
  for (size_t i = from; i < ends->size(); ++i) {
    const bool last = i + 1 == ends->size();
    if (!last && (*ends)[i + 1] - start <= options_.max_value_bytes) continue;
    const size_t end = (*ends)[i];
    if (!ops.empty() && ops_bytes + (end - start) > options_.max_value_bytes) break;
    ops.push_back(Put(keys_.log((*lsns)[i]), frames->substr(start, end - start)));
    ops_bytes += end - start;
    start = end;
    next = i + 1;
  }
  Commit(std::move(ops), [this, frames, ends, lsns, next, done = std::move(done)](
                             absl::StatusOr<int64_t> r) mutable {
    if (!r.ok()) return done(r.status());
    if (next < ends->size()) return WriteBatch(frames, ends, lsns, next, std::move(done));
    stats_.records += lsns->size();
    stats_.bytes += frames->size();
    done(absl::OkStatus());
  });
}

void EtcdCommitLog::Snapshot(const StateMachine& state) {
  if (!pending_.empty() && fault_.ok()) SendPending();
  const uint64_t lsn = last_lsn();
  auto bytes = std::make_shared<const std::string>(EncodeSnapshot(state, lsn));
  snapshot_bytes_ = bytes->size();
  logged_since_snapshot_ = 0;
  Enqueue(Job{[this, bytes, lsn](std::function<void(absl::Status)> done) {
                WriteSnapshot(bytes, lsn, std::move(done));
              },
              [this](const absl::Status& s) {
                snapshot_asked_ = false;
                OnJobDone(s);
              }});
}

void EtcdCommitLog::WriteSnapshot(std::shared_ptr<const std::string> bytes, uint64_t lsn,
                                  std::function<void(absl::Status)> done) {
  // The snapshot in force is rewritten only when it held secrets in clear (an older lockd's).
  if (lsn == snapshot_lsn_ && !rewrite_snapshot_) {
    Later([done] { done(absl::OkStatus()); });
    return;
  }
  rewrite_snapshot_ = false;
  // The chunks first (invisible until the head names them), then in one transaction: the head,
  // and the deletion of the log it covers and of the older snapshots. A snapshot rewritten at
  // the lsn in force puts its chunks after the ones it replaces, which stay whole until the
  // head moves past them, and then go with it.
  const uint64_t first = lsn == snapshot_lsn_ ? snapshot_chunks_end_ : 0;
  const uint64_t chunks = std::max<uint64_t>(
      1, (bytes->size() + options_.max_value_bytes - 1) / options_.max_value_bytes);
  WriteChunk(std::move(bytes), lsn, first, chunks, 0, std::move(done));
}

void EtcdCommitLog::WriteChunk(std::shared_ptr<const std::string> bytes, uint64_t lsn,
                               uint64_t first, uint64_t chunks, uint64_t i,
                               std::function<void(absl::Status)> done) {
  if (i == chunks) return WriteSnapshotHead(lsn, first, chunks, std::move(done));
  Commit({Put(keys_.chunk(lsn, first + i),
              bytes->substr(i * options_.max_value_bytes, options_.max_value_bytes))},
         [this, bytes, lsn, first, chunks, i, done = std::move(done)](absl::StatusOr<int64_t> r) {
           if (!r.ok()) return done(r.status());
           WriteChunk(bytes, lsn, first, chunks, i + 1, done);
         });
}

void EtcdCommitLog::WriteSnapshotHead(uint64_t lsn, uint64_t first, uint64_t chunks,
                                      std::function<void(absl::Status)> done) {
  std::vector<RequestOp> head = {
      Put(keys_.head(), first == 0 ? absl::StrCat(lsn, " ", chunks)
                                   : absl::StrCat(lsn, " ", chunks, " ", first)),
      DeleteRange(keys_.log_dir(), keys_.log(lsn + 1)),
      DeleteRange(keys_.snapshots(), keys_.chunk_dir(lsn))};
  if (first > 0) head.push_back(DeleteRange(keys_.chunk(lsn, 0), keys_.chunk(lsn, first)));
  Commit(std::move(head), [this, lsn, first, chunks, done](absl::StatusOr<int64_t> revision) {
    if (!revision.ok()) return done(revision.status());
    snapshot_lsn_ = lsn;
    snapshot_chunks_end_ = first + chunks;
    ++stats_.snapshots;
    // etcd keeps every old value until its history is compacted: drop what the snapshot made
    // redundant, so that its database stays small.
    Ask<absl::Status>([revision = *revision](EtcdClient& c) { return c.Compact(revision); },
                      [this](absl::Status s) {
                        if (!s.ok()) {
                          Log(absl::StrCat("could not compact etcd's history (", s.message(),
                                           "); will retry"));
                        }
                      });
    done(absl::OkStatus());
  });
}

void EtcdCommitLog::OnJobDone(const absl::Status& s) {
  if (!s.ok()) Fail(s);
}

void EtcdCommitLog::Fail(const absl::Status& s) {
  if (!fault_.ok()) return;
  fault_ = s;
  stopped_ = true;
  ownership_->Lose(s);
  Log(absl::StrCat("commit fault, no longer accepting mutations: ", s.ToString()));
  if (listener_ != nullptr) listener_->OnCommitFault(fault_);
}

void EtcdCommitLog::DeleteEverything(std::function<void(absl::StatusOr<Deleted>)> done) {
  ListKeys(options_.prefix + "/", PrefixEnd(options_.prefix + "/"),
           [this, done = std::move(done)](absl::StatusOr<std::vector<std::string>> keys) {
             if (!keys.ok()) return done(keys.status());
             Deleted out;
             for (std::string& key : *keys) {
               if (keys_.IsOwn(key)) {
                 ++out.deleted;
               } else {
                 out.left.push_back(std::move(key));
               }
             }
             Enqueue(Job{[this](std::function<void(absl::Status)> finish) {
                           // Exactly lockd's keys: named ones and its two folders.
                           std::vector<RequestOp> ops;
                           for (const std::string& key :
                                {keys_.format(), keys_.sequences(), keys_.owner_lease(),
                                 keys_.term(), keys_.head(), keys_.owner()}) {
                             ops.push_back(DeleteRange(key, ""));
                           }
                           ops.push_back(DeleteRange(keys_.log_dir(), PrefixEnd(keys_.log_dir())));
                           ops.push_back(
                               DeleteRange(keys_.snapshots(), PrefixEnd(keys_.snapshots())));
                           Commit(std::move(ops),
                                  [finish](absl::StatusOr<int64_t> r) { finish(r.status()); });
                         },
                         [done, out = std::move(out)](const absl::Status& s) {
                           if (!s.ok()) return done(s);
                           done(out);
                         }});
           });
}

// An open under way: holds the log until it is handed over.
class Opening final : public EtcdLogOpening {
 public:
  explicit Opening(std::unique_ptr<EtcdCommitLog> log) : log_(std::move(log)) {}
  ~Opening() override { *alive_ = false; }
  EtcdCommitLog* log() { return log_.get(); }
  std::unique_ptr<EtcdCommitLog> Release() { return std::move(log_); }
  std::shared_ptr<bool> alive() const { return alive_; }

 private:
  std::unique_ptr<EtcdCommitLog> log_;
  const std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace etcd_log

namespace {

using etcd_keys::Keys;
using etcd_keys::NotPresent;
using etcd_keys::PrefixEnd;
using etcd_keys::Put;
using etcd_log::EtcdCommitLog;
using etcd_log::EtcdLeadership;
using etcd_log::kEtcdFormat;
using etcd_log::Opening;
using etcdserverpb::RangeRequest;
using etcdserverpb::TxnRequest;

// (The endpoints are the client's: GrpcEtcdClient::Create refuses an empty list.)
absl::Status CheckOptions(const EtcdCommitLogOptions& o) {
  if (o.prefix.size() < 2 || o.prefix.front() != '/' || o.prefix.back() == '/' ||
      absl::StrContains(o.prefix, "//")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-prefix=\"", o.prefix, "\" must start with /, not end with one and have no //"));
  }
  if (o.reservation_block == 0) return absl::InvalidArgumentError("the reservation block must be positive");
  if (o.owner_ttl < absl::Seconds(2) || o.owner_ttl > absl::Hours(1)) {
    return absl::InvalidArgumentError("the ownership TTL must be 2 s to 1 h");
  }
  if (!(o.owner_margin > 0 && o.owner_margin < 1)) {
    return absl::InvalidArgumentError("the ownership margin must be in (0, 1)");
  }
  if (o.max_value_bytes < 4096) return absl::InvalidArgumentError("values of at least 4 KiB");
  if (o.snapshot_min_bytes < 4096 || o.snapshot_min_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-snapshot-bytes must be 4 KiB to 1 GiB, got ", o.snapshot_min_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(const std::string& list) {
  std::vector<std::string> endpoints;
  for (absl::string_view e : absl::StrSplit(list, ',')) {
    const size_t colon = e.rfind(':');
    if (e.empty() || colon == absl::string_view::npos || colon == 0 || colon + 1 == e.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--etcd=\"", list, "\": each endpoint must be host:port, separated by commas"));
    }
    endpoints.emplace_back(e);
  }
  return endpoints;
}

absl::Status InitEtcdPrefixOn(const EtcdCommitLogOptions& options, EtcdClient& etcd) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const Keys keys(options.prefix);
  // No state around the prefix: its range would hold this one's keys. A user whose role
  // reaches only its own prefix cannot look there: those prefixes go unchecked (and are said
  // to), and one initialized there refuses to serve once it sees this one inside it.
  std::vector<std::string> checked;
  for (const std::string& around : etcd_keys::Ancestors(options.prefix)) {
    RangeRequest get;
    get.set_key(Keys(around).format());
    get.set_count_only(true);
    auto found = etcd.Range(get);
    if (absl::IsPermissionDenied(found.status())) {
      const std::string line = absl::StrCat(
          "lockd init: cannot tell whether etcd prefix ", around, " (around ", options.prefix,
          ") holds a lockd state: etcd refused the read (", found.status().message(), ")");
      if (options.log) {
        options.log(line);
      } else {
        logging::Lockd().Warning(line);
      }
      continue;
    }
    if (!found.ok()) return found.status();
    if (found->count() > 0) {
      return absl::FailedPreconditionError(etcd_keys::Nested(around, options.prefix));
    }
    checked.push_back(around);
  }
  // Nothing may be under the prefix yet: never mix with another lockd's (or anyone's) keys.
  RangeRequest any;
  any.set_key(options.prefix + "/");
  any.set_range_end(PrefixEnd(options.prefix + "/"));
  any.set_keys_only(true);
  any.set_limit(1000);
  auto existing = etcd.Range(any);
  if (!existing.ok()) return existing.status();
  for (const auto& kv : existing->kvs()) {
    if (etcd_keys::IsNestedFormat(options.prefix, kv.key())) {
      return absl::FailedPreconditionError(
          etcd_keys::Nested(options.prefix, etcd_keys::StateOf(kv.key())));
    }
  }
  if (existing->count() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd prefix ", options.prefix, " already holds ", existing->count(),
        " keys; lockd init needs an empty prefix"));
  }
  StateMachine empty;
  TxnRequest txn;
  // The checks above again, in the transaction: two inits of nested prefixes at once cannot
  // both succeed.
  *txn.add_compare() = etcd_keys::NothingIn(options.prefix + "/", PrefixEnd(options.prefix + "/"));
  for (const std::string& around : checked) *txn.add_compare() = NotPresent(Keys(around).format());
  *txn.add_success() = Put(keys.format(), kEtcdFormat);
  *txn.add_success() = Put(keys.sequences(), EncodeSequences({}));
  *txn.add_success() = Put(keys.chunk(0, 0), EncodeSnapshot(empty, 0));
  *txn.add_success() = Put(keys.head(), "0 1");
  auto r = etcd.Txn(txn);
  if (!r.ok()) return r.status();
  if (!r->succeeded()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd prefix ", options.prefix,
        " (or a prefix around or inside it) was initialized meanwhile; nothing was written"));
  }
  return absl::OkStatus();
}

std::unique_ptr<EtcdLogOpening> OpenEtcdCommitLogOn(const EtcdCommitLogOptions& options,
                                                    TimeSource* time,
                                                    std::unique_ptr<EtcdCalls> etcd,
                                                    EtcdLogOpened done) {
  auto opening = std::make_unique<Opening>(std::make_unique<EtcdCommitLog>(options, time, std::move(etcd)));
  if (absl::Status s = CheckOptions(options); !s.ok()) {
    time->Post([alive = opening->alive(), done, s] {
      if (*alive) done(s);
    });
    return opening;
  }
  Opening* o = opening.get();
  o->log()->Start([o, alive = o->alive(), done](absl::StatusOr<StateMachine> state,
                                               std::vector<std::string> summary) {
    // Posted by the log: not on its stack, so the caller may destroy what it is given.
    if (!*alive) return;
    if (!state.ok()) return done(state.status());
    OpenedCommitLog opened;
    opened.state = std::move(*state);
    opened.summary = std::move(summary);
    opened.leadership = std::make_unique<EtcdLeadership>(o->log());
    opened.log = o->Release();
    done(std::move(opened));
  });
  return opening;
}

std::unique_ptr<EtcdLogOpening> DestroyEtcdPrefixOn(
    const EtcdCommitLogOptions& options, TimeSource* time, std::unique_ptr<EtcdCalls> etcd,
    std::function<std::vector<std::string>(const StateMachine&)> held, EtcdDestroyed done) {
  // Once the keys are gone, the log's watch sees its own P/owner go: that is no news.
  auto deleted = std::make_shared<bool>(false);
  EtcdCommitLogOptions o = options;
  o.member_probe = absl::ZeroDuration();
  o.log = [deleted, log = options.log](const std::string& line) {
    if (*deleted) return;
    if (log) {
      log(line);
    } else {
      logging::Lockd().Warning(line);
    }
  };
  auto opening = std::make_unique<Opening>(std::make_unique<EtcdCommitLog>(o, time, std::move(etcd)));
  if (absl::Status s = CheckOptions(options); !s.ok()) {
    time->Post([alive = opening->alive(), done, s] {
      if (*alive) done(s);
    });
    return opening;
  }
  Opening* op = opening.get();
  op->log()->Start([op, alive = op->alive(), held, done, deleted](
                       absl::StatusOr<StateMachine> state, std::vector<std::string>) {
    if (!*alive) return;
    if (!state.ok()) return done(state.status());
    EtcdDestroyOutcome out;
    out.held = held(*state);
    if (!out.held.empty()) return done(out);
    *deleted = true;
    op->log()->DeleteEverything(
        [alive, done, deleted, out](absl::StatusOr<EtcdCommitLog::Deleted> n) mutable {
          if (!*alive) return;
          if (!n.ok()) {
            *deleted = false;
            return done(n.status());
          }
          out.deleted = n->deleted;
          out.left = std::move(n->left);
          done(out);
        });
  });
  return opening;
}

}  // namespace fencelock::server
