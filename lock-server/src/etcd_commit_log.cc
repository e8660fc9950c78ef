#include "lock-server/etcd_commit_log.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "logging/logging.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clock/monotonic_event.h"
#include "lock-server/etcd_store.h"
#include "lock-server/storage.h"

namespace fencelock::server {
namespace {

using etcdserverpb::Compare;
using etcdserverpb::RangeRequest;
using etcdserverpb::RequestOp;
using etcdserverpb::TxnRequest;

constexpr char kEtcdFormat[] = "fencelock-lockd-etcd\nformat 1\n";

std::string Lsn(uint64_t lsn) { return absl::StrFormat("%020u", lsn); }

// The key just past every key that starts with `prefix`.
std::string PrefixEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

struct Keys {
  explicit Keys(const std::string& p) : prefix(p) {}
  std::string format() const { return prefix + "/format"; }
  std::string sequences() const { return prefix + "/sequences"; }
  std::string owner() const { return prefix + "/owner"; }
  std::string term() const { return prefix + "/term"; }
  std::string head() const { return prefix + "/snapshot-head"; }
  std::string log_dir() const { return prefix + "/log/"; }
  std::string log(uint64_t last_lsn) const { return log_dir() + Lsn(last_lsn); }
  std::string snapshots() const { return prefix + "/snapshot/"; }
  std::string chunk_dir(uint64_t lsn) const { return snapshots() + Lsn(lsn) + "/"; }
  std::string chunk(uint64_t lsn, uint64_t i) const {
    return chunk_dir(lsn) + absl::StrFormat("%06u", i);
  }
  std::string prefix;
};

RequestOp Put(const std::string& key, std::string value, int64_t lease = 0) {
  RequestOp op;
  auto* put = op.mutable_request_put();
  put->set_key(key);
  put->set_value(std::move(value));
  put->set_lease(lease);
  return op;
}

RequestOp DeleteRange(const std::string& key, const std::string& end) {
  RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  op.mutable_request_delete_range()->set_range_end(end);
  return op;
}

Compare NotPresent(const std::string& key) {
  Compare c;
  c.set_key(key);
  c.set_target(Compare::VERSION);
  c.set_result(Compare::EQUAL);
  c.set_version(0);
  return c;
}

// (The endpoints are the client's: GrpcEtcdClient::Create refuses an empty list.)
absl::Status CheckOptions(const EtcdCommitLogOptions& o) {
  if (o.prefix.size() < 2 || o.prefix.front() != '/' || o.prefix.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-prefix=\"", o.prefix, "\" must start with / and not end with one"));
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

// Every key in [key, end), in key order, a page at a time (values can be large).
absl::StatusOr<std::vector<etcdserverpb::KeyValue>> RangeAll(EtcdClient& etcd,
                                                             const std::string& key,
                                                             const std::string& end) {
  std::vector<etcdserverpb::KeyValue> out;
  std::string from = key;
  for (;;) {
    RangeRequest r;
    r.set_key(from);
    r.set_range_end(end);
    r.set_limit(16);
    r.set_sort_order(RangeRequest::ASCEND);
    r.set_sort_target(RangeRequest::KEY);
    auto got = etcd.Range(r);
    if (!got.ok()) return got.status();
    for (auto& kv : *got->mutable_kvs()) out.push_back(std::move(kv));
    if (!got->more() || got->kvs_size() == 0) return out;
    from = out.back().key() + std::string(1, '\0');
  }
}

absl::StatusOr<std::string> Get(EtcdClient& etcd, const std::string& key, bool* found) {
  RangeRequest r;
  r.set_key(key);
  auto got = etcd.Range(r);
  if (!got.ok()) return got.status();
  *found = got->kvs_size() > 0;
  return *found ? got->kvs(0).value() : std::string();
}

class EtcdCommitLog final : public CommitLog {
 public:
  EtcdCommitLog(const EtcdCommitLogOptions& options, std::unique_ptr<EtcdClient> etcd,
                PostToOwner post)
      : options_(options),
        keys_(options.prefix),
        etcd_(std::move(etcd)),
        post_(std::move(post)),
        now_(options.now ? options.now : [] { return Clock::Real()->Now(); }) {}
  ~EtcdCommitLog() override;

  // Takes P/owner; restores; reserves. Called once, before the log is handed out.
  absl::StatusOr<StateMachine> Start(std::vector<std::string>* summary);
  // lockd destroy: deletes every key under P/, P/owner included, in one transaction guarded
  // by the ownership, on the writer thread; returns how many. Nothing may be appended after.
  absl::StatusOr<int64_t> DeleteEverything();

