// lockd's state in an etcd cluster instead of a state directory (`--etcd`, `--etcd-prefix`):
// the second CommitLog backend. The rules and the protocol are the same; etcd's Raft log makes
// each commit durable on a quorum of its members.
//
// Under the prefix P:
//   P/format                    "fencelock-lockd-etcd\nformat 1\n"; anything else is refused
//   P/sequences                 token and session-id marks reserved ahead of use (as SEQUENCES)
//   P/owner                     the serving lockd, on an etcd lease: one lockd per prefix
//   P/owner-lease               the id of the lease P/owner was last created on, kept when
//                               P/owner goes: what a successor waits out if it was deleted
//   P/snapshot-head             "<lsn> <chunks>" (or "<lsn> <chunks> <first chunk>" for a
//                               snapshot rewritten at the same lsn): the snapshot in force
//   P/snapshot/<lsn>/<chunk>    that snapshot's bytes (the local snapshot file's), in chunks
//   P/log/<last lsn>            a committed batch: record frames as in a WAL segment
//
// Every transaction lockd commits compares P/owner's creation revision with its own, so once
// its lease has lapsed (or another lockd owns the prefix) nothing it sends is committed. It
// also stops by itself before that can happen: it renews the lease every third of its TTL and
// holds the ownership only until the send time of the last renewal etcd answered + TTL x (1 -
// margin), on the boot-time clock (ADR-006's client rule), and only while P/owner, read after
// each renewal, is still the key it created on that lease. Past that deadline the log enters
// its fault state: lockd answers nothing that depends on its state until restarted. It also
// watches P/owner: any change of it (deleted by hand, overwritten) ends the ownership at once.
// A lockd taking over after P/owner went away while the lease it was on still lives (deleted
// by hand) reads that lease from P/owner-lease, revokes it and waits its TTL before it
// restores anything.
//
// Batches are grouped as in the local log (the records that pile up while a transaction is in
// flight go in the next), split into keys of at most max_value_bytes. After a snapshot the log
// keys it covers and older snapshots are deleted and etcd's history is compacted, so the prefix
// and etcd's database stay small.
//
// The log is logic on lockd's event loop: time and timers from its TimeSource, etcd through
// EtcdCalls (lock-server/etcd_store.h), no sleeps and no threads of its own. Against a real
// cluster, CallOnThreads carries the gRPC calls; in the simulator, the simulated etcd answers
// on simulated time. The ownership of the prefix is its own part (src/etcd_ownership.h).
#ifndef FENCELOCK_LOCK_SERVER_ETCD_COMMIT_LOG_H_
#define FENCELOCK_LOCK_SERVER_ETCD_COMMIT_LOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clock/clock.h"
#include "clock/time_source.h"
#include "lock-server/commit_log.h"
#include "lock-server/etcd_access.h"

