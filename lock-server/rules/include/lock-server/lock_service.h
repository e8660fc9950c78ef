// The lock server's rules: sessions, shared and exclusive locks with leases, FIFO waiters,
// fencing tokens, lock delays and fence 1, with no I/O and no clock of its own (ADR 0006 for
// the modes and the delay).
//
// Every method takes the server's `now` (the time the request was received) and first expires
// whatever has run out by then, so the outcome never depends on when a timer happened to fire.
// Mutations are expressed as StateMachine records. Waiters are not part of the durable state:
// a queued acquire is identified by a WaiterId chosen by the caller, and its outcome (granted,
// timed out, cancelled because its session ended) is collected with TakeWaiterOutcomes() after
// any call, since any call can free a lock.
//
// Errors use canonical codes: kNotFound (unknown session), kAborted (stale token: FENCED_OUT),
// kInvalidArgument (bad name, TTL out of range, token never issued, re-acquire by the holder),
// kDeadlineExceeded (a wait ran out), kCancelled (a waiter's session ended),
// kResourceExhausted (a limit of ServiceOptions; only that caller is refused).
//
// Not thread-safe: one owner thread.
#ifndef FENCELOCK_LOCK_SERVER_LOCK_SERVICE_H_
#define FENCELOCK_LOCK_SERVER_LOCK_SERVICE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "protocol/defaults.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clock/clock.h"
#include "lock-server/counters.h"
#include "lock-server/options.h"
#include "lock-server/pool_service.h"
#include "lock-server/state_machine.h"

namespace fencelock::server {

using WaiterId = uint64_t;
// A connection of the server's transport; 0 is none.
using ConnectionId = uint64_t;

// Who sent a request that drives a session.
struct Caller {
  ConnectionId connection = 0;
  // The connection's authenticated identity ("uid:1000" on the Unix socket); empty when it has
  // none (plaintext TCP).
  std::string identity;
};

// How an Acquire wants its lock (ADR 0006).
struct AcquireMode {
  LockMode mode = LockMode::kExclusive;
  // The delay this holder's loss starts; none: ServiceOptions::default_lock_delay.
  std::optional<absl::Duration> lock_delay;
};

struct LockRef {
  std::string lock;
  FenceToken token;
};

struct AcquireResult {
  enum class Kind { kGranted, kQueued, kBusy };
  Kind kind;
  FenceToken token;                           // kGranted only
  absl::Duration ttl = absl::ZeroDuration();  // kGranted only
};

struct WaiterOutcome {
  WaiterId waiter;
  std::string lock;
  absl::Status status;       // OK: granted
  FenceToken token;
  absl::Duration ttl = absl::ZeroDuration();
};

// The lock rules' counters (counters.h's FENCELOCK_LOCK_COUNTERS). fenced_out_total counts
// stale tokens from the session that held them (for Validate, issued for that lock): a holder
// acted on a lease it lost, which must never happen; foreign_tokens_total, tokens the sender
// never held (a stranger's, or a guess), which say nothing about a lease.
struct ServiceStats {
  FENCELOCK_COUNTERS_STRUCT_BODY(FENCELOCK_LOCK_COUNTERS)
};

class LockService {
 public:
  explicit LockService(ServiceOptions options);
  // Starts from a recovered state (sessions and holders, no waiters).
  LockService(ServiceOptions options, StateMachine restored);
  // The pool rules hold a pointer to this service's state: never copied or moved.
  LockService(const LockService&) = delete;
  LockService& operator=(const LockService&) = delete;

  // The admission pools, on the same state, records and token sequence as the locks.
  PoolService& pools() { return pools_; }
  const PoolService& pools() const { return pools_; }

  // Opens a session with `ttl` (zero: the default), owned by `caller`'s identity and bound to
  // its connection, resumable elsewhere with `secret` (empty: never). Returns its id and
  // effective TTL.
  absl::StatusOr<std::pair<SessionId, absl::Duration>> OpenSession(absl::Duration ttl,
                                                                   MonoTime now,
                                                                   const Caller& caller = {},
                                                                   std::string secret = "");

