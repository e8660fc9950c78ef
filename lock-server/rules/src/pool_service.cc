#include "lock-server/pool_service.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace fencelock::server {
namespace {

uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) {
    return std::numeric_limits<uint64_t>::max();
  }
  return a * b;
}

uint64_t FreeReservation(const PoolState& p, const PoolProfileDef& spec) {
  const uint64_t used = p.UsedBy(spec.id);
  return spec.reserved > used ? spec.reserved - used : 0;
}

uint64_t Excess(const PoolState& p, const PoolProfileDef& spec) {
  const uint64_t used = p.UsedBy(spec.id);
  return used > spec.reserved ? used - spec.reserved : 0;
}

std::string Lease(const std::string& pool, const std::string& profile, const std::string& slot) {
  return absl::StrCat(pool, "/", profile, "/", slot);
}

}  // namespace

PoolService::PoolService(PoolOptions options, const StateMachine* state,
                         std::function<void(const Record&, MonoTime)> commit)
    : options_(std::move(options)), state_(state), commit_(std::move(commit)) {}

absl::Status PoolService::CheckName(const char* what, const std::string& name) const {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat("the ", what, " name is empty"));
  if (name.size() > options_.max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " name is ", name.size(),
                                                   " bytes, more than ", options_.max_name_bytes));
  }
  for (unsigned char c : name) {
    if (c <= ' ' || c == 0x7f || c == '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", what, " name \"", name, "\" has a space, a control character or a slash"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const PoolState*> PoolService::FindPool(const std::string& pool) const {
  if (absl::Status s = CheckName("pool", pool); !s.ok()) return s;
  const PoolState* p = state_->FindPool(pool);
  if (p == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no pool \"", pool, "\": publish its policy first (lockctl pool publish)"));
  }
  return p;
}

uint64_t PoolService::NextDecision(const std::string& pool) const {
  const PoolState* p = state_->FindPool(pool);
  return (p == nullptr ? 0 : p->decision) + 1;
}

absl::Status PoolService::CheckOwner(const PoolState& p, const std::string& pool,
                                     const std::string& profile, const PoolOwner& owner) {
  if (absl::Status s = CheckName("profile", profile); !s.ok()) return s;
  if (p.FindProfile(profile) == nullptr) {
    return absl::NotFoundError(absl::StrCat("pool ", pool, " generation ", p.generation,
                                            " has no profile \"", profile, "\""));
  }
  const PoolOwnerState* current = p.FindOwner(profile);
  if (current == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "profile ", pool, "/", profile, " has no manager: claim it first (lockctl pool claim)"));
  }
  if (owner.epoch < current->epoch) {
    ++stats_.stale_owner_total;
    return absl::AbortedError(absl::StrCat(
        "stale manager: profile ", pool, "/", profile, " was claimed by epoch ", current->epoch,
        " since this manager's epoch ", owner.epoch, "; its leases are the new manager's"));
  }
  // The digests are compared in full whatever differs, so the time taken tells nothing.
  const std::string given = PoolOwnerKeyDigest(pool, profile, owner.epoch, owner.key);
  unsigned char diff = given.size() == current->key.size() && !given.empty() ? 0 : 1;
  for (size_t i = 0; i < given.size() && i < current->key.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ current->key[i]);
  }
  if (owner.epoch > current->epoch || diff != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the owner key does not match epoch ", owner.epoch, " of ", pool, "/", profile));
  }
  return absl::OkStatus();
}

void PoolService::DropExpiredDemand(const std::string& pool, MonoTime now) {
  auto it = demand_.find(pool);
  if (it == demand_.end()) return;
  for (auto d = it->second.begin(); d != it->second.end();) {
    if (d->second.slots > 0 && d->second.expires_at <= now) {
      ++stats_.demand_expiries_total;
      d = it->second.erase(d);
    } else {
      ++d;
    }
  }
}

