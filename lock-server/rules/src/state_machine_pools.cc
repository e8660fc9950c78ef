// The state machine's admission pools: their records' checks and effects, their expiries, and
// a pool restored from a snapshot (state_machine.h; the lock records are in state_machine.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lock-server/state_machine.h"

namespace fencelock::server {
namespace {

std::string LeaseName(const std::string& pool, const std::string& profile,
                      const std::string& slot) {
  return absl::StrCat(pool, "/", profile, "/", slot);
}

}  // namespace

const PoolProfileDef* PoolState::FindProfile(const std::string& id) const {
  auto it = std::lower_bound(profiles.begin(), profiles.end(), id,
                             [](const PoolProfileDef& p, const std::string& v) { return p.id < v; });
  return it != profiles.end() && it->id == id ? &*it : nullptr;
}

const PoolOwnerState* PoolState::FindOwner(const std::string& profile) const {
  auto it = owners.find(profile);
  return it == owners.end() ? nullptr : &it->second;
}

uint64_t PoolState::UsedBy(const std::string& profile) const {
  auto it = used_by_.find(profile);
  return it == used_by_.end() ? 0 : it->second;
}

uint64_t PoolState::ActiveUnits(const std::string& profile) const {
  uint64_t units = 0;
  for (auto it = leases.lower_bound({profile, ""}); it != leases.end() && it->first.first == profile;
       ++it) {
    if (it->second.active) units += it->second.units;
  }
  return units;
}

const PoolTombstone* PoolState::FindTombstone(uint64_t token) const {
  for (const PoolTombstone& t : tombstones) {
    if (t.token == token) return &t;
  }
  return nullptr;
}

const PoolState* StateMachine::FindPool(const std::string& pool) const {
  auto it = pools_.find(pool);
  return it == pools_.end() ? nullptr : &it->second;
}

absl::Status StateMachine::CheckDecision(const std::string& pool, uint64_t decision) const {
  const PoolState* p = FindPool(pool);
  const uint64_t last = p == nullptr ? 0 : p->decision;
  if (decision != last + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", pool, " decision ", decision, " does not follow decision ", last));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckLease(const std::string& pool, const std::string& profile,
                                      const std::string& slot, FenceToken token) const {
  const PoolState* p = FindPool(pool);
  if (p == nullptr) return absl::FailedPreconditionError(absl::StrCat("no pool ", pool));
  auto it = p->leases.find({profile, slot});
  if (it == p->leases.end() || it->second.token != token) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lease ", LeaseName(pool, profile, slot), " with token ", token, " does not exist"));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::PoolPolicyPublished& r) const {
  const PoolState* p = FindPool(r.pool);
  if (p != nullptr && r.generation <= p->generation) {
    return absl::FailedPreconditionError(absl::StrCat("pool ", r.pool, " generation ",
                                                      r.generation, " not above ", p->generation));
  }
  if (r.generation == 0) return absl::FailedPreconditionError("policy generation 0");
  if (absl::Status s = CheckDecision(r.pool, r.decision); !s.ok()) return s;
  uint64_t reserved = 0;
  for (size_t i = 0; i < r.profiles.size(); ++i) {
    const PoolProfileDef& spec = r.profiles[i];
    if (i > 0 && !(r.profiles[i - 1].id < spec.id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool ", r.pool, " profiles not in ascending order at ", spec.id));
    }
    if (spec.cost == 0 || spec.cost > r.budget || spec.reserved > r.budget) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool ", r.pool, " profile ", spec.id, " has a cost or reservation out of range"));
    }
    reserved += spec.reserved;
  }
  if (reserved > r.budget) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool ", r.pool, " reserves ", reserved, " of ", r.budget, " units"));
  }
  if (p != nullptr) {
    if (p->used() > r.budget) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pool ", r.pool, " budget ", r.budget, " below the ", p->used(), " units leased"));
    }
    for (const auto& [key, lease] : p->leases) {
      if (!std::binary_search(r.profiles.begin(), r.profiles.end(), PoolProfileDef{key.first},
                              [](const PoolProfileDef& a, const PoolProfileDef& b) { return a.id < b.id; })) {
        return absl::FailedPreconditionError(
            absl::StrCat("pool ", r.pool, " policy drops profile ", key.first, " that holds leases"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::PoolProfileClaimed& r) const {
  const PoolState* p = FindPool(r.pool);
  if (p == nullptr || p->FindProfile(r.profile) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("claim of unknown profile ", r.pool, "/", r.profile));
  }
  const PoolOwnerState* owner = p->FindOwner(r.profile);
  const uint64_t last = owner == nullptr ? 0 : owner->epoch;
  if (r.epoch != last + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("claim of ", r.pool, "/", r.profile, " epoch ", r.epoch, " after ", last));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::PoolPolicyAcked& r) const {
  const PoolState* p = FindPool(r.pool);
  const PoolOwnerState* owner = p == nullptr ? nullptr : p->FindOwner(r.profile);
  if (owner == nullptr || owner->epoch != r.epoch || p->generation != r.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ack of ", r.pool, "/", r.profile, " epoch ", r.epoch, " generation ", r.generation,
        " that is not current"));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::PoolLeaseGranted& r) const {
  const PoolState* p = FindPool(r.pool);
  const std::string name = LeaseName(r.pool, r.profile, r.slot);
  if (p == nullptr || p->FindProfile(r.profile) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("grant of ", name, " in no profile"));
  }
  if (r.token <= last_token_) {
    return absl::FailedPreconditionError(
        absl::StrCat("token ", r.token, " not above last token ", last_token_));
  }
  if (p->leases.contains({r.profile, r.slot})) {
    return absl::FailedPreconditionError(absl::StrCat("grant of leased slot ", name));
  }
  if (r.units == 0 || r.units > p->budget - p->used()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "grant of ", name, " for ", r.units, " units with ", p->budget - p->used(), " of ",
        p->budget, " free"));
  }
  const PoolOwnerState* owner = p->FindOwner(r.profile);
  if (owner == nullptr || owner->epoch != r.epoch) {
    return absl::FailedPreconditionError(absl::StrCat("grant of ", name, " to epoch ", r.epoch,
                                                      " that does not own the profile"));
  }
  if (r.ttl <= absl::ZeroDuration()) {
    return absl::FailedPreconditionError(absl::StrCat("grant of ", name, " has no TTL"));
  }
  return CheckDecision(r.pool, r.decision);
}

