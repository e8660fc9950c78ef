// An admission pool's values as every side sees them (docs/admission.md): a profile's
// definition (what an operator publishes, what lockd keeps and shows), a tombstone (a lease an
// operator recovered), and a pool's status. lockd's PoolService::Status returns a PoolView,
// protocol/pool_wire.h puts it on the wire and reads it back, and the client's
// PoolClient::status returns it: one set of types for the three.
//
// Plain values: no protobuf, no I/O (installed with the client's headers).
#ifndef FENCELOCK_PROTOCOL_POOL_VIEW_H_
#define FENCELOCK_PROTOCOL_POOL_VIEW_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/export.h"

namespace fencelock {

// One profile of a pool's policy.
struct FENCELOCK_API PoolProfileDef {
  std::string id;          // stable identity, unique in the policy
  uint64_t cost = 1;       // units one slot of this profile takes
  uint64_t reserved = 0;   // units kept for this profile alone (or lent: `lendable`)
  bool lendable = false;   // its unused reservation may be lent to borrowing profiles
  bool borrow = false;     // it may borrow other profiles' lendable reservations
  bool operator==(const PoolProfileDef&) const = default;
  // "id[:cost=N][:reserve=N][:lendable][:borrow]" (lockctl's --profiles, comma-separated).
  static absl::StatusOr<PoolProfileDef> Parse(const std::string& text);
};

// A lease an operator recovered (PoolRecover): kept so that the same recovery is refused again.
struct PoolTombstone {
  std::string profile;
  std::string slot;
  uint64_t token = 0;
  uint64_t units = 0;
  uint64_t decision = 0;
  std::string evidence;  // what the operator recorded as proof the worker is gone
  bool operator==(const PoolTombstone&) const = default;
};

// One profile as a status shows it.
struct PoolProfileView {
  PoolProfileDef profile;
  uint64_t active_units = 0;
  uint64_t provisional_units = 0;
  // Null when lockd holds no current demand for the profile (never published, or expired).
  std::optional<uint64_t> pending_units;
  std::optional<uint64_t> withheld_units;  // units protected for it from the others
  std::optional<absl::Duration> demand_expires_in;
  uint64_t owner_epoch = 0;                // 0: no manager ever claimed it
  uint64_t acked_generation = 0;
  // A manager claimed it and acknowledged the current generation.
  bool compatible = false;
  bool operator==(const PoolProfileView&) const = default;
};

struct PoolLeaseView {
  std::string profile;
  std::string slot;
  uint64_t token = 0;
  uint64_t units = 0;
  uint64_t epoch = 0;          // the owner epoch that acquired it
  bool active = false;
  absl::Duration expires_in;   // provisional only
  uint64_t decision = 0;       // the decision that granted (or activated) it
  bool operator==(const PoolLeaseView&) const = default;
};

struct PoolView {
  std::string pool;
  uint64_t generation = 0;
  uint64_t budget = 0;
  uint64_t used_units = 0;
  uint64_t decision = 0;
  bool draining = false;
  // Every profile of the policy has a compatible manager: only then is the guarantee complete.
  bool complete = false;
  std::string degraded;        // non-empty after a coordinator fault: no new admission
  std::vector<PoolProfileView> profiles;
  std::vector<PoolLeaseView> leases;
  std::vector<PoolTombstone> tombstones;  // the newest 64, oldest first
  uint64_t tombstones_kept = 0;           // all that lockd keeps (at most 1024)
  bool operator==(const PoolView&) const = default;
};

}  // namespace fencelock

#endif  // FENCELOCK_PROTOCOL_POOL_VIEW_H_