const PoolService::Demand* PoolService::CurrentDemand(const std::string& pool,
                                                      const std::string& profile,
                                                      MonoTime now) const {
  auto pool_demand = demand_.find(pool);
  if (pool_demand == demand_.end()) return nullptr;
  auto d = pool_demand->second.find(profile);
  if (d == pool_demand->second.end()) return nullptr;
  if (d->second.slots > 0 && d->second.expires_at <= now) return nullptr;  // expired: unknown
  return &d->second;
}

uint64_t PoolService::ClaimedReservation(const PoolState& p, const std::string& pool,
                                         const PoolProfileDef& spec, MonoTime now) const {
  const Demand* d = CurrentDemand(pool, spec.id, now);
  if (d == nullptr || d->slots == 0) return 0;
  return std::min(FreeReservation(p, spec), SaturatingMul(d->slots, spec.cost));
}

PoolService::Fairness PoolService::ComputeFairness(const PoolState& p, const std::string& pool,
                                                   const std::string* requester,
                                                   MonoTime now) const {
  Fairness f;
  // The fair units: the unreserved ones, and the lendable reservations except what their own
  // profiles want back now (a reservation serves its owner first).
  uint64_t reserved = 0;
  uint64_t lendable = 0;
  for (const PoolProfileDef& spec : p.profiles) {
    reserved += spec.reserved;
    if (spec.lendable) lendable += spec.reserved - ClaimedReservation(p, pool, spec, now);
  }
  f.fair_units = p.budget - reserved + lendable;
  std::vector<const PoolProfileDef*> contenders;
  for (const PoolProfileDef& spec : p.profiles) {
    const bool is_requester = requester != nullptr && *requester == spec.id;
    const Demand* d = CurrentDemand(pool, spec.id, now);
    if ((d != nullptr && d->slots > 0) || is_requester) contenders.push_back(&spec);
  }
  f.contenders = contenders.size();
  f.share = f.contenders == 0 ? 0 : f.fair_units / f.contenders;
  for (const PoolProfileDef* spec : contenders) {
    if (requester != nullptr && *requester == spec->id) continue;
    const uint64_t slots = CurrentDemand(pool, spec->id, now)->slots;
    const uint64_t wanted = SaturatingMul(slots, spec->cost);
    const uint64_t own = FreeReservation(p, *spec);
    const uint64_t need = wanted > own ? wanted - own : 0;
    const uint64_t excess = Excess(p, *spec);
    const uint64_t room = f.share > excess ? f.share - excess : 0;
    f.withheld[spec->id] = std::min(need, room);
  }
  return f;
}