  // Whether `caller` may drive `session` (keep it alive, acquire, release, validate as its
  // holder, close it): only from the connection the session is bound to (the one that opened
  // it, or the last to resume it) and only with the identity that opened it. OK too for a
  // session that does not exist (the request then answers SESSION_NOT_FOUND, or FENCED_OUT;
  // see SentByItsDriver). Otherwise kPermissionDenied, counted; the session is left as it was.
  absl::Status Authorize(SessionId session, const Caller& caller);

  // Whether a request naming `session` comes from whoever drove it: true for a live session
  // (Authorize() judges those); for one that ended recently (ServiceOptions::
  // remembered_lease_ends of them), whether `caller` is the connection it was bound to or
  // has the identity that opened it. Only then does a stale token of that session count as
  // fenced out (the must-be-zero event); from anyone else it counts as foreign, so that a
  // stranger replaying an ended session's id and tokens cannot raise the alert.
  bool SentByItsDriver(SessionId session, const Caller& caller) const;

  // Binds `session` to `caller`'s connection (after a reconnect, or after lockd restarted) if
  // `secret` is the session's and `caller`'s identity opened it; the connection it was bound to
  // may no longer drive it, and the session's Acquires still queued from there are cancelled
  // (outcome kCancelled). Returns the session's TTL. Errors: kNotFound (no such session),
  // kPermissionDenied (wrong secret or identity, counted).
  absl::StatusOr<absl::Duration> Resume(SessionId session, std::string_view secret,
                                        const Caller& caller);

  // A request refused for its sender's identity (a session not its own, a wrong secret, or
  // what the permissions file does not grant): counted in permission_denied_total and told to
  // on_permission_denied. Returns kPermissionDenied with `message`.
  absl::Status Deny(std::string message);

  // Renews the session and each listed lock's lease from `now`. On success returns one status
  // per lock, in order: OK or kAborted (stale token, counted as fenced out).
  absl::StatusOr<std::vector<absl::Status>> KeepAlive(SessionId session,
                                                      std::span<const LockRef> locks,
                                                      MonoTime now);

  // Confirms the session's grants in `confirm` (HolderState::confirmed; a token the session
  // does not hold is passed over), then renews the session and every confirmed lock it holds
  // from `now` (Renew, protocol version 6). Errors: kNotFound (no such session).
  struct Renewed {
    absl::Duration ttl;
    uint64_t losses = 0;  // SessionState::losses
    size_t held = 0;      // locks the session holds
  };
  absl::StatusOr<Renewed> Renew(SessionId session, std::span<const LockRef> confirm,
                                MonoTime now);

  // Ends the session: releases its locks (granting waiters) and cancels its waiters.
  absl::Status CloseSession(SessionId session, MonoTime now);

  // Grants `lock` to `session` in `how.mode` when nobody waits for it, no holder's mode
  // excludes it, and no delay blocks it. Otherwise, with a positive `wait`, queues `waiter`
  // (outcome later via TakeWaiterOutcomes); with zero `wait`, answers kBusy. Waiters are
  // granted in arrival order, consecutive shared ones together; a shared request never passes
  // a waiting one (no barging past a queued writer).
  absl::StatusOr<AcquireResult> Acquire(SessionId session, const std::string& lock,
                                        absl::Duration ttl, absl::Duration wait,
                                        WaiterId waiter, MonoTime now,
                                        const AcquireMode& how = {});

  // Releases `lock` if `token` is its current holder's and `session` is that holder. A
  // `relinquish` release (the client already gave the lock up) is not counted as fenced out
  // when its token is stale; neither is one not `from_driver` (SentByItsDriver) of an ended
  // session, which counts as foreign.
  absl::Status Release(SessionId session, const std::string& lock, FenceToken token,
                       MonoTime now, bool relinquish = false, bool from_driver = true);