absl::Status StateMachine::CheckOne(const record::PoolLeaseRenewed& r) const {
  if (absl::Status s = CheckLease(r.pool, r.profile, r.slot, r.token); !s.ok()) return s;
  if (FindPool(r.pool)->leases.at({r.profile, r.slot}).active) {
    return absl::FailedPreconditionError(
        absl::StrCat("renewal of active lease ", LeaseName(r.pool, r.profile, r.slot)));
  }
  return absl::OkStatus();
}

absl::Status StateMachine::CheckOne(const record::PoolLeaseActivated& r) const {
  if (absl::Status s = CheckLease(r.pool, r.profile, r.slot, r.token); !s.ok()) return s;
  if (FindPool(r.pool)->leases.at({r.profile, r.slot}).active) {
    return absl::FailedPreconditionError(
        absl::StrCat("activation of active lease ", LeaseName(r.pool, r.profile, r.slot)));
  }
  return CheckDecision(r.pool, r.decision);
}

absl::Status StateMachine::CheckOne(const record::PoolLeaseReleased& r) const {
  if (absl::Status s = CheckLease(r.pool, r.profile, r.slot, r.token); !s.ok()) return s;
  if (r.reason == PoolReleaseReason::kExpired &&
      FindPool(r.pool)->leases.at({r.profile, r.slot}).active) {
    // ADR-0003: time alone never releases an active lease.
    return absl::FailedPreconditionError(
        absl::StrCat("expiry of active lease ", LeaseName(r.pool, r.profile, r.slot)));
  }
  return CheckDecision(r.pool, r.decision);
}