absl::StatusOr<uint64_t> PoolService::Publish(const std::string& pool, PoolPolicy policy,
                                              MonoTime now) {
  if (absl::Status s = CheckName("pool", pool); !s.ok()) return s;
  if (policy.generation == 0) {
    return absl::InvalidArgumentError("a policy generation starts at 1");
  }
  if (policy.budget == 0 || policy.budget > options_.max_budget) {
    return absl::InvalidArgumentError(absl::StrCat("pool budget ", policy.budget,
                                                   " is outside [1, ", options_.max_budget, "]"));
  }
  if (policy.profiles.empty() || policy.profiles.size() > options_.max_profiles) {
    return absl::InvalidArgumentError(absl::StrCat("a policy has 1 to ", options_.max_profiles,
                                                   " profiles, this one ",
                                                   policy.profiles.size()));
  }
  std::sort(policy.profiles.begin(), policy.profiles.end(),
            [](const PoolProfileDef& a, const PoolProfileDef& b) { return a.id < b.id; });
  uint64_t reserved = 0;
  for (size_t i = 0; i < policy.profiles.size(); ++i) {
    const PoolProfileDef& spec = policy.profiles[i];
    if (absl::Status s = CheckName("profile", spec.id); !s.ok()) return s;
    if (i > 0 && policy.profiles[i - 1].id == spec.id) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate profile identity \"", spec.id, "\" in the policy"));
    }
    if (spec.cost == 0 || spec.cost > policy.budget) {
      return absl::InvalidArgumentError(absl::StrCat("profile ", spec.id, " costs ", spec.cost,
                                                     " units; a cost is 1 to the budget ",
                                                     policy.budget));
    }
    if (spec.reserved > policy.budget) {
      return absl::InvalidArgumentError(absl::StrCat("profile ", spec.id, " reserves ",
                                                     spec.reserved, " of ", policy.budget));
    }
    reserved += spec.reserved;
  }
  if (reserved > policy.budget) {
    return absl::InvalidArgumentError(absl::StrCat("the reservations add up to ", reserved,
                                                   " units, more than the budget ",
                                                   policy.budget));
  }
  const PoolState* current = state_->FindPool(pool);
  if (current == nullptr && state_->pools().size() >= options_.max_pools) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "lockd already coordinates ", state_->pools().size(),
        " pools, the most it may; delete one no longer used (lockctl pool delete --pool=NAME) "
        "to make room"));
  }
  if (current != nullptr) {
    if (policy.generation == current->generation && policy.budget == current->budget &&
        policy.profiles == current->profiles) {
      return policy.generation;  // the same policy again: acknowledged again
    }
    if (policy.generation <= current->generation) {
      return absl::FailedPreconditionError(absl::StrCat(
          "incompatible policy generation ", policy.generation, " for pool ", pool,
          ": generation ", current->generation,
          " is published with other content; a new policy needs a higher generation"));
    }
    if (current->used() > policy.budget) {
      return absl::FailedPreconditionError(absl::StrCat(
          "incompatible policy generation ", policy.generation, ": budget ", policy.budget,
          " is below the ", current->used(), " units pool ", pool, " has leased"));
    }
    for (const auto& entry : current->leases) {
      const std::string& leased = entry.first.first;
      if (std::none_of(policy.profiles.begin(), policy.profiles.end(),
                       [&](const PoolProfileDef& s) { return s.id == leased; })) {
        return absl::FailedPreconditionError(absl::StrCat(
            "incompatible policy generation ", policy.generation, ": it drops profile ",
            leased, ", which holds leases in pool ", pool));
      }
    }
  }
  commit_(record::PoolPolicyPublished{pool, policy.generation, policy.budget,
                                      std::move(policy.profiles), NextDecision(pool)},
          now);
  demand_.erase(pool);  // ADR-0006: policy replacement clears all demand
  return state_->FindPool(pool)->generation;
}

absl::StatusOr<PoolOwner> PoolService::Claim(const std::string& pool, const std::string& profile,
                                             uint64_t generation, std::string key,
                                             const std::string& claimed_by, MonoTime now) {
  auto p = FindPool(pool);
  if (!p.ok()) return p.status();
  if (absl::Status s = CheckName("profile", profile); !s.ok()) return s;
  if ((*p)->FindProfile(profile) == nullptr) {
    return absl::NotFoundError(absl::StrCat("pool ", pool, " generation ", (*p)->generation,
                                            " has no profile \"", profile, "\""));
  }
  if (generation != (*p)->generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incompatible policy generation: this manager enforces ", generation, ", pool ", pool,
        " publishes ", (*p)->generation));
  }
  const PoolOwnerState* current = (*p)->FindOwner(profile);
  const uint64_t epoch = (current == nullptr ? 0 : current->epoch) + 1;
  // Only the digest is kept: whoever reads the log or etcd cannot act for the manager.
  commit_(record::PoolProfileClaimed{pool, profile, epoch,
                                     PoolOwnerKeyDigest(pool, profile, epoch, key), generation,
                                     claimed_by},
          now);
  return PoolOwner{epoch, std::move(key)};
}

