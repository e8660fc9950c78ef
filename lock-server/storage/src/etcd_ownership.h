// Which lockd serves an etcd prefix: the one whose key P/owner exists, created on an etcd lease
// of its own. EtcdOwnership takes that key (standing by while another lockd holds it, if asked
// to), keeps it (renewing the lease every third of its TTL, reading the key after each renewal,
// watching it), and says until when this lockd may act as the owner: the send time of the last
// renewal etcd answered + TTL x (1 - margin), on the owner's clock (ADR-006's client rule,
// applied to lockd's own lease). Once that deadline passes, the key is seen deleted or changed,
// or the lease is gone, the ownership is lost for good.
//
// A lockd taking over after P/owner went away while the lease it was on still lives (deleted by
// hand) revokes that lease and waits its TTL, renewing its own, before it counts as the owner:
// by then the former owner's own deadline has passed. Which lease the former owner held is
// recorded in P/owner-lease by every owner before it serves, so that a standby that never saw
// that owner's key still waits it out.
//
// All logic, no I/O of its own: etcd through EtcdCalls, time through a TimeSource, nothing
// blocks and nothing sleeps. Not thread-safe: the TimeSource's owner thread only.
#ifndef FENCELOCK_LOCK_SERVER_ETCD_OWNERSHIP_H_
#define FENCELOCK_LOCK_SERVER_ETCD_OWNERSHIP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "clock/time_source.h"
#include "etcd_keys.h"
#include "lock-server/etcd_store.h"

namespace fencelock::server {

struct EtcdOwnershipOptions {
  std::string prefix;
  std::string owner;        // written into P/owner, so that others can name this lockd
  absl::Duration ttl;       // of the lease on P/owner, whole seconds
  double margin = 0.30;     // the part of the TTL never relied on
  // How long to wait for another lockd's P/owner to go away; InfiniteDuration(): stand by.
  absl::Duration wait;
  // No create of P/owner before this long after Take() (EtcdCommitLogOptions::campaign_hold_off).
  absl::Duration hold_off = absl::ZeroDuration();
  std::function<void(MonoTime sent, MonoTime until)> on_owned;
  std::function<void(const std::string& owner)> on_standby;
  std::function<void(const std::string&)> log;
};

// `why`, marked as a loss of the ownership that someone else caused (OwnershipTakenAway,
// lock-server/etcd_commit_log.h).
absl::Status TakenAway(absl::Status why);

class EtcdOwnership {
 public:
  // `time` and `etcd` outlive this object.
  EtcdOwnership(EtcdOwnershipOptions options, TimeSource* time, EtcdCalls* etcd);
  // Revokes the lease, when there is one: a clean stop hands the prefix over at once.
  ~EtcdOwnership();
  EtcdOwnership(const EtcdOwnership&) = delete;
  EtcdOwnership& operator=(const EtcdOwnership&) = delete;

  // Takes P/owner. `taken` is called once: OK once this lockd owns the prefix; otherwise why
  // not (kFailedPrecondition naming the owner after `wait`; etcd's error, except that a standby
  // outlives etcd being unavailable). After an OK, `lost` is called once (posted, never inside
  // a call of this object) when the ownership ends. Called once.
  void Take(std::function<void(absl::Status)> taken, std::function<void(absl::Status)> lost);

  // Whether this lockd may act as the owner at `now`, its TimeSource's time. The first call
  // that finds the deadline passed ends the ownership for good.
  bool HoldsAt(MonoTime now);
  // Until when it may, as last computed; MonoTime::Min() unless owned.
  MonoTime until() const { return state_ == State::kOwned ? until_ : MonoTime::Min(); }
  // P/owner's creation revision, which every transaction of the owner compares.
  int64_t revision() const { return revision_; }
  // Why the ownership ended; OK while it lasts (or before it began).
  const absl::Status& why_lost() const { return why_lost_; }
  // Ends the ownership now (the log failed): nothing more is renewed.
  void Lose(absl::Status why);

 private:
  enum class State { kIdle, kTaking, kOwned, kLost };

  template <typename T>
  void Ask(std::function<T(EtcdClient&)> call, std::function<void(T)> reply) {
    CallEtcd<T>(*etcd_, std::move(call),
                [alive = alive_, reply = std::move(reply)](T answer) mutable {
                  if (*alive) reply(std::move(answer));
                });
  }
  // Taking: renews (or gets) the lease when due, else tries to create P/owner.
  void StepTaking();
  void RenewForTaking();
  void TryCreate();
  // A failed step: a standby logs it once and tries again; others give up.
  void TakingFailed(const absl::Status& s);
  void WaitOutFormerOwner();
  // Created (and any former owner waited out): records our lease in P/owner-lease, guarded by
  // our P/owner, then confirms.
  void Record();
  // Recorded: renews the lease and reads P/owner, as Renew() does, then owns from that send.
  void Confirm();
  // P/owner was created on our lease at revision_: waits out a former owner, then records.
  void Created();
  // The lease a P/owner-lease read names; 0 for none, or for our own.
  int64_t RecordedLease(const google::protobuf::RepeatedPtrField<etcdserverpb::KeyValue>& kvs) const;
  void WaitStep();
  void Owned();
  void Finish(absl::Status s);
  // Owned: one renewal, then a read of P/owner, then the new deadline.
  void Renew();
  // One renewal of the lease, then a read of P/owner (CheckOwnerKey), while the state stays
  // `in`: `done` with the renewal's send time, its answer, and, if it was renewed, the key's.
  using Renewed = std::function<void(MonoTime sent, absl::StatusOr<absl::Duration> renewed,
                                     const absl::Status& owner_key)>;
  void RenewAndReadOwner(State in, Renewed done);
  void RenewFailed(const absl::Status& s);
  void Watch(int64_t from);
  void Rewatch();
  // OK while P/owner is the key this lockd created on its lease; kFailedPrecondition saying
  // what became of it otherwise; etcd's error when it could not be read.
  absl::Status CheckOwnerKey(const absl::StatusOr<etcdserverpb::RangeResponse>& got) const;
  void Log(const std::string& line);

  const EtcdOwnershipOptions options_;
  const etcd_keys::Keys keys_;
  TimeSource* const time_;
  EtcdCalls* const etcd_;
  const std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  const bool forever_;  // standing by
  std::unique_ptr<Timer> step_timer_, deadline_timer_, watch_timer_;
  std::unique_ptr<EtcdWatching> watch_;

  State state_ = State::kIdle;
  std::function<void(absl::Status)> taken_, lost_;
  MonoTime give_up_;
  MonoTime hold_off_until_;  // no create of P/owner before then
  int64_t lease_ = 0;
  MonoTime lease_sent_ = MonoTime::Min();  // send time of the lease's last grant or renewal
  int64_t revision_ = 0;
  MonoTime until_ = MonoTime::Min();
  int64_t former_lease_ = 0;   // the lease of the last P/owner seen held by another
  // The lease P/owner-lease names: the last owner's, recorded before it served. A standby that
  // never saw that owner's key (etcd was away, or the key came and went between two looks)
  // learns of it there.
  int64_t recorded_former_ = 0;
  MonoTime wait_until_;        // waiting out the former owner until then
  // The former lease this lockd revoked itself, and is waiting out until wait_until_: found
  // gone when the take starts over (after a transient etcd error), it was revoked by us, not
  // expired, and its lockd may still act until its own deadline.
  int64_t revoked_former_ = 0;
  std::string said_unreachable_;  // the last etcd failure a standby logged
  std::string said_owner_;        // the last owner a standby reported
  bool said_standby_ = false;
  absl::Status why_lost_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ETCD_OWNERSHIP_H_