  void SetListener(CommitLogListener* listener) override { listener_ = listener; }
  void ReserveFor(FenceToken token, SessionId session) override;
  void Append(const Record& r) override;
  void Flush() override;
  void Snapshot(const StateMachine& state) override;
  uint64_t newest_batch() const override { return newest_batch_; }
  uint64_t committed_batch() const override { return committed_batch_; }
  uint64_t last_lsn() const override { return next_lsn_ - 1; }
  // Also the moment the ownership deadline passes, before any timer or thread notices: no
  // request is answered from this lockd's state after it.
  const absl::Status* fault() const override {
    if (!fault_.ok()) return &fault_;
    if (!lapsed_.ok()) return &lapsed_;
    const bool pulled = pulled_.load();
    if (!pulled && now_() < MonoTime::FromNanos(owned_until_ns_.load())) return nullptr;
    lapsed_ = pulled ? absl::UnavailableError(PulledWhy())
                     : absl::UnavailableError(absl::StrCat(
                           "the ownership of etcd prefix ", options_.prefix,
                           " may have lapsed (no lease renewal answered in time)"));
    stopped_ = true;
    // Tells the listener later, from the event loop, not from inside this query.
    post_([self = const_cast<EtcdCommitLog*>(this), alive = alive_] {
      if (*alive) self->Fail(self->lapsed_);
    });
    return &lapsed_;
  }
  CommitLogStats stats() const override;
  std::string Describe() const override {
    return absl::StrCat("etcd prefix ", options_.prefix, " on ",
                        absl::StrJoin(options_.endpoints, ","));
  }
  absl::Duration OwnershipLeft() const override {
    return std::max(OwnedUntil() - now_(), absl::ZeroDuration());
  }
  MonoTime OwnedUntil() const override {
    return stopped_ || pulled_ ? MonoTime::Min() : MonoTime::FromNanos(owned_until_ns_.load());
  }
  bool FaultEndsServing() const override { return true; }
  std::string FaultRemedy() const override {
    return "this lockd no longer serves the prefix and exits; a standby replica takes over";
  }
  std::vector<StoreMember> Members() const override {
    std::lock_guard<std::mutex> lock(members_mu_);
    return members_;
  }

 private:
  struct Job {
    std::function<absl::Status()> run;                   // on the writer
    std::function<void(const absl::Status&)> done;       // on the owner
  };
  void Enqueue(Job job);
  void WriterLoop();
  void KeeperLoop(MonoTime first);
  // Watches P/owner from the revision after ours: any change of it (deleted by hand, put by
  // someone else, its lease revoked) ends the ownership at once (Pulled).
  void WatchLoop();
  // OK while P/owner is the key this lockd created, on its lease; kFailedPrecondition saying
  // what became of it otherwise; etcd's error when it could not be read.
  absl::Status CheckOwnerKey(int64_t* revision = nullptr);
  // The ownership is gone for good, whatever the deadline says: from now on fault() reports it
  // and nothing more is committed. Any thread.
  void Pulled(const std::string& why);
  std::string PulledWhy() const {
    std::lock_guard<std::mutex> lock(pulled_mu_);
    return pulled_why_;
  }
  // At a takeover: P/owner went away while the lease it was on, `former`, still lives, so
  // someone deleted the key by hand and its lockd may still think it serves. Revokes that lease
  // (its lockd's next renewal fails) and waits the lease's whole TTL, renewing ours, before
  // anything is restored: by then that lockd's own deadline has passed. `lease_sent` moves
  // with our renewals. kNotFound when our own lease ran out meanwhile.
  absl::Status WaitOutFormerOwner(int64_t former, MonoTime* lease_sent);
  // Asks every member for its status, once a second, for lockctl status and the metrics.
  void ProbeLoop();
  void SendPending();
  void OnJobDone(const absl::Status& s);
  void Fail(const absl::Status& s);
  void Log(const std::string& line) {
    if (options_.log) {
      options_.log(line);
    } else {
      logging::Lockd().Warning(line);
    }
  }
  // Writer: one transaction of `ops`, guarded by our ownership of P/owner. Fails (for good)
  // when the ownership deadline has passed or etcd says the prefix is no longer ours.
  absl::StatusOr<int64_t> Commit(std::vector<RequestOp> ops);
  absl::Status WriteBatch(const std::string& frames, const std::vector<size_t>& ends,
                          const std::vector<uint64_t>& lsns);
  absl::Status WriteSnapshot(const std::string& bytes, uint64_t lsn);

  const EtcdCommitLogOptions options_;
  const Keys keys_;
  std::unique_ptr<EtcdClient> etcd_;
  PostToOwner post_;
  const std::function<MonoTime()> now_;
  CommitLogListener* listener_ = nullptr;
  std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);

  // Ownership: the lease on P/owner and the creation revision every transaction compares.
  int64_t lease_ = 0;
  int64_t owner_revision_ = 0;
  // Boot-time nanoseconds until which lockd may act as the prefix's owner.
  std::atomic<int64_t> owned_until_ns_{0};
  // Set, once, when P/owner was seen deleted or changed: the ownership ended then.
  std::atomic<bool> pulled_{false};
  mutable std::mutex pulled_mu_;
  std::string pulled_why_;  // guarded by pulled_mu_

  // Owner thread.
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
  mutable absl::Status lapsed_;  // set by fault() when it sees the ownership deadline pass
  uint64_t snapshot_bytes_ = 0;
  uint64_t logged_since_snapshot_ = 0;
  bool snapshot_asked_ = false;

  // Writer (set before it starts).
  uint64_t snapshot_lsn_ = 0;      // the snapshot in force
  uint64_t snapshot_chunks_end_ = 0;  // the index after its last chunk
  bool rewrite_snapshot_ = false;  // it held secrets in clear: the next snapshot replaces it
  absl::Status writer_fault_;