void PoolService::PostponeDemand(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  for (auto& [pool, profiles] : demand_) {
    for (auto& [profile, demand] : profiles) {
      if (demand.expires_at != MonoTime::Max()) demand.expires_at = demand.expires_at + d;
    }
  }
}

const PoolOwnerState* PoolService::Owner(const std::string& pool,
                                         const std::string& profile) const {
  auto p = FindPool(pool);
  return p.ok() ? (*p)->FindOwner(profile) : nullptr;
}

absl::Status PoolService::Ack(const std::string& pool, const std::string& profile,
                              const PoolOwner& owner, uint64_t generation, MonoTime now) {
  auto p = FindPool(pool);
  if (!p.ok()) return p.status();
  if (absl::Status s = CheckOwner(**p, pool, profile, owner); !s.ok()) return s;
  if (generation != (*p)->generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "incompatible policy generation ", generation, ": pool ", pool, " publishes ",
        (*p)->generation));
  }
  if ((*p)->FindOwner(profile)->acked_generation == generation) return absl::OkStatus();
  commit_(record::PoolPolicyAcked{pool, profile, owner.epoch, generation}, now);
  return absl::OkStatus();
}

absl::Status PoolService::SetDemand(const std::string& pool, const std::string& profile,
                                    const PoolOwner& owner, uint64_t slots, MonoTime now) {
  auto p = FindPool(pool);
  if (!p.ok()) return p.status();
  if (absl::Status s = CheckOwner(**p, pool, profile, owner); !s.ok()) return s;
  if (slots > options_.max_budget) {
    return absl::InvalidArgumentError(
        absl::StrCat("demand of ", slots, " slots is more than any budget (", options_.max_budget, ")"));
  }
  DropExpiredDemand(pool, now);
  Demand& d = demand_[pool][profile];
  d.slots = slots;
  d.expires_at = slots > 0 ? now + options_.demand_ttl : MonoTime::Max();
  return absl::OkStatus();
}

