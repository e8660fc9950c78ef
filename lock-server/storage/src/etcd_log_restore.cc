// EtcdCommitLog's start (etcd_log.h): the format, the ownership, then the state as of then,
// the snapshot and the log after it, and the term.
#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "etcd_log.h"

namespace fencelock::server::etcd_log {

using etcd_keys::PrefixEnd;
using etcd_keys::Put;
using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;

void EtcdCommitLog::Read(RangeRequest r, std::function<void(absl::StatusOr<RangeResponse>)> reply,
                        absl::Duration pause) {
  Ask<absl::StatusOr<RangeResponse>>(
      [r](EtcdClient& c) { return c.Range(r); },
      [this, r, pause, reply = std::move(reply)](absl::StatusOr<RangeResponse> got) mutable {
        // Before the ownership: as long as the ownership would wait; after it, while it holds.
        const MonoTime now = time_->Now();
        const bool retry = restoring_ ? ownership_->HoldsAt(now) : now < read_until_;
        if (got.ok() || !IsTransient(got.status()) || !retry) {
          return reply(std::move(got));
        }
        ++stats_.commit_retries;
        read_timer_->ArmAt(time_->Now() + pause,
                           [this, r = std::move(r), pause, reply = std::move(reply)]() mutable {
                             Read(std::move(r), std::move(reply),
                                  std::min(2 * pause, absl::Milliseconds(250)));
                           });
      });
}

void EtcdCommitLog::Get(const std::string& key,
                        std::function<void(absl::StatusOr<std::optional<std::string>>)> reply) {
  RangeRequest r;
  r.set_key(key);
  Read(std::move(r),
      [reply = std::move(reply)](absl::StatusOr<RangeResponse> got) {
        if (!got.ok()) return reply(got.status());
        if (got->kvs_size() == 0) return reply(std::optional<std::string>());
        reply(std::optional<std::string>(std::move(*got->mutable_kvs(0)->mutable_value())));
      });
}

void EtcdCommitLog::RangeAll(
    std::string key, std::string end,
    std::function<void(absl::StatusOr<std::vector<etcdserverpb::KeyValue>>)> reply,
    std::vector<etcdserverpb::KeyValue> so_far) {
  RangeRequest r;
  r.set_key(key);
  r.set_range_end(end);
  r.set_limit(16);
  r.set_sort_order(RangeRequest::ASCEND);
  r.set_sort_target(RangeRequest::KEY);
  auto out = std::make_shared<std::vector<etcdserverpb::KeyValue>>(std::move(so_far));
  Read(std::move(r),
      [this, end = std::move(end), out, reply = std::move(reply)](
          absl::StatusOr<RangeResponse> got) mutable {
        if (!got.ok()) return reply(got.status());
        for (auto& kv : *got->mutable_kvs()) out->push_back(std::move(kv));
        if (!got->more() || got->kvs_size() == 0) return reply(std::move(*out));
        std::string from = out->back().key() + std::string(1, '\0');
        RangeAll(std::move(from), std::move(end), std::move(reply), std::move(*out));
      });
}

void EtcdCommitLog::Start(Started started) {
  started_ = std::move(started);
  read_until_ = options_.owner_wait == absl::InfiniteDuration()
                    ? MonoTime::Max()
                    : time_->Now() + options_.owner_wait;
  Get(keys_.format(), [this](absl::StatusOr<std::optional<std::string>> format) {
    if (!format.ok()) return FinishStart(format.status());
    if (!format->has_value()) {
      return FinishStart(absl::NotFoundError(absl::StrCat(
          "etcd prefix ", options_.prefix, " holds no lockd state; run lockd init --etcd=",
          absl::StrJoin(etcd_->endpoints(), ","), " --etcd-prefix=", options_.prefix,
          " first")));
    }
    if (**format != kEtcdFormat) {
      return FinishStart(absl::FailedPreconditionError(
          absl::StrCat(keys_.format(), " is not a lockd state this lockd can read: \"",
                       absl::CHexEscape((*format)->substr(0, 64)), "\"")));
    }
    CheckNotNested(etcd_keys::Ancestors(options_.prefix), [this](absl::Status alone) {
      if (!alone.ok()) return FinishStart(alone);
      // Ownership: P/owner on a lease of ours, waiting out a dead owner's lease. Renewals go
      // on from then, also while the state is read: a large state must not cost the ownership
      // before lockd serves.
      ownership_->Take(
          [this](absl::Status taken) {
            if (!taken.ok()) return FinishStart(taken);
            Restore();
          },
          [this](absl::Status lost) { Fail(lost); });
    });
  });
}

void EtcdCommitLog::CheckNotNested(std::vector<std::string> around,
                                   std::function<void(absl::Status)> done) {
  if (!around.empty()) {
    const std::string outer = around.front();
    around.erase(around.begin());
    return Get(etcd_keys::Keys(outer).format(),
               [this, outer, around = std::move(around), done = std::move(done)](
                   absl::StatusOr<std::optional<std::string>> format) mutable {
                 // Beyond this user's role: not this lockd's to check (see InitEtcdPrefixOn).
                 if (absl::IsPermissionDenied(format.status())) {
                   return CheckNotNested(std::move(around), std::move(done));
                 }
                 if (!format.ok()) return done(format.status());
                 if (format->has_value()) {
                   return done(absl::FailedPreconditionError(
                       etcd_keys::Nested(outer, options_.prefix)));
                 }
                 CheckNotNested(std::move(around), std::move(done));
               });
  }
  ListKeys(options_.prefix + "/", PrefixEnd(options_.prefix + "/"),
           [this, done = std::move(done)](absl::StatusOr<std::vector<std::string>> keys) {
             if (!keys.ok()) return done(keys.status());
             for (const std::string& key : *keys) {
               if (etcd_keys::IsNestedFormat(options_.prefix, key)) {
                 return done(absl::FailedPreconditionError(
                     etcd_keys::Nested(options_.prefix, etcd_keys::StateOf(key))));
               }
             }
             done(absl::OkStatus());
           });
}

void EtcdCommitLog::ListKeys(std::string key, std::string end,
                             std::function<void(absl::StatusOr<std::vector<std::string>>)> reply,
                             std::vector<std::string> so_far) {
  RangeRequest r;
  r.set_key(key);
  r.set_range_end(end);
  r.set_keys_only(true);
  r.set_limit(1000);
  r.set_sort_order(RangeRequest::ASCEND);
  r.set_sort_target(RangeRequest::KEY);
  Read(std::move(r),
       [this, end = std::move(end), so_far = std::move(so_far), reply = std::move(reply)](
           absl::StatusOr<RangeResponse> got) mutable {
         if (!got.ok()) return reply(got.status());
         for (auto& kv : *got->mutable_kvs()) so_far.push_back(std::move(*kv.mutable_key()));
         if (!got->more() || got->kvs_size() == 0) return reply(std::move(so_far));
         std::string from = so_far.back() + std::string(1, '\0');
         ListKeys(std::move(from), std::move(end), std::move(reply), std::move(so_far));
       });
}

void EtcdCommitLog::Restore() {
  // The state: snapshot, then the log after it, as of now, once the prefix is ours (a standby
  // may have waited for it for hours). The core gives every lease its full TTL again when it
  // begins to serve (ServerCore::Start).
  restoring_ = std::make_unique<Restoring>();
  restoring_->now = time_->Now();
  Get(keys_.sequences(), [this](absl::StatusOr<std::optional<std::string>> text) {
    if (!text.ok()) return FinishStart(text.status());
    if (!text->has_value()) {
      return FinishStart(absl::DataLossError(absl::StrCat(keys_.sequences(), " is missing")));
    }
    auto sequences = DecodeSequences(keys_.sequences(), **text);
    if (!sequences.ok()) return FinishStart(sequences.status());
    restoring_->sequences = *sequences;
    Get(keys_.head(), [this](absl::StatusOr<std::optional<std::string>> head) {
      if (!head.ok()) return FinishStart(head.status());
      RestoreSnapshot(head->value_or(""));
    });
  });
}

void EtcdCommitLog::RestoreSnapshot(std::string head) {
  // "<lsn> <chunks>", or "<lsn> <chunks> <first chunk>" for a snapshot rewritten at the same
  // lsn (its chunks follow the ones it replaced: see WriteSnapshot).
  Restoring& r = *restoring_;
  std::vector<std::string> words = absl::StrSplit(head, ' ', absl::SkipEmpty());
  if ((words.size() != 2 && words.size() != 3) || !absl::SimpleAtoi(words[0], &r.lsn) ||
      !absl::SimpleAtoi(words[1], &r.chunks) || r.chunks == 0 ||
      (words.size() == 3 && !absl::SimpleAtoi(words[2], &r.first_chunk)) ||
      r.first_chunk + r.chunks > 999999) {
    return FinishStart(absl::DataLossError(absl::StrCat(keys_.head(), " is missing or damaged")));
  }
  RangeAll(keys_.chunk(r.lsn, r.first_chunk), keys_.chunk(r.lsn, r.first_chunk + r.chunks),
           [this](absl::StatusOr<std::vector<etcdserverpb::KeyValue>> parts) {
             if (!parts.ok()) return FinishStart(parts.status());
             Restoring& r = *restoring_;
             if (parts->size() != r.chunks) {
               return FinishStart(absl::DataLossError(
                   absl::StrCat("snapshot ", r.lsn, " under ", keys_.chunk_dir(r.lsn), " has ",
                                parts->size(), " chunks; the head says ", r.chunks)));
             }
             std::string snapshot;
             for (const auto& kv : *parts) snapshot += kv.value();
             RestoreLog(std::move(snapshot));
           });
}

void EtcdCommitLog::RestoreLog(std::string snapshot) {
  Restoring& r = *restoring_;
  auto state = DecodeSnapshot(keys_.chunk_dir(r.lsn), snapshot, r.lsn, r.now);
  if (!state.ok()) return FinishStart(state.status());
  r.state = std::move(*state);
  snapshot_lsn_ = r.lsn;
  snapshot_chunks_end_ = r.first_chunk + r.chunks;
  snapshot_bytes_ = snapshot.size();
  rewrite_snapshot_ = r.state->secrets_read_in_clear() > 0;
  RangeAll(keys_.log_dir(), PrefixEnd(keys_.log_dir()),
           [this](absl::StatusOr<std::vector<etcdserverpb::KeyValue>> batches) {
             if (!batches.ok()) return FinishStart(batches.status());
             Restoring& r = *restoring_;
             r.last = r.lsn;
             for (const auto& kv : *batches) {
               if (absl::Status s = ReplayRecordFrames(kv.key(), kv.value(), r.lsn, &r.last,
                                                       &*r.state, r.now, &r.replayed);
                   !s.ok()) {
                 return FinishStart(s);
               }
             }
             RestoreTerm();
           });
}

void EtcdCommitLog::RestoreTerm() {
  Restoring& r = *restoring_;
  const FenceToken token_floor = std::max(r.state->last_token(), r.sequences.token_hwm);
  const SessionId session_floor = std::max(r.state->last_session_id(), r.sequences.session_hwm);
  if (absl::Status s = r.state->RaiseFloors(token_floor, session_floor); !s.ok()) {
    return FinishStart(
        absl::DataLossError(absl::StrCat("etcd prefix ", options_.prefix, ": ", s.message())));
  }
  next_lsn_ = r.last + 1;
  r.summary.push_back(absl::StrCat("restored ", r.state->session_count(), " sessions and ",
                                   r.state->held_lock_count(),
                                   " held locks from etcd (snapshot lsn ", r.lsn, ", ", r.replayed,
                                   " records replayed, last lsn ", r.last, ")"));
  r.summary.push_back(absl::StrCat("next token above ", token_floor, ", next session id above ",
                                   session_floor));
  // Reserve above everything restored before anything is issued.
  reserved_ = Sequences{token_floor + options_.reservation_block,
                        session_floor + options_.reservation_block};
  // The term: one more than the lockd before ours.
  Get(keys_.term(), [this](absl::StatusOr<std::optional<std::string>> text) {
    if (!text.ok()) return FinishStart(text.status());
    uint64_t term = 0;
    if (text->has_value() && !absl::SimpleAtoi(**text, &term)) {
      return FinishStart(absl::DataLossError(absl::StrCat(
          keys_.term(), " is damaged: \"", absl::CHexEscape((*text)->substr(0, 32)), "\"")));
    }
    term_ = term + 1;
    Commit({Put(keys_.sequences(), EncodeSequences(reserved_)),
            Put(keys_.term(), absl::StrCat(term_))},
           [this](absl::StatusOr<int64_t> reserved) { FinishStart(reserved.status()); });
  });
}

void EtcdCommitLog::FinishStart(absl::Status s) {
  if (!started_) return;
  Started started = std::move(started_);
  started_ = nullptr;
  std::unique_ptr<Restoring> r = std::move(restoring_);
  if (!s.ok()) {
    // Taken and lost again before it served (an etcd election as it restored): kAborted, which
    // a standby answers by standing by again.
    if (!fault_.ok()) {
      s = absl::AbortedError(absl::StrCat("the ownership of etcd prefix ", options_.prefix,
                                          " ended before this lockd began to serve it: ",
                                          fault_.message()));
    }
    Later([started, s] { started(s, {}); });
    return;
  }
  std::vector<std::string> summary = {absl::StrCat(
      "serving etcd prefix ", options_.prefix, " on ", absl::StrJoin(etcd_->endpoints(), ","),
      " as term ", term_, " (owner lease ", absl::FormatDuration(options_.owner_ttl), ")")};
  summary.insert(summary.end(), r->summary.begin(), r->summary.end());
  if (options_.member_probe > absl::ZeroDuration()) Probe();
  auto state = std::make_shared<StateMachine>(std::move(*r->state));
  Later([this, started, state, summary] {
    // The ownership may have ended between here and there (lockd stalled): it never begins to
    // serve then, and a successor has the state.
    if (!fault_.ok() || !ownership_->HoldsAt(time_->Now())) {
      return started(absl::AbortedError(absl::StrCat(
                         "the ownership of etcd prefix ", options_.prefix,
                         " ended before this lockd began to serve it")),
                     {});
    }
    started(std::move(*state), summary);
  });
}

}  // namespace fencelock::server::etcd_log