  mutable std::atomic<bool> stopped_{false};  // with fault_ or lapsed_: nothing more commits
  std::atomic<uint64_t> commits_{0}, records_{0}, bytes_{0}, snapshots_{0}, reservations_{0};
  std::atomic<uint64_t> commit_retries_{0};  // transactions sent again after etcd failed them
  std::atomic<int64_t> last_commit_ns_{0}, total_commit_ns_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;    // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::thread writer_;
  MonotonicEvent stop_keeper_;
  std::thread keeper_;
  std::thread prober_;
  std::thread watcher_;
  std::mutex watch_mu_;
  EtcdWatch* watch_ = nullptr;  // the watcher's current watch; guarded by watch_mu_
  bool watch_stopping_ = false;  // guarded by watch_mu_
  mutable std::mutex members_mu_;
  std::vector<StoreMember> members_;  // guarded by members_mu_
  uint64_t term_ = 0;
};

absl::StatusOr<StateMachine> EtcdCommitLog::Start(std::vector<std::string>* summary) {
  EtcdClient& etcd = *etcd_;
  bool found = false;
  auto format = Get(etcd, keys_.format(), &found);
  if (!format.ok()) return format.status();
  if (!found) {
    return absl::NotFoundError(absl::StrCat(
        "etcd prefix ", options_.prefix, " holds no lockd state; run lockd init --etcd=",
        absl::StrJoin(options_.endpoints, ","), " --etcd-prefix=", options_.prefix, " first"));
  }
  if (*format != kEtcdFormat) {
    return absl::FailedPreconditionError(absl::StrCat(
        keys_.format(), " is not a lockd state this lockd can read: \"",
        absl::CHexEscape(format->substr(0, 64)), "\""));
  }

  // Ownership: create P/owner on a lease of ours, waiting out a dead owner's lease.
  // The ownership lasts from the send time of the lease's last grant or renewal.
  MonoTime lease_sent = MonoTime::Min();
  const bool forever = options_.owner_wait == absl::InfiniteDuration();
  const MonoTime give_up = forever ? MonoTime::FromNanos(INT64_MAX) : now_() + options_.owner_wait;
  bool said_standby = false;
  std::string said_unreachable;  // the last etcd failure a standby logged
  std::string said_owner;        // the last owner a standby reported (on_standby)
  int64_t former_lease = 0;      // the lease of the last P/owner seen held by another
  // A standby outlives etcd's bad moments (a leader election, a member down): it logs the
  // failure once and tries again. A lockd that was asked to serve at once reports it.
  auto try_again = [&](const absl::Status& s) {
    if (!forever || !(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s))) return false;
    if (said_unreachable != s.message()) {
      said_unreachable = std::string(s.message());
      Log(absl::StrCat("standing by: ", s.message(), "; trying again"));
    }
    absl::SleepFor(absl::Milliseconds(250));
    return true;
  };
  for (;;) {
    // Our own lease, made before the create and kept alive while we wait: renewed every third
    // of its TTL, or taken anew if it ran out. The ownership counts from the send time of the
    // lease's last grant or renewal.
    if (lease_ == 0 || now_() - lease_sent >= options_.owner_ttl / 3) {
      const MonoTime sent = now_();
      absl::Status s;
      if (lease_ != 0) {
        auto renewed = etcd.LeaseKeepAlive(lease_);
        if (absl::IsNotFound(renewed.status())) lease_ = 0;
        s = absl::IsNotFound(renewed.status()) ? absl::OkStatus() : renewed.status();
      }
      if (s.ok() && lease_ == 0) {
        auto granted = etcd.LeaseGrant(options_.owner_ttl);
        s = granted.status();
        if (granted.ok()) lease_ = *granted;
      }
      if (!s.ok()) {
        if (try_again(s)) continue;
        return s;
      }
      lease_sent = sent;
    }
    TxnRequest txn;
    *txn.add_compare() = NotPresent(keys_.owner());
    *txn.add_success() = Put(keys_.owner(), options_.owner, lease_);
    RangeRequest* other = txn.add_failure()->mutable_request_range();
    other->set_key(keys_.owner());
    auto r = etcd.Txn(txn);
    if (absl::IsNotFound(r.status())) {  // our lease ran out while etcd was away
      lease_ = 0;
      continue;
    }
    if (!r.ok()) {
      if (try_again(r.status())) continue;
      return r.status();
    }
    const auto& kvs = r->responses(0).response_range().kvs();
    // P/owner on our own lease is ours: created by an earlier try whose answer was lost (the
    // client tried the next member), or before a wait that failed.
    int64_t created = r->succeeded() ? r->header().revision() : 0;
    if (!r->succeeded() && !kvs.empty() && lease_ != 0 && kvs[0].lease() == lease_) {
      created = kvs[0].create_revision();
    }
    if (created != 0) {
      owner_revision_ = created;
      if (former_lease != 0) {
        absl::Status waited = WaitOutFormerOwner(former_lease, &lease_sent);
        if (absl::IsNotFound(waited)) {  // our lease, and so our key, ran out meanwhile
          lease_ = 0;
          continue;
        }
        if (!waited.ok()) {
          if (try_again(waited)) continue;
          return waited;
        }
        former_lease = 0;
      }
      const MonoTime until = lease_sent + options_.owner_ttl * (1 - options_.owner_margin);
      if (options_.on_owned) options_.on_owned(lease_sent, until);
      owned_until_ns_ = until.nanos();
      break;
    }
    const std::string owner = kvs.empty() ? std::string("another lockd") : kvs[0].value();
    if (!kvs.empty()) former_lease = kvs[0].lease();
    if (forever && options_.on_standby && owner != said_owner) {
      said_owner = owner;
      options_.on_standby(owner);
    }
    if (forever && !said_standby) {
      said_standby = true;
      Log(absl::StrCat("standing by: etcd prefix ", options_.prefix, " is served by ", owner,
                       "; taking over when its lease ends"));
    }
    if (now_() >= give_up) {
      (void)etcd.LeaseRevoke(lease_);
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd prefix ", options_.prefix, " is served by ", owner, " (", keys_.owner(),
          "); one lockd per prefix (--etcd-standby waits to take over)"));
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  // Renewals from now on, also while the state is read: a large state must not cost the
  // ownership before lockd serves.
  keeper_ = std::thread([this, first = lease_sent + options_.owner_ttl / 3] { KeeperLoop(first); });
  watcher_ = std::thread([this] { WatchLoop(); });

  // The state: snapshot, then the log after it, as of now, once the prefix is ours (a standby
  // may have waited for it for hours). The core gives every lease its full TTL again when it
  // begins to serve (ServerCore::Start).
  const MonoTime now = now_();
  auto sequences_text = Get(etcd, keys_.sequences(), &found);
  if (!sequences_text.ok()) return sequences_text.status();
  if (!found) return absl::DataLossError(absl::StrCat(keys_.sequences(), " is missing"));
  auto sequences = DecodeSequences(keys_.sequences(), *sequences_text);
  if (!sequences.ok()) return sequences.status();
  auto head = Get(etcd, keys_.head(), &found);
  if (!head.ok()) return head.status();
  // "<lsn> <chunks>", or "<lsn> <chunks> <first chunk>" for a snapshot rewritten at the same
  // lsn (its chunks follow the ones it replaced: see WriteSnapshot).
  uint64_t lsn = 0, chunks = 0, first_chunk = 0;
  {
    std::vector<std::string> words = absl::StrSplit(*head, ' ', absl::SkipEmpty());
    if (!found || (words.size() != 2 && words.size() != 3) || !absl::SimpleAtoi(words[0], &lsn) ||
        !absl::SimpleAtoi(words[1], &chunks) || chunks == 0 ||
        (words.size() == 3 && !absl::SimpleAtoi(words[2], &first_chunk)) ||
        first_chunk + chunks > 999999) {
      return absl::DataLossError(absl::StrCat(keys_.head(), " is missing or damaged"));
    }
  }
  auto parts = RangeAll(etcd, keys_.chunk(lsn, first_chunk), keys_.chunk(lsn, first_chunk + chunks));
  if (!parts.ok()) return parts.status();
  if (parts->size() != chunks) {
    return absl::DataLossError(absl::StrCat("snapshot ", lsn, " under ", keys_.chunk_dir(lsn),
                                            " has ", parts->size(), " chunks; the head says ",
                                            chunks));
  }
  std::string snapshot;
  for (const auto& kv : *parts) snapshot += kv.value();
  auto state = DecodeSnapshot(keys_.chunk_dir(lsn), snapshot, lsn, now);
  if (!state.ok()) return state.status();
  snapshot_lsn_ = lsn;
  snapshot_chunks_end_ = first_chunk + chunks;
  snapshot_bytes_ = snapshot.size();
  rewrite_snapshot_ = state->secrets_read_in_clear() > 0;
  auto batches = RangeAll(etcd, keys_.log_dir(), PrefixEnd(keys_.log_dir()));
  if (!batches.ok()) return batches.status();
  uint64_t last = lsn, replayed = 0;
  for (const auto& kv : *batches) {
    if (absl::Status s = ReplayRecordFrames(kv.key(), kv.value(), lsn, &last, &*state, now,
                                            &replayed);
        !s.ok()) {
      return s;
    }
  }
  const FenceToken token_floor = std::max(state->last_token(), sequences->token_hwm);
  const SessionId session_floor = std::max(state->last_session_id(), sequences->session_hwm);
  state->RaiseFloors(token_floor, session_floor);
  next_lsn_ = last + 1;

  // The term: one more than the lockd before ours.
  auto term_text = Get(etcd, keys_.term(), &found);
  if (!term_text.ok()) return term_text.status();
  uint64_t term = 0;
  if (found && !absl::SimpleAtoi(*term_text, &term)) {
    return absl::DataLossError(absl::StrCat(keys_.term(), " is damaged: \"",
                                            absl::CHexEscape(term_text->substr(0, 32)), "\""));
  }
  term_ = term + 1;

  // Reserve above everything restored before anything is issued.
  reserved_ = Sequences{token_floor + options_.reservation_block,
                        session_floor + options_.reservation_block};
  auto reserved = Commit({Put(keys_.sequences(), EncodeSequences(reserved_)),
                          Put(keys_.term(), absl::StrCat(term_))});
  if (!reserved.ok()) return reserved.status();

  summary->push_back(absl::StrCat("serving etcd prefix ", options_.prefix, " on ",
                                  absl::StrJoin(options_.endpoints, ","), " as term ", term_,
                                  " (owner lease ", absl::FormatDuration(options_.owner_ttl), ")"));
  summary->push_back(absl::StrCat("restored ", state->session_count(), " sessions and ",
                                  state->holders().size(), " held locks from etcd (snapshot lsn ",
                                  lsn, ", ", replayed, " records replayed, last lsn ", last, ")"));
  summary->push_back(absl::StrCat("next token above ", token_floor,
                                  ", next session id above ", session_floor));
  writer_ = std::thread([this] { WriterLoop(); });
  prober_ = std::thread([this] { ProbeLoop(); });
  return std::move(*state);
}

EtcdCommitLog::~EtcdCommitLog() {
  *alive_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  stop_keeper_.Notify();
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stopping_ = true;
    if (watch_ != nullptr) watch_->Cancel();
  }
  if (keeper_.joinable()) keeper_.join();
  if (prober_.joinable()) prober_.join();
  if (watcher_.joinable()) watcher_.join();
  // A clean stop hands the prefix over at once instead of after the lease's TTL.
  if (lease_ != 0) (void)etcd_->LeaseRevoke(lease_);
}

