#include "etcd_ownership.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "logging/logging.h"

namespace fencelock::server {
namespace {

using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;

// How soon a step that failed, or a standby's next look at P/owner, comes.
constexpr absl::Duration kRetry = absl::Milliseconds(250);

// Marks a Status as TakenAway(): a distinct signal, not a message to match.
constexpr char kTakenAwayPayload[] = "fencelock.dev/ownership-taken-away";

}  // namespace

absl::Status TakenAway(absl::Status why) {
  why.SetPayload(kTakenAwayPayload, absl::Cord("1"));
  return why;
}

bool OwnershipTakenAway(const absl::Status& fault) {
  return fault.GetPayload(kTakenAwayPayload).has_value();
}

EtcdOwnership::EtcdOwnership(EtcdOwnershipOptions options, TimeSource* time, EtcdCalls* etcd)
    : options_(std::move(options)),
      keys_(options_.prefix),
      time_(time),
      etcd_(etcd),
      forever_(options_.wait == absl::InfiniteDuration()),
      step_timer_(time->NewTimer()),
      deadline_timer_(time->NewTimer()),
      watch_timer_(time->NewTimer()) {}

EtcdOwnership::~EtcdOwnership() {
  *alive_ = false;
  watch_.reset();
  if (lease_ != 0) {
    etcd_->Submit([lease = lease_](EtcdClient& c) {
      (void)c.LeaseRevoke(lease);
      return std::function<void()>([] {});
    });
  }
}

void EtcdOwnership::Log(const std::string& line) {
  if (options_.log) {
    options_.log(line);
  } else {
    logging::Lockd().Warning(line);
  }
}

void EtcdOwnership::Take(std::function<void(absl::Status)> taken,
                         std::function<void(absl::Status)> lost) {
  taken_ = std::move(taken);
  lost_ = std::move(lost);
  state_ = State::kTaking;
  give_up_ = forever_ ? MonoTime::Max() : time_->Now() + options_.wait;
  hold_off_until_ = time_->Now() + options_.hold_off;
  if (options_.hold_off > absl::ZeroDuration()) {
    Log(absl::StrCat("standing by: not taking etcd prefix ", options_.prefix, " for ",
                     absl::FormatDuration(options_.hold_off),
                     " (its ownership was taken from this lockd: the replicas standing by take "
                     "over first)"));
  }
  StepTaking();
}

void EtcdOwnership::StepTaking() {
  if (state_ != State::kTaking) return;
  if (time_->Now() < hold_off_until_) {
    step_timer_->ArmAt(hold_off_until_, [this] { StepTaking(); });
    return;
  }
  if (lease_ == 0 || time_->Now() - lease_sent_ >= options_.ttl / 3) {
    RenewForTaking();
  } else {
    TryCreate();
  }
}

void EtcdOwnership::RenewForTaking() {
  // Our own lease, made before the create and kept alive while we wait: renewed every third of
  // its TTL, or taken anew if it ran out. The ownership counts from the send time of the
  // lease's last grant or renewal.
  const MonoTime sent = time_->Now();
  auto granted = [this, sent](absl::StatusOr<int64_t> id) {
    if (state_ != State::kTaking) return;
    if (!id.ok()) return TakingFailed(id.status());
    lease_ = *id;
    lease_sent_ = sent;
    TryCreate();
  };
  if (lease_ == 0) {
    Ask<absl::StatusOr<int64_t>>(
        [ttl = options_.ttl](EtcdClient& c) { return c.LeaseGrant(ttl); }, granted);
    return;
  }
  Ask<absl::StatusOr<absl::Duration>>(
      [lease = lease_](EtcdClient& c) { return c.LeaseKeepAlive(lease); },
      [this, sent](absl::StatusOr<absl::Duration> renewed) {
        if (state_ != State::kTaking) return;
        if (absl::IsNotFound(renewed.status())) {  // it ran out: a new one
          lease_ = 0;
          return RenewForTaking();
        }
        if (!renewed.ok()) return TakingFailed(renewed.status());
        lease_sent_ = sent;
        TryCreate();
      });
}

void EtcdOwnership::TakingFailed(const absl::Status& s) {
  // A member that timed out or an election under way is tried again until the wait ends: a
  // standby forever, a lockd that starts as owner for its --etcd-owner-ttl plus 2 s. So is an
  // etcd out of space (its NOSPACE alarm refuses every write, the ownership's first): nothing
  // can be served until an operator frees space and disarms the alarm, and then a standby
  // should take over by itself.
  const bool no_space = absl::IsResourceExhausted(s);
  if ((!IsTransient(s) && !no_space) || time_->Now() >= give_up_) return Finish(s);
  if (said_unreachable_ != s.message()) {
    said_unreachable_ = std::string(s.message());
    const std::string doing =
        forever_ ? "standing by" : absl::StrCat("taking etcd prefix ", options_.prefix);
    Log(absl::StrCat(doing, ": ", s.message(),
                     no_space ? " (etcd is out of space: its NOSPACE alarm refuses writes until "
                                "an operator compacts and defragments it and runs `etcdctl "
                                "alarm disarm`)"
                              : "",
                     "; trying again"));
  }
  step_timer_->ArmAt(time_->Now() + kRetry, [this] { StepTaking(); });
}

void EtcdOwnership::TryCreate() {
  TxnRequest txn;
  *txn.add_compare() = etcd_keys::NotPresent(keys_.owner());
  // P/owner-lease is read before the put: the lease of whoever held P/owner last.
  txn.add_success()->mutable_request_range()->set_key(keys_.owner_lease());
  *txn.add_success() = etcd_keys::Put(keys_.owner(), options_.owner, lease_);
  txn.add_failure()->mutable_request_range()->set_key(keys_.owner());
  Ask<absl::StatusOr<TxnResponse>>(
      [txn = std::move(txn)](EtcdClient& c) { return c.Txn(txn); },
      [this](absl::StatusOr<TxnResponse> r) {
        if (state_ != State::kTaking) return;
        if (absl::IsNotFound(r.status())) {  // our lease ran out while etcd was away
          lease_ = 0;
          return StepTaking();
        }
        if (!r.ok()) return TakingFailed(r.status());
        const auto& kvs = r->responses(0).response_range().kvs();
        if (r->succeeded()) {
          revision_ = r->header().revision();
          recorded_former_ = RecordedLease(kvs);
          return Created();
        }
        // P/owner on our own lease is ours: created by an earlier try whose answer was lost
        // (the client tried the next member), or before a wait that failed. What P/owner-lease
        // said then, it still says: we record ours only once we own.
        if (!kvs.empty() && kvs[0].lease() == lease_) {
          revision_ = kvs[0].create_revision();
          RangeRequest read;
          read.set_key(keys_.owner_lease());
          Ask<absl::StatusOr<RangeResponse>>(
              [read = std::move(read)](EtcdClient& c) { return c.Range(read); },
              [this](absl::StatusOr<RangeResponse> got) {
                if (state_ != State::kTaking) return;
                if (!got.ok()) return TakingFailed(got.status());
                recorded_former_ = RecordedLease(got->kvs());
                Created();
              });
          return;
        }
        const std::string owner = kvs.empty() ? std::string("another lockd") : kvs[0].value();
        if (!kvs.empty()) former_lease_ = kvs[0].lease();
        if (forever_ && options_.on_standby && owner != said_owner_) {
          said_owner_ = owner;
          options_.on_standby(owner);
        }
        if (forever_ && !said_standby_) {
          said_standby_ = true;
          Log(absl::StrCat("standing by: etcd prefix ", options_.prefix, " is served by ", owner,
                           "; taking over when its lease ends"));
        }
        if (time_->Now() >= give_up_) {
          return Finish(absl::FailedPreconditionError(absl::StrCat(
              "etcd prefix ", options_.prefix, " is served by ", owner, " (", keys_.owner(),
              "); one lockd per prefix (--etcd-standby waits to take over)")));
        }
        step_timer_->ArmAt(time_->Now() + kRetry, [this] { StepTaking(); });
      });
}

int64_t EtcdOwnership::RecordedLease(
    const google::protobuf::RepeatedPtrField<etcdserverpb::KeyValue>& kvs) const {
  int64_t lease = 0;
  if (kvs.empty() || !absl::SimpleAtoi(kvs[0].value(), &lease) || lease == lease_) return 0;
  return lease;
}

void EtcdOwnership::Created() {
  // The former owner: the one P/owner-lease names, else the last one we saw.
  if (recorded_former_ != 0) former_lease_ = recorded_former_;
  if (former_lease_ == lease_) former_lease_ = 0;
  if (former_lease_ != 0) return WaitOutFormerOwner();
  Record();
}

void EtcdOwnership::Record() {
  TxnRequest txn;
  *txn.add_compare() = etcd_keys::CreatedAt(keys_.owner(), revision_);
  *txn.add_success() = etcd_keys::Put(keys_.owner_lease(), absl::StrCat(lease_));
  Ask<absl::StatusOr<TxnResponse>>(
      [txn = std::move(txn)](EtcdClient& c) { return c.Txn(txn); },
      [this](absl::StatusOr<TxnResponse> r) {
        if (state_ != State::kTaking) return;
        if (!r.ok()) return TakingFailed(r.status());  // and from the top: our key is found
        if (!r->succeeded()) {
          // Our P/owner went away while we waited (deleted, or our lease ran out): again.
          revision_ = 0;
          return StepTaking();
        }
        Confirm();
      });
}

void EtcdOwnership::Confirm() {
  // The deadline counts from the send of the lease's last renewal, which may be most of the
  // deadline ago by now: a third of the TTL before the create, then four round trips to etcd
  // (two of them writes) while it answers slowly. A lockd that began to serve with that little
  // left lapsed before its first answer (CI, stop 51: term 2 refused a Resume 50 ms after it
  // served). Renew once more, as Renew() does, and own from this send.
  RenewAndReadOwner(State::kTaking, [this](MonoTime sent, absl::StatusOr<absl::Duration> renewed,
                                           const absl::Status& owner_key) {
    if (absl::IsNotFound(renewed.status())) {  // our lease, and so our key, ran out
      lease_ = 0;
      revision_ = 0;
      return StepTaking();
    }
    if (!renewed.ok()) return TakingFailed(renewed.status());  // our key is found again
    if (absl::IsFailedPrecondition(owner_key)) {
      revision_ = 0;  // deleted or replaced since the record: from the top
      return StepTaking();
    }
    if (!owner_key.ok()) return TakingFailed(owner_key);
    lease_sent_ = sent;
    Owned();
  });
}

void EtcdOwnership::WaitOutFormerOwner() {
  // P/owner went away while the lease it was on still lives: someone deleted the key by hand,
  // and its lockd may still think it serves. Revoke that lease (its lockd's next renewal fails)
  // and wait its whole TTL, renewing ours: by then that lockd's own deadline has passed.
  Ask<absl::StatusOr<EtcdClient::LeaseLife>>(
      [former = former_lease_](EtcdClient& c) { return c.LeaseTimeToLive(former); },
      [this](absl::StatusOr<EtcdClient::LeaseLife> life) {
        if (state_ != State::kTaking) return;
        if (absl::IsNotFound(life.status())) {  // it expired, or was revoked
          // Revoked by this lockd, before the take started over: the wait still holds (the
          // simulator's seed 24978, 3 replicas: an election failed a renewal during the
          // wait, and the replica whose key was deleted confirmed a token after the new one
          // served).
          if (revoked_former_ == former_lease_ && time_->Now() < wait_until_) return WaitStep();
          former_lease_ = 0;
          return Record();
        }
        // Unknown (etcd failed to say): as long as our own TTL.
        const absl::Duration granted = life.ok() ? life->granted : options_.ttl;
        Log(absl::StrCat("etcd prefix ", options_.prefix, ": ", keys_.owner(),
                         " went away while the lease it was on (", former_lease_,
                         ") still lives, so it was deleted by hand and the lockd that held it may "
                         "still think it serves; revoking that lease and waiting ",
                         absl::FormatDuration(granted), " before taking over"));
        Ask<absl::Status>(
            [former = former_lease_](EtcdClient& c) { return c.LeaseRevoke(former); },
            [this, former = former_lease_](absl::Status s) {
              if (!s.ok() && !absl::IsNotFound(s)) {
                Log(absl::StrCat("could not revoke lease ", former, ": ", s.message()));
              }
            });
        wait_until_ = time_->Now() + granted;
        revoked_former_ = former_lease_;
        WaitStep();
      });
}

void EtcdOwnership::WaitStep() {
  if (state_ != State::kTaking) return;
  const MonoTime now = time_->Now();
  if (now >= wait_until_) {
    former_lease_ = 0;
    return Record();
  }
  const MonoTime renew_at = lease_sent_ + options_.ttl / 3;
  if (now < renew_at) {
    step_timer_->ArmAt(std::min(wait_until_, renew_at), [this] { WaitStep(); });
    return;
  }
  Ask<absl::StatusOr<absl::Duration>>(
      [lease = lease_](EtcdClient& c) { return c.LeaseKeepAlive(lease); },
      [this, sent = now](absl::StatusOr<absl::Duration> renewed) {
        if (state_ != State::kTaking) return;
        if (absl::IsNotFound(renewed.status())) {  // our lease, and so our key, ran out
          lease_ = 0;
          return StepTaking();
        }
        // Anything else starts over: our key is still ours, and the former lease, revoked, is
        // found gone at once.
        if (!renewed.ok()) return TakingFailed(renewed.status());
        lease_sent_ = sent;
        WaitStep();
      });
}

void EtcdOwnership::Owned() {
  const MonoTime until = lease_sent_ + options_.ttl * (1 - options_.margin);
  // Told before it takes effect: a record of an act under this deadline comes after it.
  if (options_.on_owned) options_.on_owned(lease_sent_, until);
  until_ = until;
  state_ = State::kOwned;
  deadline_timer_->ArmAt(until_, [this] { (void)HoldsAt(time_->Now()); });
  step_timer_->ArmAt(lease_sent_ + options_.ttl / 3, [this] { Renew(); });
  // From the revision after our creation of P/owner: our own transactions never touch it, so
  // any event on it is someone else's.
  Watch(revision_ + 1);
  Finish(absl::OkStatus());
}

void EtcdOwnership::Finish(absl::Status s) {
  if (!s.ok()) {
    state_ = State::kIdle;
    step_timer_->Cancel();
  }
  auto taken = std::move(taken_);
  taken_ = nullptr;
  if (taken) taken(std::move(s));
}

bool EtcdOwnership::HoldsAt(MonoTime now) {
  if (state_ != State::kOwned) return false;
  if (now < until_) return true;
  Lose(absl::UnavailableError(absl::StrCat("the ownership of etcd prefix ", options_.prefix,
                                           " may have lapsed (no lease renewal answered in time)")));
  return false;
}

void EtcdOwnership::Lose(absl::Status why) {
  if (state_ == State::kLost) return;
  const bool owned = state_ == State::kOwned;
  state_ = State::kLost;
  why_lost_ = why;
  step_timer_->Cancel();
  deadline_timer_->Cancel();
  watch_timer_->Cancel();
  watch_.reset();
  if (!owned || !lost_) return;
  time_->Post([alive = alive_, lost = std::move(lost_), why = std::move(why)] {
    if (*alive) lost(why);
  });
  lost_ = nullptr;
}

void EtcdOwnership::RenewAndReadOwner(State in, Renewed done) {
  const MonoTime sent = time_->Now();
  Ask<absl::StatusOr<absl::Duration>>(
      [lease = lease_](EtcdClient& c) { return c.LeaseKeepAlive(lease); },
      [this, in, sent, done = std::move(done)](absl::StatusOr<absl::Duration> ttl) {
        if (state_ != in) return;
        if (!ttl.ok()) return done(sent, ttl, absl::OkStatus());
        RangeRequest read;
        read.set_key(keys_.owner());
        Ask<absl::StatusOr<RangeResponse>>(
            [read = std::move(read)](EtcdClient& c) { return c.Range(read); },
            [this, in, sent, ttl, done](absl::StatusOr<RangeResponse> got) {
              if (state_ != in) return;
              done(sent, ttl, CheckOwnerKey(got));
            });
      });
}

void EtcdOwnership::Renew() {
  // Every third of the TTL. A renewal moves the deadline only while P/owner is still the key
  // this lockd created, on this lease: a lease kept alive no longer backs a key someone deleted
  // or replaced. The key is read after the renewal was sent, so the deadline never runs past a
  // change of it that this read could see.
  if (state_ != State::kOwned) return;
  RenewAndReadOwner(State::kOwned, [this](MonoTime sent, absl::StatusOr<absl::Duration> ttl,
                                          const absl::Status& owner_key) {
    if (!ttl.ok()) return RenewFailed(ttl.status());
    if (absl::IsFailedPrecondition(owner_key)) {
      return Lose(TakenAway(absl::UnavailableError(owner_key.message())));
    }
    if (!owner_key.ok()) return RenewFailed(owner_key);
    const MonoTime until = sent + *ttl * (1 - options_.margin);
    if (until > until_) {
      if (options_.on_owned) options_.on_owned(sent, until);
      until_ = until;
      deadline_timer_->ArmAt(until_, [this] { (void)HoldsAt(time_->Now()); });
    }
    // Every third of the TTL from the last renewal's send, not from its answer: a slow etcd (a
    // second per request) would otherwise stretch the period by the renewal's own time and let
    // the deadline pass between two renewals (issue 37).
    step_timer_->ArmAt(std::max(time_->Now(), sent + options_.ttl / 3), [this] { Renew(); });
  });
}

void EtcdOwnership::RenewFailed(const absl::Status& s) {
  // After a failure, try again soon: the deadline does not wait.
  if (absl::IsNotFound(s) || !HoldsAt(time_->Now())) {
    return Lose(absl::UnavailableError(absl::StrCat("lost the ownership of etcd prefix ",
                                                    options_.prefix, ": ", s.message())));
  }
  step_timer_->ArmAt(time_->Now() + std::min(options_.ttl / 3, kRetry), [this] { Renew(); });
}

void EtcdOwnership::Watch(int64_t from) {
  // Any change of P/owner (deleted by hand, put by someone else, its lease revoked) ends the
  // ownership at once.
  watch_ = etcd_->Watch(
      keys_.owner(), from, [this, alive = alive_](absl::StatusOr<EtcdWatch::Changes> changes) {
        if (!*alive || state_ != State::kOwned) return;
        if (!changes.ok()) {
          // The stream broke, or the history it needed was compacted: read the key, then watch
          // on from that read.
          watch_timer_->ArmAt(time_->Now() + kRetry, [this] { Rewatch(); });
          return;
        }
        for (const auto& e : changes->events) {
          if (e.kv().key() != keys_.owner()) continue;
          return Lose(TakenAway(absl::UnavailableError(absl::StrCat(
              "the ownership of etcd prefix ", options_.prefix, " was taken away: ",
              keys_.owner(),
              e.type() == etcdserverpb::Event::DELETE
                  ? " was deleted (by hand, or its lease was revoked)"
                  : absl::StrCat(" was overwritten with \"",
                                 absl::CHexEscape(e.kv().value().substr(0, 128)), "\"")))));
        }
      });
}

void EtcdOwnership::Rewatch() {
  if (state_ != State::kOwned) return;
  RangeRequest read;
  read.set_key(keys_.owner());
  Ask<absl::StatusOr<RangeResponse>>(
      [read = std::move(read)](EtcdClient& c) { return c.Range(read); },
      [this](absl::StatusOr<RangeResponse> got) {
        if (state_ != State::kOwned) return;
        absl::Status mine = CheckOwnerKey(got);
        if (absl::IsFailedPrecondition(mine)) {
          return Lose(TakenAway(absl::UnavailableError(mine.message())));
        }
        if (!mine.ok()) {
          watch_timer_->ArmAt(time_->Now() + kRetry, [this] { Rewatch(); });
          return;
        }
        Watch(got->header().revision() + 1);
      });
}

absl::Status EtcdOwnership::CheckOwnerKey(const absl::StatusOr<RangeResponse>& got) const {
  if (!got.ok()) return got.status();
  const std::string what = absl::StrCat("the ownership of etcd prefix ", options_.prefix,
                                        " was taken away: ", keys_.owner());
  if (got->kvs_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(what, " was deleted"));
  }
  const auto& kv = got->kvs(0);
  if (kv.create_revision() != revision_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " was deleted and is now held by ", kv.value()));
  }
  if (kv.mod_revision() != revision_ || kv.lease() != lease_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " was overwritten (now \"", absl::CHexEscape(kv.value().substr(0, 128)),
        "\", on lease ", kv.lease(), ", not this lockd's ", lease_, ")"));
  }
  return absl::OkStatus();
}

}  // namespace fencelock::server