absl::Status StateMachine::CheckOne(const record::PoolLeaseRecovered& r) const {
  if (absl::Status s = CheckLease(r.pool, r.profile, r.slot, r.token); !s.ok()) return s;
  const PoolState* p = FindPool(r.pool);
  if (!p->leases.at({r.profile, r.slot}).active) {
    return absl::FailedPreconditionError(
        absl::StrCat("recovery of provisional lease ", LeaseName(r.pool, r.profile, r.slot)));
  }
  if (r.evidence.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("recovery of ", LeaseName(r.pool, r.profile, r.slot), " without evidence"));
  }
  return CheckDecision(r.pool, r.decision);
}

absl::Status StateMachine::CheckOne(const record::PoolDrainSet& r) const {
  if (FindPool(r.pool) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("drain of unknown pool ", r.pool));
  }
  return absl::OkStatus();
}

void StateMachine::ApplyOne(const record::PoolPolicyPublished& r, MonoTime) {
  PoolState& p = pools_[r.pool];
  p.generation = r.generation;
  p.budget = r.budget;
  p.profiles = r.profiles;
  p.decision = r.decision;
}

void StateMachine::ApplyOne(const record::PoolProfileClaimed& r, MonoTime) {
  PoolOwnerState& owner = pools_.at(r.pool).owners[r.profile];
  owner.epoch = r.epoch;
  owner.key = r.key_digest;
  owner.acked_generation = r.generation;
  owner.claimed_by = r.claimed_by;
  if (r.read_in_clear) ++secrets_read_in_clear_;
}

void StateMachine::ApplyOne(const record::PoolPolicyAcked& r, MonoTime) {
  pools_.at(r.pool).owners.at(r.profile).acked_generation = r.generation;
}

void StateMachine::ApplyOne(const record::PoolLeaseGranted& r, MonoTime now) {
  PoolState& p = pools_.at(r.pool);
  last_token_ = r.token;
  PoolLeaseState& lease = p.leases[{r.profile, r.slot}];
  lease = PoolLeaseState{.token = r.token,
                         .units = r.units,
                         .epoch = r.epoch,
                         .active = false,
                         .ttl = r.ttl,
                         .expires_at = now + r.ttl,
                         .decision = r.decision};
  p.used_ += r.units;
  p.used_by_[r.profile] += r.units;
  p.decision = r.decision;
  pool_expiry_.emplace(lease.expires_at, r.pool, r.profile, r.slot);
}

void StateMachine::ApplyOne(const record::PoolLeaseRenewed& r, MonoTime now) {
  PoolLeaseState& lease = pools_.at(r.pool).leases.at({r.profile, r.slot});
  pool_expiry_.erase({lease.expires_at, r.pool, r.profile, r.slot});
  lease.expires_at = now + lease.ttl;
  pool_expiry_.emplace(lease.expires_at, r.pool, r.profile, r.slot);
}

void StateMachine::ApplyOne(const record::PoolLeaseActivated& r, MonoTime) {
  PoolState& p = pools_.at(r.pool);
  PoolLeaseState& lease = p.leases.at({r.profile, r.slot});
  pool_expiry_.erase({lease.expires_at, r.pool, r.profile, r.slot});
  lease.active = true;
  lease.decision = r.decision;
  p.decision = r.decision;
}

void StateMachine::RemoveLease(PoolState& p, const std::string& pool_name,
                               const PoolSlotKey& key) {
  auto it = p.leases.find(key);
  if (!it->second.active) pool_expiry_.erase({it->second.expires_at, pool_name, key.first, key.second});
  p.used_ -= it->second.units;
  auto used = p.used_by_.find(key.first);
  used->second -= it->second.units;
  if (used->second == 0) p.used_by_.erase(used);
  p.leases.erase(it);
}

void StateMachine::ApplyOne(const record::PoolLeaseReleased& r, MonoTime) {
  PoolState& p = pools_.at(r.pool);
  RemoveLease(p, r.pool, {r.profile, r.slot});
  p.decision = r.decision;
}