CommitLogStats EtcdCommitLog::stats() const {
  CommitLogStats s;
  s.commits = commits_.load();
  s.records = records_.load();
  s.bytes = bytes_.load();
  s.snapshots = snapshots_.load();
  s.reservations = reservations_.load();
  s.last_commit_ns = last_commit_ns_.load();
  s.total_commit_ns = total_commit_ns_.load();
  s.commit_retries = commit_retries_.load();
  s.term = term_;
  return s;
}

void EtcdCommitLog::KeeperLoop(MonoTime first) {
  // Renews the lease on P/owner every third of its TTL (the first time at `first`); each answer
  // moves the ownership deadline to its send time + TTL x (1 - margin). A deadline that passes
  // ends the ownership for good (the writer checks it before every transaction).
  const absl::Duration period = options_.owner_ttl / 3;
  absl::Duration wait = std::max(first - now_(), absl::ZeroDuration());
  while (!stop_keeper_.WaitFor(wait)) {
    const MonoTime sent = now_();
    auto ttl = etcd_->LeaseKeepAlive(lease_);
    // A renewal moves the deadline only while P/owner is still the key this lockd created, on
    // this lease: a lease kept alive no longer backs a key someone deleted or replaced. The
    // key is read after the renewal was sent, so the deadline never runs past a change of it
    // that this read could see.
    if (ttl.ok()) {
      if (absl::Status mine = CheckOwnerKey(); !mine.ok()) {
        if (absl::IsFailedPrecondition(mine)) {
          Pulled(std::string(mine.message()));
          return;
        }
        ttl = mine;
      }
    }
    // After a failure, try again soon: the deadline does not wait.
    wait = ttl.ok() ? period : std::min(period, absl::Milliseconds(250));
    if (ttl.ok()) {
      const MonoTime until = sent + *ttl * (1 - options_.owner_margin);
      if (until.nanos() > owned_until_ns_.load()) {
        // Told before it takes effect: a record of an act under this deadline comes after it.
        if (options_.on_owned) options_.on_owned(sent, until);
        owned_until_ns_ = until.nanos();
      }
      continue;
    }
    const absl::Status why = ttl.status();
    const MonoTime now = now_();
    if (absl::IsNotFound(why) ||
        now >= MonoTime::FromNanos(owned_until_ns_.load())) {
      const absl::Status lost = absl::UnavailableError(absl::StrCat(
          "lost the ownership of etcd prefix ", options_.prefix, ": ", why.message()));
      post_([this, alive = alive_, lost] {
        if (*alive) Fail(lost);
      });
      return;
    }
  }
}