absl::StatusOr<PoolGrant> PoolService::Acquire(const std::string& pool,
                                               const std::string& profile,
                                               const std::string& slot, const PoolOwner& owner,
                                               absl::Duration ttl, MonoTime now) {
  Advance(now);
  auto found = FindPool(pool);
  if (!found.ok()) return found.status();
  const PoolState& p = **found;
  if (absl::Status s = CheckOwner(p, pool, profile, owner); !s.ok()) return s;
  if (absl::Status s = CheckName("slot", slot); !s.ok()) return s;
  if (ttl == absl::ZeroDuration()) ttl = options_.default_provisional_ttl;
  if (ttl < options_.min_provisional_ttl || ttl > options_.max_provisional_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "provisional TTL ", absl::FormatDuration(ttl), " is outside [",
        absl::FormatDuration(options_.min_provisional_ttl), ", ",
        absl::FormatDuration(options_.max_provisional_ttl), "]"));
  }
  if (p.draining) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool ", pool, " is draining (lockctl pool drain): no new admission"));
  }
  const PoolOwnerState& current = *p.FindOwner(profile);
  if (current.acked_generation != p.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", pool, " publishes policy generation ", p.generation, "; this manager enforces ",
        current.acked_generation, ": acknowledge the new generation first (lockctl pool ack)"));
  }
  if (auto it = p.leases.find({profile, slot}); it != p.leases.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slot ", Lease(pool, profile, slot), " is already leased (token ", it->second.token, ", ",
        it->second.active ? "active" : "provisional", ")"));
  }
  // ADR-0006: Acquire creates or refreshes the demand deadline before fairness is evaluated.
  DropExpiredDemand(pool, now);
  Demand& demand = demand_[pool][profile];
  if (demand.slots == 0) demand.slots = 1;
  demand.expires_at = now + options_.demand_ttl;

  const PoolProfileDef& spec = *p.FindProfile(profile);
  const Fairness f = ComputeFairness(p, pool, &profile, now);
  const uint64_t free_units = p.budget - p.used();
  const uint64_t own_free = FreeReservation(p, spec);
  const uint64_t from_own = std::min(spec.cost, own_free);
  const uint64_t from_fair = spec.cost - from_own;
  // Other profiles' free reservations this one may not use: every non-lendable one, and a
  // lendable one as far as its owner wants it back now (lent units are never taken back from a
  // lease, but free ones are not lent anew against their owner's current demand).
  uint64_t kept_for_others = 0;
  for (const PoolProfileDef& q : p.profiles) {
    if (q.id == profile) continue;
    kept_for_others += !q.lendable || !spec.borrow ? FreeReservation(p, q)
                                                   : ClaimedReservation(p, pool, q, now);
  }
  uint64_t withheld = 0;
  for (const auto& [id, units] : f.withheld) withheld += units;
  const int64_t fair_free = static_cast<int64_t>(free_units) - static_cast<int64_t>(own_free) -
                            static_cast<int64_t>(kept_for_others) -
                            static_cast<int64_t>(withheld);
  PoolGrant grant;
  if (spec.cost > free_units || (from_fair > 0 && static_cast<int64_t>(from_fair) > fair_free)) {
    ++stats_.refusals_total;
    grant.refusal = absl::StrCat(
        "no units for ", Lease(pool, profile, slot), " (cost ", spec.cost, "): ", free_units,
        " of ", p.budget, " free, ",
        own_free > free_units
            ? absl::StrCat("its reservation's ", own_free - free_units,
                           " lent to active leases (never taken back), ")
            : absl::StrCat(own_free, " of them its own reservation, "),
        kept_for_others,
        " reserved for other profiles, ", withheld, " withheld for ", f.contenders - 1,
        " other contenders (fair share ", f.share, " of ", f.fair_units, " fair units)");
    return grant;
  }
  const FenceToken token = state_->last_token().Next();
  const uint64_t decision = NextDecision(pool);
  commit_(record::PoolLeaseGranted{pool, profile, slot, token, spec.cost, owner.epoch, ttl,
                                   decision},
          now);
  ++stats_.grants_total;
  Demand& after = demand_[pool][profile];
  after.slots -= 1;
  if (after.slots == 0) after.expires_at = MonoTime::Max();
  grant.granted = true;
  grant.token = token;
  grant.ttl = ttl;
  grant.decision = decision;
  return grant;
}

absl::StatusOr<const PoolLeaseState*> PoolService::OwnedLease(
    const std::string& pool, const std::string& profile, const std::string& slot,
    FenceToken token, const PoolOwner& owner, MonoTime now, const char* if_missing) {
  Advance(now);
  auto p = FindPool(pool);
  if (!p.ok()) return p.status();
  if (absl::Status s = CheckOwner(**p, pool, profile, owner); !s.ok()) return s;
  auto it = (*p)->leases.find({profile, slot});
  if (it == (*p)->leases.end() || it->second.token != token) {
    return absl::NotFoundError(
        absl::StrCat("no lease ", Lease(pool, profile, slot), " with token ", token, if_missing));
  }
  return &it->second;
}

absl::StatusOr<absl::Duration> PoolService::Renew(const std::string& pool,
                                                  const std::string& profile,
                                                  const std::string& slot, FenceToken token,
                                                  const PoolOwner& owner, MonoTime now) {
  auto lease = OwnedLease(pool, profile, slot, token, owner, now,
                          ": it expired, was released, or never existed");
  if (!lease.ok()) return lease.status();
  const absl::Duration ttl = (*lease)->ttl;
  if ((*lease)->active) return ttl;
  commit_(record::PoolLeaseRenewed{pool, profile, slot, token}, now);
  return ttl;
}