  // Fence 1 for resources that cannot store tokens: OK iff `token` holds `lock` now (and, when
  // `holder` is given, that session holds it: a holder confirming its own lock).
  // `from_driver` as for Release().
  absl::Status Validate(const std::string& lock, FenceToken token, MonoTime now,
                        std::optional<SessionId> holder = std::nullopt, bool from_driver = true);

  // Forgets a queued waiter whose requester went away. No outcome is produced for it.
  void CancelWaiter(WaiterId waiter);
  // Takes `session`'s queued `waiter` out of its queue at its requester's asking: its outcome
  // is kCancelled. False if it no longer waits (granted, timed out, never queued);
  // kInvalidArgument if it waits for another session.
  absl::StatusOr<bool> Withdraw(WaiterId waiter, SessionId session, MonoTime now);

  // Expires sessions, lock leases, provisional pool leases and waits that have run out by
  // `now`.
  void Advance(MonoTime now);

  // Every session, lock lease, provisional pool lease and pool demand ends `d` later (waits
  // are not moved): for time the server itself did not run. See StateMachine::PostponeExpiries
  // and PoolService::PostponeDemand.
  void PostponeLeases(absl::Duration d) {
    state_.PostponeExpiries(d);
    pools_.PostponeDemand(d);
  }
  // Every session, lock lease and provisional pool lease runs at least its full TTL from
  // `now`: for the moment a restored state begins to be served. See
  // StateMachine::RestartLeases.
  void RestartLeases(MonoTime now) { state_.RestartLeases(now); }

  // When Advance() next has something to do; MonoTime::Max() if nothing is pending.
  MonoTime NextDeadline() const;

  // Outcomes of queued waiters settled since the last call.
  std::vector<WaiterOutcome> TakeWaiterOutcomes();

  // Called with each record right after it is applied (the durability hook). Optional.
  void set_record_observer(std::function<void(const Record&)> observer) {
    observer_ = std::move(observer);
  }

  const StateMachine& state() const { return state_; }
  const ServiceStats& stats() const { return stats_; }
  size_t waiter_count() const { return waiter_index_.size(); }
  size_t waiters_for(const std::string& lock) const {
    auto it = queues_.find(lock);
    return it == queues_.end() ? 0 : it->second.size();
  }
  // The sessions queued for `lock`, first in line first (for inspection and the simulator's
  // FIFO check).
  std::vector<SessionId> QueuedSessions(const std::string& lock) const {
    std::vector<SessionId> out;
    if (auto it = queues_.find(lock); it != queues_.end()) {
      for (const Waiter& w : it->second) out.push_back(w.session);
    }
    return out;
  }
  // The waiters queued for `lock` (id and session), first in line first: one session may have
  // two.
  std::vector<std::pair<WaiterId, SessionId>> QueuedWaiters(const std::string& lock) const {
    std::vector<std::pair<WaiterId, SessionId>> out;
    if (auto it = queues_.find(lock); it != queues_.end()) {
      for (const Waiter& w : it->second) out.emplace_back(w.id, w.session);
    }
    return out;
  }
  // The mode of each waiter queued for `lock`, first in line first.
  std::vector<LockMode> QueuedModes(const std::string& lock) const {
    std::vector<LockMode> out;
    if (auto it = queues_.find(lock); it != queues_.end()) {
      for (const Waiter& w : it->second) out.push_back(w.mode);
    }
    return out;
  }
  // Answers every queued waiter with `status` and empties the queues (outcomes are collected
  // with TakeWaiterOutcomes). Used when the server stops taking mutations.
  void FailAllWaiters(const absl::Status& status);

 private:
  struct Waiter {
    WaiterId id;
    SessionId session;
    absl::Duration ttl;
    MonoTime give_up_at;
    LockMode mode;
    absl::Duration lock_delay;
  };
  struct WaiterPlace {
    std::string lock;
    SessionId session;
    MonoTime give_up_at;
  };