absl::Status EtcdCommitLog::CheckOwnerKey(int64_t* revision) {
  RangeRequest r;
  r.set_key(keys_.owner());
  auto got = etcd_->Range(r);
  if (!got.ok()) return got.status();
  if (revision != nullptr) *revision = got->header().revision();
  const std::string what = absl::StrCat("the ownership of etcd prefix ", options_.prefix,
                                        " was taken away: ", keys_.owner());
  if (got->kvs_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(what, " was deleted"));
  }
  const auto& kv = got->kvs(0);
  if (kv.create_revision() != owner_revision_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " was deleted and is now held by ", kv.value()));
  }
  if (kv.mod_revision() != owner_revision_ || kv.lease() != lease_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " was overwritten (now \"", absl::CHexEscape(kv.value().substr(0, 128)),
                     "\", on lease ", kv.lease(), ", not this lockd's ", lease_, ")"));
  }
  return absl::OkStatus();
}

void EtcdCommitLog::Pulled(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(pulled_mu_);
    if (pulled_) return;
    pulled_why_ = why;
    pulled_ = true;  // under the lock: a reader that sees it set finds the reason
  }
  const absl::Status lost = absl::UnavailableError(why);
  post_([this, alive = alive_, lost] {
    if (*alive) Fail(lost);
  });
}