absl::StatusOr<uint64_t> PoolService::Activate(const std::string& pool,
                                               const std::string& profile,
                                               const std::string& slot, FenceToken token,
                                               const PoolOwner& owner, MonoTime now) {
  auto lease = OwnedLease(
      pool, profile, slot, token, owner, now,
      ": it expired or was released; remove the worker you created and do not start it");
  if (!lease.ok()) return lease.status();
  if ((*lease)->active) return (*lease)->decision;  // a retried activation
  if (state_->FindPool(pool)->draining) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", pool, " is draining (lockctl pool drain): no new admission; release the "
        "provisional lease and do not start the worker"));
  }
  const uint64_t decision = NextDecision(pool);
  commit_(record::PoolLeaseActivated{pool, profile, slot, token, decision}, now);
  return decision;
}

absl::StatusOr<uint64_t> PoolService::Release(const std::string& pool,
                                              const std::string& profile,
                                              const std::string& slot, FenceToken token,
                                              const PoolOwner& owner, MonoTime now) {
  auto lease = OwnedLease(pool, profile, slot, token, owner, now, " to release");
  if (!lease.ok()) return lease.status();
  const bool reconciled = (*lease)->epoch < owner.epoch;
  const uint64_t decision = NextDecision(pool);
  commit_(record::PoolLeaseReleased{pool, profile, slot, token,
                                    reconciled ? PoolReleaseReason::kReconciled
                                               : PoolReleaseReason::kReleased,
                                    decision},
          now);
  ++(reconciled ? stats_.reconciliations_total : stats_.releases_total);
  return decision;
}

absl::StatusOr<uint64_t> PoolService::Recover(const std::string& pool,
                                              const std::string& profile,
                                              const std::string& slot, FenceToken token,
                                              const std::string& evidence, MonoTime now) {
  Advance(now);
  auto p = FindPool(pool);
  if (!p.ok()) return p.status();
  if (absl::Status s = CheckName("profile", profile); !s.ok()) return s;
  if (absl::Status s = CheckName("slot", slot); !s.ok()) return s;
  if (evidence.empty() || evidence.size() > options_.max_evidence_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a recovery records the evidence that the worker is gone: 1 to ",
        options_.max_evidence_bytes, " bytes (--evidence)"));
  }
  if (const PoolTombstone* t = (*p)->FindTombstone(token.value()); t != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "repeated recovery: token ", token, " of ", Lease(pool, t->profile, t->slot),
        " was recovered at decision ", t->decision));
  }
  auto it = (*p)->leases.find({profile, slot});
  if (it == (*p)->leases.end() || it->second.token != token) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stale recovery: ", Lease(pool, profile, slot), " is not held by token ", token,
        it == (*p)->leases.end() ? std::string(" (no lease)")
                                 : absl::StrCat(" (it holds token ", it->second.token, ")")));
  }
  if (!it->second.active) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lease ", Lease(pool, profile, slot), " is provisional: it expires by itself"));
  }
  const uint64_t decision = NextDecision(pool);
  commit_(record::PoolLeaseRecovered{pool, profile, slot, token, evidence, decision}, now);
  ++stats_.recoveries_total;
  return decision;
}

absl::Status PoolService::SetDrain(const std::string& pool, bool draining, MonoTime now) {
  auto p = FindPool(pool);
  if (!p.ok()) return p.status();
  if ((*p)->draining == draining) return absl::OkStatus();
  commit_(record::PoolDrainSet{pool, draining}, now);
  return absl::OkStatus();
}

absl::Status PoolService::Delete(const std::string& pool, MonoTime now) {
  Advance(now);  // provisional leases past their expiry go first
  auto p = FindPool(pool);
  if (!p.ok()) return p.status();
  if (!(*p)->draining || !(*p)->leases.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool ", pool, " is deleted only once it drains and holds no lease: ",
        (*p)->draining ? "" : "it is not draining (lockctl pool drain), ",
        (*p)->leases.size(), " leases remain"));
  }
  commit_(record::PoolDeleted{pool}, now);
  demand_.erase(pool);
  return absl::OkStatus();
}