void StateMachine::ApplyOne(const record::PoolLeaseRecovered& r, MonoTime) {
  PoolState& p = pools_.at(r.pool);
  const PoolLeaseState& lease = p.leases.at({r.profile, r.slot});
  p.tombstones.push_back(
      PoolTombstone{r.profile, r.slot, r.token.value(), lease.units, r.decision, r.evidence});
  while (p.tombstones.size() > kPoolTombstonesKept) p.tombstones.pop_front();
  RemoveLease(p, r.pool, {r.profile, r.slot});
  p.decision = r.decision;
}

void StateMachine::ApplyOne(const record::PoolDrainSet& r, MonoTime) {
  pools_.at(r.pool).draining = r.draining;
}

absl::Status StateMachine::CheckOne(const record::PoolDeleted& r) const {
  const PoolState* p = FindPool(r.pool);
  if (p == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("deletion of unknown pool ", r.pool));
  }
  if (!p->draining || !p->leases.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "deletion of pool ", r.pool, p->draining ? "" : " that is not draining", " with ",
        p->leases.size(), " leases"));
  }
  return absl::OkStatus();
}

void StateMachine::ApplyOne(const record::PoolDeleted& r, MonoTime) { pools_.erase(r.pool); }

std::optional<StateMachine::PoolLeaseKey> StateMachine::ExpiredPoolLease(MonoTime now) const {
  if (pool_expiry_.empty() || std::get<0>(*pool_expiry_.begin()) > now) return std::nullopt;
  const auto& [at, pool, profile, slot] = *pool_expiry_.begin();
  return PoolLeaseKey{pool, profile, slot};
}

absl::Status StateMachine::RestorePool(const std::string& name, PoolState pool, MonoTime now) {
  auto bad = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat("pool ", name, ": ", why));
  };
  if (pools_.contains(name)) return bad("appears twice");
  if (pool.generation == 0) return bad("has no policy generation");
  uint64_t reserved = 0;
  for (size_t i = 0; i < pool.profiles.size(); ++i) {
    if (i > 0 && !(pool.profiles[i - 1].id < pool.profiles[i].id)) {
      return bad(absl::StrCat("profile ", pool.profiles[i].id, " out of order or repeated"));
    }
    if (pool.profiles[i].cost == 0) return bad(absl::StrCat("profile ", pool.profiles[i].id, " costs 0"));
    reserved += pool.profiles[i].reserved;
  }
  if (reserved > pool.budget) return bad("reserves more than its budget");
  pool.used_ = 0;
  pool.used_by_.clear();
  for (auto& [key, lease] : pool.leases) {
    if (pool.FindProfile(key.first) == nullptr) {
      return bad(absl::StrCat("lease of unknown profile ", key.first));
    }
    if (lease.token.value() == 0 || lease.token > last_token_) {
      return bad(absl::StrCat("lease token ", lease.token, " above the token sequence ", last_token_));
    }
    if (lease.units == 0 || lease.decision > pool.decision) {
      return bad(absl::StrCat("lease of ", key.first, "/", key.second, " is inconsistent"));
    }
    const PoolOwnerState* owner = pool.FindOwner(key.first);
    if (owner == nullptr || lease.epoch > owner->epoch) {
      return bad(absl::StrCat("lease of ", key.first, "/", key.second, " has no owner epoch"));
    }
    pool.used_ += lease.units;
    pool.used_by_[key.first] += lease.units;
    if (!lease.active) {
      if (lease.ttl <= absl::ZeroDuration()) return bad("provisional lease without a TTL");
      lease.expires_at = now + lease.ttl;
    }
  }
  if (pool.used_ > pool.budget) {
    return bad(absl::StrCat("leases hold ", pool.used_, " units of a budget of ", pool.budget));
  }
  for (const auto& [profile, owner] : pool.owners) {
    if (owner.epoch == 0) return bad(absl::StrCat("owner of ", profile, " has epoch 0"));
  }
  for (const auto& [key, lease] : pool.leases) {
    if (!lease.active) pool_expiry_.emplace(lease.expires_at, name, key.first, key.second);
  }
  pools_.emplace(name, std::move(pool));
  return absl::OkStatus();
}

}  // namespace fencelock::server