void EtcdCommitLog::WatchLoop() {
  // From the revision after our creation of P/owner: our own transactions never touch it, so
  // any event on it is someone else's.
  int64_t from = owner_revision_ + 1;
  bool first = true;
  while (!pulled_ && !stop_keeper_.WaitFor(first ? absl::ZeroDuration() : absl::Milliseconds(250))) {
    if (!first) {
      // The stream broke, or the history it needed was compacted: read the key, then watch on
      // from that read.
      int64_t revision = 0;
      absl::Status mine = CheckOwnerKey(&revision);
      if (absl::IsFailedPrecondition(mine)) {
        Pulled(std::string(mine.message()));
        return;
      }
      if (!mine.ok()) continue;
      from = revision + 1;
    }
    first = false;
    auto watch = etcd_->Watch(keys_.owner(), from);
    if (!watch.ok()) continue;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      if (watch_stopping_) return;
      watch_ = watch->get();
    }
    for (;;) {
      auto changes = (*watch)->Next();
      if (!changes.ok()) break;
      for (const auto& e : changes->events) {
        if (e.kv().key() != keys_.owner()) continue;
        Pulled(absl::StrCat(
            "the ownership of etcd prefix ", options_.prefix, " was taken away: ", keys_.owner(),
            e.type() == etcdserverpb::Event::DELETE
                ? " was deleted (by hand, or its lease was revoked)"
                : absl::StrCat(" was overwritten with \"",
                               absl::CHexEscape(e.kv().value().substr(0, 128)), "\"")));
        break;
      }
      if (pulled_) break;
      from = changes->revision + 1;
    }
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_ = nullptr;
  }
}

absl::Status EtcdCommitLog::WaitOutFormerOwner(int64_t former, MonoTime* lease_sent) {
  auto life = etcd_->LeaseTimeToLive(former);
  if (absl::IsNotFound(life.status())) return absl::OkStatus();  // it expired, or was revoked
  // Unknown (etcd failed to say): as long as our own TTL.
  const absl::Duration granted = life.ok() ? life->granted : options_.owner_ttl;
  Log(absl::StrCat("etcd prefix ", options_.prefix, ": ", keys_.owner(),
                   " went away while the lease it was on (", former,
                   ") still lives, so it was deleted by hand and the lockd that held it may still "
                   "think it serves; revoking that lease and waiting ",
                   absl::FormatDuration(granted), " before taking over"));
  if (absl::Status s = etcd_->LeaseRevoke(former); !s.ok() && !absl::IsNotFound(s)) {
    Log(absl::StrCat("could not revoke lease ", former, ": ", s.message()));
  }
  const MonoTime until = now_() + granted;
  for (MonoTime now = now_(); now < until; now = now_()) {
    const MonoTime renew_at = *lease_sent + options_.owner_ttl / 3;
    if (now >= renew_at) {
      auto renewed = etcd_->LeaseKeepAlive(lease_);
      if (!renewed.ok()) return renewed.status();
      *lease_sent = now;
      continue;
    }
    absl::SleepFor(std::min(until, renew_at) - now);
  }
  return absl::OkStatus();
}

void EtcdCommitLog::ProbeLoop() {
  do {
    std::vector<StoreMember> members;
    for (size_t i = 0; i < etcd_->endpoints().size(); ++i) {
      StoreMember m{.endpoint = etcd_->endpoints()[i]};
      auto status = etcd_->MemberStatus(i);
      if (status.ok()) {
        m.reachable = true;
        m.raft_index = status->raftindex();
        m.db_bytes = status->dbsize();
        m.leader = status->leader() != 0 && status->leader() == status->header().member_id();
        for (const std::string& e : status->errors()) absl::StrAppend(&m.error, m.error.empty() ? "" : "; ", e);
      } else {
        m.error = std::string(status.status().message());
      }
      members.push_back(std::move(m));
    }
    std::lock_guard<std::mutex> lock(members_mu_);
    members_ = std::move(members);
  } while (!stop_keeper_.WaitFor(absl::Seconds(1)));
}

void EtcdCommitLog::Enqueue(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void EtcdCommitLog::WriterLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and everything queued is done
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    absl::Status s = writer_fault_.ok() ? job.run() : writer_fault_;
    if (!s.ok() && writer_fault_.ok()) writer_fault_ = s;
    post_([alive = alive_, done = std::move(job.done), s] {
      if (*alive) done(s);
    });
  }
}