namespace fencelock::server {

class EtcdCalls;   // lock-server/etcd_store.h
class EtcdClient;

// The part of its lease on the prefix lockd never relies on: the client's margin (ADR-006),
// applied to lockd's own lease.
inline constexpr double kEtcdOwnerMargin = 0.30;

struct EtcdCommitLogOptions {
  // etcd's client endpoints, host:port. Required.
  std::vector<std::string> endpoints;
  // TLS and auth to etcd. Default: plaintext, no user.
  EtcdAccess access;
  // Where this lockd's keys live, e.g. "/fencelock/payouts". Required: starts with '/', does
  // not end with one.
  std::string prefix;
  // Tokens and session ids reserved per write of P/sequences. Default: 10000.
  uint64_t reservation_block = 10000;
  // The longest one etcd request may take before the next endpoint is tried. Default: 5 s.
  // Keep it well under owner_ttl x (1 - owner_margin): a member that swallows requests must
  // not cost the ownership while the others answer.
  absl::Duration request_timeout = absl::Seconds(5);
  // The TTL of the lease on P/owner (whole seconds), and the margin of it lockd never relies
  // on. Default: 10 s and 0.30.
  absl::Duration owner_ttl = absl::Seconds(10);
  double owner_margin = kEtcdOwnerMargin;
  // At start, how long to wait for P/owner to go away (a lockd that died leaves it until its
  // lease runs out) before refusing; absl::InfiniteDuration() stands by until it does (a
  // standby replica). Default: owner_ttl + 2 s.
  absl::Duration owner_wait = absl::Seconds(12);
  // No try to create P/owner comes sooner than this after the start. lockd stands by again with
  // its owner TTL here after its ownership was taken away (OwnershipTakenAway below), so that
  // the replicas that were standing by take over first: an operator who deletes P/owner means
  // to move the service. Default: zero.
  absl::Duration campaign_hold_off = absl::ZeroDuration();
  // A snapshot is taken once the log since the last one is at least this large (and as large
  // as that snapshot). Default: 1 MiB.
  uint64_t snapshot_min_bytes = uint64_t{1} << 20;
  // The largest value of one key; etcd refuses requests over 1.5 MiB by default. Default: 1 MiB.
  uint64_t max_value_bytes = uint64_t{1} << 20;
  // Who serves the prefix, written into P/owner so that a second lockd can name it.
  std::string owner = "lockd";
  // How often every member is asked for its status (lockctl status, the metrics); zero:
  // never. Default: 1 s.
  absl::Duration member_probe = absl::Seconds(1);
  // The callbacks below run on the log's thread (its TimeSource's owner).
  // Called with the duration of every committed transaction.
  std::function<void(int64_t ns)> on_commit;
  // Called whenever the ownership deadline moves, with the send time of the lease request etcd
  // answered and the new deadline, before any request can see the new deadline. Default:
  // nothing.
  std::function<void(MonoTime sent, MonoTime until)> on_owned;
  // While standing by (owner_wait infinite): called with P/owner's value (the serving lockd's
  // `owner`) whenever it changes. Default: nothing.
  std::function<void(const std::string& owner)> on_standby;
  // Where the log reports its fault state and ownership (once each). Default: standard error.
  std::function<void(const std::string&)> log;
};

// Whether `fault` (the log's fault, or why lockd stopped serving) says the ownership was taken
// from this lockd: P/owner deleted (by hand, or its lease revoked) or overwritten, or a commit
// refused because P/owner changed. False after a lapse, a failed renewal or any other fault.
bool OwnershipTakenAway(const absl::Status& fault);

// "a:2379,b:2379" (lockd's --etcd) to its endpoints; kInvalidArgument for an empty entry or
// one without a port.
absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(const std::string& list);

// `lockd init --etcd`: writes an empty state under options.prefix. kFailedPrecondition if the
// prefix already holds one (or anything else), kUnavailable if etcd cannot be reached. Blocks.
absl::Status InitEtcdPrefix(const EtcdCommitLogOptions& options);
absl::Status InitEtcdPrefixOn(const EtcdCommitLogOptions& options, EtcdClient& etcd);

// An etcd log being opened (or a prefix being destroyed). Destroying it abandons the work: its
// callback is then never called, and the ownership it took is given back.
class EtcdLogOpening {
 public:
  virtual ~EtcdLogOpening() = default;
};

using EtcdLogOpened = std::function<void(absl::StatusOr<OpenedCommitLog>)>;

// Takes ownership of options.prefix (waiting up to owner_wait for a previous owner's lease),
// restores the state as of the moment it owns the prefix, on `time` (every restored lease gets
// its full TTL; the core gives it again when it begins to serve), reserves a block of tokens
// and session ids above everything restored, and calls `done` with the log, on `time`'s thread
// (never inside this call). Errors: kInvalidArgument (options), kNotFound (not initialized),
// kFailedPrecondition (another lockd owns the prefix, naming it; an unsupported format),
// kDataLoss (damaged state, naming the key), kUnavailable (etcd). `time` outlives the log.
std::unique_ptr<EtcdLogOpening> OpenEtcdCommitLogOn(const EtcdCommitLogOptions& options,
                                                    TimeSource* time,
                                                    std::unique_ptr<EtcdCalls> etcd,
                                                    EtcdLogOpened done);
// The same on a gRPC client of options.endpoints, its calls carried by threads
// (CallOnThreads): `time`'s Post() must be thread-safe.
std::unique_ptr<EtcdLogOpening> OpenEtcdCommitLog(const EtcdCommitLogOptions& options,
                                                  TimeSource* time, EtcdLogOpened done);

struct EtcdDestroyOutcome {
  std::vector<std::string> held;  // what `held` found: not empty, nothing was deleted
  int64_t deleted = 0;            // the keys deleted under the prefix
  std::vector<std::string> left;  // keys under the prefix lockd did not write, left in place
};
using EtcdDestroyed = std::function<void(absl::StatusOr<EtcdDestroyOutcome>)>;

// `lockd destroy --etcd`: the exact cleanup of a prefix. Takes the prefix's ownership as a
// serving lockd does (refused while one serves it, naming it, after owner_wait; and no lockd
// can start on it meanwhile), restores the state, and asks `held` what it holds. Only if
// nothing, it deletes every key lockd wrote under `prefix/` (and nothing else: keys put there
// by hand are left and listed) in one transaction guarded by that ownership. Refused, like a
// start, while a prefix around or inside this one holds a lockd state. Errors, with nothing
// deleted: OpenEtcdCommitLogOn's, and etcd's.
std::unique_ptr<EtcdLogOpening> DestroyEtcdPrefixOn(
    const EtcdCommitLogOptions& options, TimeSource* time, std::unique_ptr<EtcdCalls> etcd,
    std::function<std::vector<std::string>(const StateMachine&)> held, EtcdDestroyed done);
// The same over gRPC, on an event loop of its own; blocks until done.
absl::StatusOr<EtcdDestroyOutcome> DestroyEtcdPrefix(
    const EtcdCommitLogOptions& options,
    const std::function<std::vector<std::string>(const StateMachine&)>& held);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ETCD_COMMIT_LOG_H_
