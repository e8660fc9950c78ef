// Admission pools' durable state (ADR-0003, docs/admission.md): each pool's published policy,
// its profiles' owners (the managers, by epoch), its leases, its recovery tombstones and its
// decision sequence. The records that change it are in state_machine.h (record::Pool*); the
// rules that choose them (fairness, demand, who may do what) are in pool_service.h.
//
// A pool has a budget of abstract units. A lease holds one slot of one profile, costing the
// profile's units, and is provisional (it expires on lockd's clock unless renewed) or active
// (durable, never freed by time). The one invariant the table enforces on every record, in
// replay as much as in service: the units of a pool's leases never exceed its budget.
//
// Not thread-safe: part of the StateMachine, which one thread owns.
#ifndef FENCELOCK_LOCK_SERVER_POOL_STATE_H_
#define FENCELOCK_LOCK_SERVER_POOL_STATE_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/time/time.h"
#include "clock/clock.h"
#include "protocol/ids.h"
#include "protocol/pool_view.h"

namespace fencelock::server {

enum class PoolReleaseReason {
  kReleased,    // its owner saw the worker exit
  kReconciled,  // a later epoch's manager proved the worker absent
  kExpired,     // a provisional lease ran out (never an active one)
};

// Tombstones kept per pool (status and the repeated-recovery refusal); the oldest go first.
inline constexpr size_t kPoolTombstonesKept = 1024;

struct PoolLeaseState {
  FenceToken token;
  uint64_t units = 0;
  uint64_t epoch = 0;             // the owner epoch that acquired it
  bool active = false;
  absl::Duration ttl;             // provisional lease TTL (kept when active, for status)
  MonoTime expires_at;            // provisional only; meaningless once active
  uint64_t decision = 0;          // the decision that granted (or activated) it
};

struct PoolOwnerState {
  uint64_t epoch = 0;             // 0: never claimed
  // PoolOwnerKeyDigest() of what proves a request is this epoch's manager (never the key).
  std::string key;
  uint64_t acked_generation = 0;  // the policy generation this manager said it enforces
  std::string claimed_by;         // who claimed this epoch ("" if unknown: an older record)
};

// (profile, slot)
using PoolSlotKey = std::pair<std::string, std::string>;

struct PoolState {
  uint64_t generation = 0;
  uint64_t budget = 0;
  std::vector<PoolProfileDef> profiles;  // ascending id
  absl::btree_map<PoolSlotKey, PoolLeaseState> leases;
  absl::btree_map<std::string, PoolOwnerState> owners;  // by profile
  std::deque<PoolTombstone> tombstones;                 // oldest first
  uint64_t decision = 0;                                // the last decision's number
  bool draining = false;

  const PoolProfileDef* FindProfile(const std::string& id) const;
  const PoolOwnerState* FindOwner(const std::string& profile) const;
  // Units held by the pool's leases (all, or one profile's; active or provisional).
  uint64_t used() const { return used_; }
  uint64_t UsedBy(const std::string& profile) const;
  uint64_t ActiveUnits(const std::string& profile) const;
  const PoolTombstone* FindTombstone(uint64_t token) const;

  // Maintained by the StateMachine with the leases.
  uint64_t used_ = 0;
  absl::btree_map<std::string, uint64_t> used_by_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_POOL_STATE_H_