absl::StatusOr<int64_t> EtcdCommitLog::Commit(std::vector<RequestOp> ops) {
  TxnRequest txn;
  Compare* mine = txn.add_compare();
  mine->set_key(keys_.owner());
  mine->set_target(Compare::CREATE);
  mine->set_result(Compare::EQUAL);
  mine->set_create_revision(owner_revision_);
  for (auto& op : ops) *txn.add_success() = std::move(op);
  const MonoTime start = now_();
  absl::Status last;
  // etcd without a leader for a moment (an election, a member gone) answers "unavailable" or
  // not at all: the same transaction is sent again, until the ownership deadline. That is safe
  // because every transaction is guarded by P/owner and writes the same values to the same
  // keys (or deletes), so one that committed although its answer was lost changes nothing the
  // second time.
  for (absl::Duration pause = absl::Milliseconds(25);; pause = std::min(2 * pause, absl::Milliseconds(250))) {
    if (stopped_) {
      // Once the log has failed (its replies were answered UNAVAILABLE), nothing queued behind
      // the failure is committed: a record nobody was told about must not appear in the state
      // a successor restores.
      return absl::UnavailableError("the commit log stopped after a fault");
    }
    if (pulled_) return absl::UnavailableError(PulledWhy() + "; nothing more is committed");
    if (now_() >= MonoTime::FromNanos(owned_until_ns_.load())) {
      return absl::UnavailableError(absl::StrCat(
          "the ownership of etcd prefix ", options_.prefix,
          " may have lapsed (no lease renewal answered in time); nothing more is committed",
          last.ok() ? "" : absl::StrCat("; etcd: ", last.message())));
    }
    auto r = etcd_->Txn(txn);
    if (!r.ok()) {
      if (!absl::IsUnavailable(r.status()) && !absl::IsDeadlineExceeded(r.status())) {
        return r.status();
      }
      last = r.status();
      ++commit_retries_;
      absl::SleepFor(pause);
      continue;
    }
    if (!r->succeeded()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd prefix ", options_.prefix, " is no longer this lockd's (", keys_.owner(),
          " changed); nothing more is committed"));
    }
    const int64_t ns = absl::ToInt64Nanoseconds(now_() - start);
    ++commits_;
    last_commit_ns_ = ns;
    total_commit_ns_ += ns;
    if (options_.on_commit) options_.on_commit(ns);
    return r->header().revision();
  }
}