  void Commit(const Record& r, MonoTime now);
  absl::StatusOr<absl::Duration> ResolveTtl(absl::Duration requested,
                                            absl::Duration default_ttl) const;
  // Fence 1: OK iff `token` is the current holder's (and, when given, `session` is that
  // holder's session); otherwise kAborted (FENCED_OUT). Unless `count` is false, the refusal is
  // counted as fenced out when the token was this lock's and `session` held it and the request
  // came `from_driver` of that session (see ServiceOptions::remembered_lease_ends), and as a
  // foreign token otherwise.
  absl::Status CheckHolder(std::optional<SessionId> session, const std::string& lock,
                           FenceToken token, bool count = true, bool from_driver = true);
  // A lease ended: remember whose it was (bounded).
  void RememberEnded(const std::string& lock, FenceToken token, SessionId session);
  void ReleaseAndHandOff(const std::string& lock, FenceToken token, ReleaseReason reason,
                         MonoTime now);
  // Whether a grant of `lock` in `mode` is allowed at `now` by its holders and delays (the
  // queue aside).
  bool Grantable(const std::string& lock, LockMode mode, MonoTime now) const;
  // Grants `lock` to the waiters at the head of its queue that may have it now: the first, and
  // while they ask for shared, those after it.
  void HandOff(const std::string& lock, MonoTime now);
  // The waiters at the head of `lock`'s queue that its holders would let in at `now` but a
  // delay holds back (as HandOff would take them).
  size_t HeldBackByDelay(const std::string& lock, MonoTime now) const;
  void EndSession(SessionId session, EndReason reason, MonoTime now);
  // Takes `waiter` out of its queue with `outcome` (none when OK). When it was first in line,
  // the waiters it held back are granted at `hand_off_at` if they may be then (none: they are
  // not, the server stops taking mutations).
  void RemoveWaiter(WaiterId waiter, absl::Status outcome, std::optional<MonoTime> hand_off_at);
  // Every queued waiter of `session` leaves its queue with kCancelled ("session N " + why).
  void CancelWaitersOf(SessionId session, const std::string& why, MonoTime now);
  // One waiter of `session` left its queue.
  void Unqueued(SessionId session);

  ServiceOptions options_;
  StateMachine state_;
  // The latest `now` a call brought: grants made where no call gives a time (a waiter removed
  // as its connection closed, or its session resumed elsewhere, lets those behind it in) start
  // their leases there, which is never before the waiters they go to were queued.
  MonoTime now_ = MonoTime::Min();
  absl::flat_hash_map<std::string, std::deque<Waiter>> queues_;
  absl::flat_hash_map<WaiterId, WaiterPlace> waiter_index_;
  absl::flat_hash_map<SessionId, size_t> waiting_;  // queued waiters per session
  std::set<std::pair<MonoTime, WaiterId>> waiter_deadlines_;
  std::vector<WaiterOutcome> outcomes_;
  ServiceStats stats_;
  std::function<void(const Record&)> observer_;
  PoolService pools_;
  // The newest lease ends, oldest end first in ended_order_. A lock is kept as its name's
  // hash: the token already identifies the lease, the hash only tells a token presented for
  // another lock.
  struct EndedLease {
    size_t lock_hash;
    SessionId session;
  };
  absl::flat_hash_map<FenceToken, EndedLease> ended_;
  std::deque<FenceToken> ended_order_;
  // Who drove the sessions that ended last, oldest first in ended_sessions_order_ (as many as
  // lease ends are remembered): the connection it was bound to (0: none) and a hash of its
  // identity (0: anonymous).
  struct EndedSession {
    ConnectionId connection;
    size_t identity_hash;
  };
  absl::flat_hash_map<SessionId, EndedSession> ended_sessions_;
  std::deque<SessionId> ended_sessions_order_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_LOCK_SERVICE_H_
