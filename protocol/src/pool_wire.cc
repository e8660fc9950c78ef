#include "protocol/pool_wire.h"

#include "protocol/millis.h"

namespace fencelock::protocol {

wire::PoolProfile ToWire(const PoolProfileDef& profile) {
  wire::PoolProfile out;
  out.set_id(profile.id);
  out.set_cost(profile.cost);
  out.set_reserved(profile.reserved);
  out.set_lendable(profile.lendable);
  out.set_borrow(profile.borrow);
  return out;
}

PoolProfileDef FromWire(const wire::PoolProfile& p) {
  return PoolProfileDef{p.id(), p.cost(), p.reserved(), p.lendable(), p.borrow()};
}

void ToWire(const PoolView& s, wire::PoolStatusReply* out) {
  out->set_pool(s.pool);
  out->set_generation(s.generation);
  out->set_budget(s.budget);
  out->set_used_units(s.used_units);
  out->set_decision(s.decision);
  out->set_draining(s.draining);
  out->set_complete(s.complete);
  if (!s.degraded.empty()) out->set_degraded(s.degraded);
  for (const PoolProfileView& p : s.profiles) {
    wire::PoolProfileInfo* info = out->add_profiles();
    info->set_id(p.profile.id);
    info->set_cost(p.profile.cost);
    info->set_reserved(p.profile.reserved);
    info->set_lendable(p.profile.lendable);
    info->set_borrow(p.profile.borrow);
    info->set_active_units(p.active_units);
    info->set_provisional_units(p.provisional_units);
    if (p.pending_units) info->set_pending_units(*p.pending_units);
    if (p.withheld_units) info->set_withheld_units(*p.withheld_units);
    if (p.demand_expires_in) info->set_demand_expires_in_ms(ToWireMillis(*p.demand_expires_in));
    info->set_owner_epoch(p.owner_epoch);
    info->set_acked_generation(p.acked_generation);
    info->set_compatible(p.compatible);
  }
  for (const PoolLeaseView& l : s.leases) {
    wire::PoolLeaseInfo* info = out->add_leases();
    info->set_profile(l.profile);
    info->set_slot(l.slot);
    info->set_token(l.token);
    info->set_units(l.units);
    info->set_epoch(l.epoch);
    info->set_active(l.active);
    if (!l.active) info->set_expires_in_ms(ToWireMillis(l.expires_in));
    info->set_decision(l.decision);
  }
  out->set_tombstones_kept(s.tombstones_kept);
  for (const PoolTombstone& t : s.tombstones) {
    wire::PoolTombstoneInfo* info = out->add_tombstones();
    info->set_profile(t.profile);
    info->set_slot(t.slot);
    info->set_token(t.token);
    info->set_units(t.units);
    info->set_decision(t.decision);
    info->set_evidence(t.evidence);
  }
}

PoolView FromWire(const wire::PoolStatusReply& r) {
  PoolView v;
  v.pool = r.pool();
  v.generation = r.generation();
  v.budget = r.budget();
  v.used_units = r.used_units();
  v.decision = r.decision();
  v.draining = r.draining();
  v.complete = r.complete();
  v.degraded = r.degraded();
  v.tombstones_kept = r.tombstones_kept();
  for (const wire::PoolProfileInfo& p : r.profiles()) {
    PoolProfileView& pv = v.profiles.emplace_back();
    pv.profile = PoolProfileDef{p.id(), p.cost(), p.reserved(), p.lendable(), p.borrow()};
    pv.active_units = p.active_units();
    pv.provisional_units = p.provisional_units();
    if (p.has_pending_units()) pv.pending_units = p.pending_units();
    if (p.has_withheld_units()) pv.withheld_units = p.withheld_units();
    if (p.has_demand_expires_in_ms()) pv.demand_expires_in = FromWireMillis(p.demand_expires_in_ms());
    pv.owner_epoch = p.owner_epoch();
    pv.acked_generation = p.acked_generation();
    pv.compatible = p.compatible();
  }
  for (const wire::PoolLeaseInfo& l : r.leases()) {
    v.leases.push_back(PoolLeaseView{l.profile(), l.slot(), l.token(), l.units(), l.epoch(),
                                     l.active(), FromWireMillis(l.expires_in_ms()), l.decision()});
  }
  for (const wire::PoolTombstoneInfo& t : r.tombstones()) {
    v.tombstones.push_back(
        PoolTombstone{t.profile(), t.slot(), t.token(), t.units(), t.decision(), t.evidence()});
  }
  return v;
}

}  // namespace fencelock::protocol