absl::StatusOr<PoolView> PoolService::Status(const std::string& pool, MonoTime now) {
  Advance(now);
  DropExpiredDemand(pool, now);
  return View(pool, now);
}

absl::StatusOr<PoolView> PoolService::View(const std::string& pool, MonoTime now,
                                             bool with_leases) const {
  auto found = FindPool(pool);
  if (!found.ok()) return found.status();
  const PoolState& p = **found;
  const Fairness f = ComputeFairness(p, pool, nullptr, now);
  PoolView out;
  out.pool = pool;
  out.generation = p.generation;
  out.budget = p.budget;
  out.used_units = p.used();
  out.decision = p.decision;
  out.draining = p.draining;
  out.complete = true;
  for (const PoolProfileDef& spec : p.profiles) {
    PoolProfileView ps;
    ps.profile = spec;
    ps.active_units = p.ActiveUnits(spec.id);
    ps.provisional_units = p.UsedBy(spec.id) - ps.active_units;
    if (const Demand* d = CurrentDemand(pool, spec.id, now); d != nullptr) {
      ps.pending_units = SaturatingMul(d->slots, spec.cost);
      auto w = f.withheld.find(spec.id);
      ps.withheld_units = w == f.withheld.end() ? 0 : w->second;
      if (d->slots > 0) ps.demand_expires_in = d->expires_at - now;
    }
    if (const PoolOwnerState* owner = p.FindOwner(spec.id); owner != nullptr) {
      ps.owner_epoch = owner->epoch;
      ps.acked_generation = owner->acked_generation;
      ps.compatible = owner->acked_generation == p.generation;
    }
    out.complete = out.complete && ps.compatible;
    out.profiles.push_back(std::move(ps));
  }
  out.tombstones_kept = p.tombstones.size();
  if (!with_leases) return out;
  for (const auto& [key, lease] : p.leases) {
    out.leases.push_back(PoolLeaseView{
        .profile = key.first,
        .slot = key.second,
        .token = lease.token.value(),
        .units = lease.units,
        .epoch = lease.epoch,
        .active = lease.active,
        .expires_in = lease.active ? absl::ZeroDuration()
                                   : std::max(absl::ZeroDuration(), lease.expires_at - now),
        .decision = lease.decision});
  }
  const size_t shown = std::min(p.tombstones.size(), kPoolTombstonesShown);
  out.tombstones.assign(p.tombstones.end() - static_cast<std::ptrdiff_t>(shown), p.tombstones.end());
  return out;
}

std::vector<std::string> PoolService::PoolNames() const {
  std::vector<std::string> names;
  for (const auto& [name, pool] : state_->pools()) names.push_back(name);
  return names;
}

absl::Status PoolService::CheckRetired() const {
  if (state_->pools().empty()) {
    return absl::FailedPreconditionError(
        "lockd coordinates no pool: PoolStop is the admission rollback's last step; stop a "
        "lock server with SIGTERM");
  }
  std::string open;
  for (const auto& [name, p] : state_->pools()) {
    if (p.draining && p.leases.empty()) continue;
    absl::StrAppend(&open, open.empty() ? "" : ", ", name, p.draining ? "" : " (not draining)",
                    p.leases.empty() ? "" : absl::StrCat(" (", p.leases.size(), " leases)"));
  }
  if (open.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "lockd stops only once every pool drains and holds no active or provisional lease: ",
      open));
}

void PoolService::Advance(MonoTime now) {
  while (auto key = state_->ExpiredPoolLease(now)) {
    const PoolState* p = state_->FindPool(key->pool);
    const PoolLeaseState& lease = p->leases.at({key->profile, key->slot});
    const MonoTime at = lease.expires_at;
    commit_(record::PoolLeaseReleased{key->pool, key->profile, key->slot, lease.token,
                                      PoolReleaseReason::kExpired, p->decision + 1},
            at);
    ++stats_.provisional_expiries_total;
  }
}

}  // namespace fencelock::server