void EtcdCommitLog::ReserveFor(FenceToken token, SessionId session) {
  if (token <= reserved_.token_hwm && session <= reserved_.session_hwm) return;
  reserved_.token_hwm = std::max(reserved_.token_hwm, token + options_.reservation_block);
  reserved_.session_hwm = std::max(reserved_.session_hwm, session + options_.reservation_block);
  std::string bytes = EncodeSequences(reserved_);
  Enqueue(Job{[this, bytes] {
                ++reservations_;
                return Commit({Put(keys_.sequences(), bytes)}).status();
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
  auto frames = std::make_shared<std::string>(std::move(pending_));
  auto ends = std::make_shared<std::vector<size_t>>(std::move(pending_ends_));
  auto lsns = std::make_shared<std::vector<uint64_t>>(std::move(pending_lsns_));
  pending_.clear();
  pending_ends_.clear();
  pending_lsns_.clear();
  logged_since_snapshot_ += frames->size();
  ++in_flight_;
  Enqueue(Job{[this, frames, ends, lsns] { return WriteBatch(*frames, *ends, *lsns); },
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

absl::Status EtcdCommitLog::WriteBatch(const std::string& frames, const std::vector<size_t>& ends,
                                       const std::vector<uint64_t>& lsns) {
  // Keys of at most max_value_bytes, each named by its last record, all in one transaction
  // when they fit one request, else in order over several.
  std::vector<RequestOp> ops;
  size_t ops_bytes = 0, start = 0;
  for (size_t i = 0; i < ends.size(); ++i) {
    const bool last = i + 1 == ends.size();
    if (!last && ends[i + 1] - start <= options_.max_value_bytes) continue;
    const size_t end = ends[i];
    if (!ops.empty() && ops_bytes + (end - start) > options_.max_value_bytes) {
      if (auto r = Commit(std::move(ops)); !r.ok()) return r.status();
      ops.clear();
      ops_bytes = 0;
    }
    ops.push_back(Put(keys_.log(lsns[i]), frames.substr(start, end - start)));
    ops_bytes += end - start;
    start = end;
  }
  if (!ops.empty()) {
    if (auto r = Commit(std::move(ops)); !r.ok()) return r.status();
  }
  records_ += lsns.size();
  bytes_ += frames.size();
  return absl::OkStatus();
}

void EtcdCommitLog::Snapshot(const StateMachine& state) {
  if (!pending_.empty() && fault_.ok()) SendPending();
  const uint64_t lsn = last_lsn();
  auto bytes = std::make_shared<std::string>(EncodeSnapshot(state, lsn));
  snapshot_bytes_ = bytes->size();
  logged_since_snapshot_ = 0;
  Enqueue(Job{[this, bytes, lsn] { return WriteSnapshot(*bytes, lsn); },
              [this](const absl::Status& s) {
                snapshot_asked_ = false;
                OnJobDone(s);
              }});
}

absl::Status EtcdCommitLog::WriteSnapshot(const std::string& bytes, uint64_t lsn) {
  // The snapshot in force is rewritten only when it held secrets in clear (an older lockd's).
  if (lsn == snapshot_lsn_ && !rewrite_snapshot_) return absl::OkStatus();
  rewrite_snapshot_ = false;
  // The chunks first (invisible until the head names them), then in one transaction: the head,
  // and the deletion of the log it covers and of the older snapshots. A snapshot rewritten at
  // the lsn in force puts its chunks after the ones it replaces, which stay whole until the
  // head moves past them, and then go with it.
  const uint64_t first = lsn == snapshot_lsn_ ? snapshot_chunks_end_ : 0;
  uint64_t chunks = 0;
  for (size_t at = 0; at < bytes.size() || chunks == 0; at += options_.max_value_bytes) {
    auto r = Commit(
        {Put(keys_.chunk(lsn, first + chunks++), bytes.substr(at, options_.max_value_bytes))});
    if (!r.ok()) return r.status();
  }
  std::vector<RequestOp> head = {
      Put(keys_.head(), first == 0 ? absl::StrCat(lsn, " ", chunks)
                                   : absl::StrCat(lsn, " ", chunks, " ", first)),
      DeleteRange(keys_.log_dir(), keys_.log(lsn + 1)),
      DeleteRange(keys_.snapshots(), keys_.chunk_dir(lsn))};
  if (first > 0) head.push_back(DeleteRange(keys_.chunk(lsn, 0), keys_.chunk(lsn, first)));
  auto revision = Commit(std::move(head));
  if (!revision.ok()) return revision.status();
  snapshot_lsn_ = lsn;
  snapshot_chunks_end_ = first + chunks;
  ++snapshots_;
  // etcd keeps every old value until its history is compacted: drop what the snapshot made
  // redundant, so that its database stays small.
  if (absl::Status s = etcd_->Compact(*revision); !s.ok()) {
    Log(absl::StrCat("could not compact etcd's history (", s.message(), "); will retry"));
  }
  return absl::OkStatus();
}

void EtcdCommitLog::OnJobDone(const absl::Status& s) {
  if (!s.ok()) Fail(s);
}

void EtcdCommitLog::Fail(const absl::Status& s) {
  if (!fault_.ok()) return;
  fault_ = s;
  stopped_ = true;
  Log(absl::StrCat("commit fault, no longer accepting mutations: ", s.ToString()));
  if (listener_ != nullptr) listener_->OnCommitFault(fault_);
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
  // Nothing may be under the prefix yet: never mix with another lockd's (or anyone's) keys.
  RangeRequest any;
  any.set_key(options.prefix + "/");
  any.set_range_end(PrefixEnd(options.prefix + "/"));
  any.set_count_only(true);
  auto existing = etcd.Range(any);
  if (!existing.ok()) return existing.status();
  if (existing->count() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "etcd prefix ", options.prefix, " already holds ", existing->count(),
        " keys; lockd init needs an empty prefix"));
  }
  StateMachine empty;
  TxnRequest txn;
  *txn.add_compare() = NotPresent(keys.format());
  *txn.add_success() = Put(keys.format(), kEtcdFormat);
  *txn.add_success() = Put(keys.sequences(), EncodeSequences({}));
  *txn.add_success() = Put(keys.chunk(0, 0), EncodeSnapshot(empty, 0));
  *txn.add_success() = Put(keys.head(), "0 1");
  auto r = etcd.Txn(txn);
  if (!r.ok()) return r.status();
  if (!r->succeeded()) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd prefix ", options.prefix, " was initialized meanwhile"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> EtcdCommitLog::DeleteEverything() {
  RangeRequest count;
  count.set_key(options_.prefix + "/");
  count.set_range_end(PrefixEnd(options_.prefix + "/"));
  count.set_count_only(true);
  auto before = etcd_->Range(count);
  if (!before.ok()) return before.status();
  std::promise<absl::Status> done;
  Enqueue(Job{[&] {
                absl::Status s =
                    Commit({DeleteRange(options_.prefix + "/", PrefixEnd(options_.prefix + "/"))})
                        .status();
                done.set_value(s);
                return s;
              },
              [](const absl::Status&) {}});
  if (absl::Status s = done.get_future().get(); !s.ok()) return s;
  return before->count();
}

absl::StatusOr<EtcdDestroyOutcome> DestroyEtcdPrefixOn(
    const EtcdCommitLogOptions& options, std::unique_ptr<EtcdClient> etcd,
    const std::function<std::vector<std::string>(const StateMachine&)>& held) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  // Once the keys are gone, the log's watch sees its own P/owner go: that is no news.
  auto deleted = std::make_shared<std::atomic<bool>>(false);
  EtcdCommitLogOptions o = options;
  o.endpoints = etcd->endpoints();
  o.log = [deleted, log = options.log](const std::string& line) {
    if (deleted->load()) return;
    if (log) {
      log(line);
    } else {
      logging::Lockd().Warning(line);
    }
  };
  auto log = std::make_unique<EtcdCommitLog>(o, std::move(etcd), [](std::function<void()>) {});
  std::vector<std::string> summary;
  auto state = log->Start(&summary);
  if (!state.ok()) return state.status();
  EtcdDestroyOutcome out;
  out.held = held(*state);
  if (!out.held.empty()) return out;
  deleted->store(true);
  auto count = log->DeleteEverything();
  if (!count.ok()) {
    deleted->store(false);
    return count.status();
  }
  out.deleted = *count;
  return out;
}

absl::StatusOr<OpenedCommitLog> OpenEtcdCommitLogOn(const EtcdCommitLogOptions& options,
                                                    std::unique_ptr<EtcdClient> etcd,
                                                    PostToOwner post) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  EtcdCommitLogOptions o = options;
  o.endpoints = etcd->endpoints();  // for Describe()
  auto log = std::make_unique<EtcdCommitLog>(o, std::move(etcd), std::move(post));
  OpenedCommitLog opened;
  auto state = log->Start(&opened.summary);
  if (!state.ok()) return state.status();
  opened.state = std::move(*state);
  opened.log = std::move(log);
  return opened;
}

}  // namespace fencelock::server
