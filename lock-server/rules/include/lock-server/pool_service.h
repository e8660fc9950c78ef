// The admission coordinator's rules (ADR-0003 and ADR-0006; docs/admission.md): policy
// publication and acknowledgement, manager ownership by epoch, provisional and active leases,
// reservations, borrowing, fairness among current contenders, and expiring demand. No I/O and
// no clock: every method takes the server's `now`, and mutations are StateMachine records
// applied through the `commit` function the owner gives (LockService's, so that pool records
// share the log, the reply gate and the one token sequence with locks).
//
// Admission. A profile's slot costs `cost` units. Units come first from the profile's own
// reservation, then from the fair units: the unreserved units and the lendable reservations
// (the latter only for profiles that borrow). A non-lendable reservation is never used by
// another profile; a lent unit is never taken back from a lease. Among the current contenders
// (profiles with fresh positive demand, and the one acquiring), each contender's unmet fair
// share of the fair units, up to its pending demand, is withheld from the others. A grant never
// puts a pool's leases above its budget (StateMachine checks that on every record too).
//
// Demand is in memory only: SetDemand(n > 0) and Acquire create or refresh a deadline of
// PoolOptions::demand_ttl; SetDemand, Acquire and Status drop demand whose deadline passed
// before using or reporting it, after which it is unknown (null), not zero. Explicit zero is
// known zero and is no contender. A restart and a new policy generation clear all demand.
// Demand never touches a lease.
//
// Errors: kNotFound (no such pool, profile or lease), kInvalidArgument (a bad name, count or
// TTL), kFailedPrecondition (an incompatible policy, a generation that is not current, a slot
// already leased, an expired or active lease for an operation that needs a provisional one, a
// draining pool, a repeated recovery), kAborted (a stale owner epoch: a replacement manager
// has claimed the profile), kPermissionDenied (an owner key that is not the epoch's).
//
// Not thread-safe: one owner thread (lockd's core).
#ifndef FENCELOCK_LOCK_SERVER_POOL_SERVICE_H_
#define FENCELOCK_LOCK_SERVER_POOL_SERVICE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lock-server/counters.h"
#include "lock-server/options.h"
#include "protocol/defaults.h"
#include "clock/clock.h"
#include "lock-server/state_machine.h"

namespace fencelock::server {

// What a manager presents with every request for its profile.
struct PoolOwner {
  uint64_t epoch = 0;
  std::string key;
};

struct PoolPolicy {
  uint64_t generation = 0;
  uint64_t budget = 0;
  std::vector<PoolProfileDef> profiles;  // any order; ids must be unique
};

struct PoolGrant {
  bool granted = false;
  FenceToken token;                 // granted only
  absl::Duration ttl;               // granted only
  uint64_t decision = 0;            // granted only
  std::string refusal;              // not granted: why, with the figures
};

// Tombstones a status shows (the newest); lockd keeps more (kPoolTombstonesKept).
inline constexpr size_t kPoolTombstonesShown = 64;

// The pools' counters (counters.h's FENCELOCK_POOL_COUNTERS).
struct PoolStats {
  FENCELOCK_COUNTERS_STRUCT_BODY(FENCELOCK_POOL_COUNTERS)
};

class PoolService {
 public:
  // `state` and `commit` (which applies a record to `state` and logs it) outlive the service.
  PoolService(PoolOptions options, const StateMachine* state,
              std::function<void(const Record&, MonoTime)> commit);

  // Publishes `policy` for `pool` (creating the pool). Returns the generation lockd
  // acknowledges, once its record is committed. Publishing the current generation again with
  // the same content is acknowledged again and changes nothing. Refused: a generation not
  // above the current one with other content, a duplicate profile id, a reservation total or
  // a cost above the budget, a budget below the units leased, a policy that drops a profile
  // holding leases. A new generation clears the pool's demand; managers must acknowledge it.
  absl::StatusOr<uint64_t> Publish(const std::string& pool, PoolPolicy policy, MonoTime now);

  // A manager takes `profile`: a new epoch, whose owner key is `key` (random bytes from the
  // caller), claimed by identity `claimed_by` (kept with the epoch: ClaimedBy). `generation`
  // must be the current one. Requests of earlier epochs are refused from now on; their leases
  // stay, for the new manager to reconcile.
  absl::StatusOr<PoolOwner> Claim(const std::string& pool, const std::string& profile,
                                  uint64_t generation, std::string key,
                                  const std::string& claimed_by, MonoTime now);
  // The current owner of `profile`: its epoch (0 if never claimed) and the identity that
  // claimed it ("" if unknown). Null for an unknown pool.
  const PoolOwnerState* Owner(const std::string& pool, const std::string& profile) const;
  // The current owner enforces `generation` (the current one) from now on.
  absl::Status Ack(const std::string& pool, const std::string& profile, const PoolOwner& owner,
                   uint64_t generation, MonoTime now);
  // The profile wants `slots` more slots than it holds (0: known zero).
  absl::Status SetDemand(const std::string& pool, const std::string& profile,
                         const PoolOwner& owner, uint64_t slots, MonoTime now);
  // A provisional lease for `slot` when the units are there (granted), or a refusal that names
  // the figures (not granted; try again later). `ttl` zero asks for the default.
  absl::StatusOr<PoolGrant> Acquire(const std::string& pool, const std::string& profile,
                                    const std::string& slot, const PoolOwner& owner,
                                    absl::Duration ttl, MonoTime now);
  // Renews a provisional lease from `now`; returns its TTL. An active lease needs none (OK).
  absl::StatusOr<absl::Duration> Renew(const std::string& pool, const std::string& profile,
                                       const std::string& slot, FenceToken token,
                                       const PoolOwner& owner, MonoTime now);
  // Makes a provisional lease active (durable, never freed by time). Returns the decision.
  absl::StatusOr<uint64_t> Activate(const std::string& pool, const std::string& profile,
                                    const std::string& slot, FenceToken token,
                                    const PoolOwner& owner, MonoTime now);
  // Releases the exact lease: by its owner's epoch, or by a later epoch's manager that proved
  // the worker absent (reconciled). Returns the decision.
  absl::StatusOr<uint64_t> Release(const std::string& pool, const std::string& profile,
                                   const std::string& slot, FenceToken token,
                                   const PoolOwner& owner, MonoTime now);
  // The operator's fenced recovery of an active lease: a durable tombstone with `evidence`,
  // then the units are free. Refused when repeated (a tombstone for `token` exists), stale (the
  // slot is not held by `token`), or for a provisional lease (it expires by itself).
  absl::StatusOr<uint64_t> Recover(const std::string& pool, const std::string& profile,
                                   const std::string& slot, FenceToken token,
                                   const std::string& evidence, MonoTime now);
  // Draining: no new admission (Acquire and Activate refused) until turned off.
  absl::Status SetDrain(const std::string& pool, bool draining, MonoTime now);
  // Deletes a pool that drains and holds no lease (kFailedPrecondition otherwise, naming what
  // is left): its policy, owners, tombstones and decision sequence, and its demand. Its name
  // and its place among the pools lockd coordinates are free again.
  absl::Status Delete(const std::string& pool, MonoTime now);

  absl::StatusOr<PoolView> Status(const std::string& pool, MonoTime now);
  // The same as of `now` without changing anything (expired demand shows as unknown; a
  // provisional lease past its expiry still shows until the next mutation expires it): for
  // the metrics export.
  // `with_leases` false leaves the leases and tombstones out (the metrics export, every 250 ms,
  // needs only the figures).
  absl::StatusOr<PoolView> View(const std::string& pool, MonoTime now,
                                  bool with_leases = true) const;
  // Names of every pool, ascending.
  std::vector<std::string> PoolNames() const;
  // OK when lockd may stop for the admission rollback: it coordinates a pool, and every pool
  // drains and holds no lease. Otherwise kFailedPrecondition naming what is left.
  absl::Status CheckRetired() const;

  // Expires provisional leases that have run out by `now` (never an active one).
  void Advance(MonoTime now);
  // Every positive demand's deadline moves `d` later: lockd did not run for `d` (a freeze, a
  // suspend), so its managers' refreshes could not arrive (issue 35; ADR-0006's "a manager
  // paused" is the manager's pause, not lockd's).
  void PostponeDemand(absl::Duration d);

  const PoolStats& stats() const { return stats_; }

 private:
  struct Demand {
    uint64_t slots = 0;
    MonoTime expires_at = MonoTime::Max();  // Max() for known zero
  };
  struct Fairness {
    uint64_t fair_units = 0;                            // unreserved + lendable reservations
    uint64_t contenders = 0;
    uint64_t share = 0;
    absl::btree_map<std::string, uint64_t> withheld;    // per contender
  };

  absl::StatusOr<const PoolState*> FindPool(const std::string& pool) const;
  absl::Status CheckName(const char* what, const std::string& name) const;
  // The owner check every manager request passes: the profile exists, `owner` is its current
  // epoch with the right key. A superseded epoch is kAborted (counted).
  absl::Status CheckOwner(const PoolState& p, const std::string& pool,
                          const std::string& profile, const PoolOwner& owner);
  // Advances to `now`, checks the owner, and finds the exact lease; kNotFound ending in
  // `if_missing` when no lease of `slot` has `token`.
  absl::StatusOr<const PoolLeaseState*> OwnedLease(const std::string& pool,
                                                   const std::string& profile,
                                                   const std::string& slot, FenceToken token,
                                                   const PoolOwner& owner, MonoTime now,
                                                   const char* if_missing);
  // Drops `pool`'s demand whose deadline passed by `now`.
  void DropExpiredDemand(const std::string& pool, MonoTime now);
  // The profile's demand if it is current at `now` (known zero included); null when unknown.
  const Demand* CurrentDemand(const std::string& pool, const std::string& profile,
                              MonoTime now) const;
  // The part of `spec`'s free reservation its current demand wants (0 without demand).
  uint64_t ClaimedReservation(const PoolState& p, const std::string& pool,
                              const PoolProfileDef& spec, MonoTime now) const;
  Fairness ComputeFairness(const PoolState& p, const std::string& pool,
                           const std::string* requester, MonoTime now) const;
  uint64_t NextDecision(const std::string& pool) const;

  PoolOptions options_;
  const StateMachine* state_;
  std::function<void(const Record&, MonoTime)> commit_;
  // pool -> profile -> demand
  absl::btree_map<std::string, absl::btree_map<std::string, Demand>> demand_;
  PoolStats stats_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_POOL_SERVICE_H_
