#include "protocol/requests.h"

#include "protocol/millis.h"

namespace fencelock::protocol::request {

wire::Request OpenSession(absl::Duration ttl) {
  wire::Request r;
  r.mutable_open_session()->set_ttl_ms(ToWireMillis(ttl));
  return r;
}

wire::Request Resume(uint64_t session, const std::string& secret) {
  wire::Request r;
  r.mutable_resume_session()->set_session_id(session);
  r.mutable_resume_session()->set_secret(secret);
  return r;
}

wire::Request KeepAlive(uint64_t session) {
  wire::Request r;
  r.mutable_keep_alive()->set_session_id(session);
  return r;
}

void AddLock(wire::Request& keep_alive, const std::string& lock, uint64_t token) {
  auto* ref = keep_alive.mutable_keep_alive()->add_locks();
  ref->set_lock(lock);
  ref->set_token(token);
}

wire::Request KeepAlive(uint64_t session, const std::string& lock, uint64_t token) {
  wire::Request r = KeepAlive(session);
  AddLock(r, lock, token);
  return r;
}

wire::Request Renew(std::initializer_list<uint64_t> sessions) {
  wire::Request r;
  auto* renew = r.mutable_renew();
  for (uint64_t session : sessions) renew->add_sessions()->set_session_id(session);
  return r;
}

wire::Request Acquire(uint64_t session, const std::string& lock, absl::Duration wait,
                      absl::Duration ttl, wire::LockMode mode,
                      std::optional<absl::Duration> lock_delay) {
  wire::Request r;
  auto* a = r.mutable_acquire();
  a->set_session_id(session);
  a->set_lock(lock);
  a->set_wait_timeout_ms(ToWireMillis(wait));
  a->set_ttl_ms(ToWireMillis(ttl));
  a->set_mode(mode);
  if (lock_delay.has_value()) a->set_lock_delay_ms(ToWireMillis(*lock_delay));
  return r;
}

wire::Request Release(uint64_t session, const std::string& lock, uint64_t token,
                      bool relinquish) {
  wire::Request r;
  auto* release = r.mutable_release();
  release->set_session_id(session);
  release->set_lock(lock);
  release->set_token(token);
  release->set_relinquish(relinquish);
  return r;
}

wire::Request Close(uint64_t session) {
  wire::Request r;
  r.mutable_close_session()->set_session_id(session);
  return r;
}

wire::Request Validate(const std::string& lock, uint64_t token, uint64_t as_holder) {
  wire::Request r;
  auto* v = r.mutable_validate();
  v->set_lock(lock);
  v->set_token(token);
  v->set_session_id(as_holder);
  return r;
}

wire::Request WithdrawAcquire(uint64_t session, uint64_t acquire_request_id) {
  wire::Request r;
  r.mutable_withdraw_acquire()->set_session_id(session);
  r.mutable_withdraw_acquire()->set_acquire_request_id(acquire_request_id);
  return r;
}

wire::Request GetStats() {
  wire::Request r;
  r.mutable_get_stats();
  return r;
}

wire::Request ListLocks(uint32_t limit) {
  wire::Request r;
  r.mutable_list_locks()->set_limit(limit);
  return r;
}

wire::Request ListLocks(const ListQuery& query) {
  wire::Request r;
  auto* q = r.mutable_list_locks();
  q->set_prefix(query.prefix);
  q->set_start_after(query.start_after);
  q->set_limit(query.limit);
  q->set_include_sessions(query.include_sessions);
  q->set_skip_locks(query.skip_locks);
  q->set_sessions_after(query.sessions_after);
  q->set_max_bytes(query.max_bytes);
  return r;
}

wire::PoolOwnerRef Owner(uint64_t epoch, const std::string& key) {
  wire::PoolOwnerRef owner;
  owner.set_epoch(epoch);
  owner.set_key(key);
  return owner;
}

wire::Request PoolPublish(const std::string& pool, uint64_t generation, uint64_t budget,
                          const std::vector<wire::PoolProfile>& profiles) {
  wire::Request r;
  auto* p = r.mutable_pool_publish();
  p->set_pool(pool);
  p->set_generation(generation);
  p->set_budget(budget);
  for (const wire::PoolProfile& profile : profiles) *p->add_profiles() = profile;
  return r;
}

wire::Request PoolClaim(const std::string& pool, const std::string& profile,
                        uint64_t generation) {
  wire::Request r;
  auto* c = r.mutable_pool_claim();
  c->set_pool(pool);
  c->set_profile(profile);
  c->set_generation(generation);
  return r;
}

wire::Request PoolAck(const std::string& pool, const std::string& profile,
                      const wire::PoolOwnerRef& owner, uint64_t generation) {
  wire::Request r;
  auto* a = r.mutable_pool_ack();
  a->set_pool(pool);
  a->set_profile(profile);
  *a->mutable_owner() = owner;
  a->set_generation(generation);
  return r;
}

wire::Request PoolSetDemand(const std::string& pool, const std::string& profile,
                            const wire::PoolOwnerRef& owner, uint64_t slots) {
  wire::Request r;
  auto* d = r.mutable_pool_set_demand();
  d->set_pool(pool);
  d->set_profile(profile);
  *d->mutable_owner() = owner;
  d->set_slots(slots);
  return r;
}

wire::Request PoolAcquire(const std::string& pool, const std::string& profile,
                          const std::string& slot, const wire::PoolOwnerRef& owner,
                          absl::Duration ttl) {
  wire::Request r;
  auto* a = r.mutable_pool_acquire();
  a->set_pool(pool);
  a->set_profile(profile);
  a->set_slot(slot);
  *a->mutable_owner() = owner;
  a->set_ttl_ms(ToWireMillis(ttl));
  return r;
}

namespace {

wire::PoolLeaseOp LeaseOp(const std::string& pool, const std::string& profile,
                          const std::string& slot, uint64_t token,
                          const wire::PoolOwnerRef& owner) {
  wire::PoolLeaseOp op;
  op.set_pool(pool);
  op.set_profile(profile);
  op.set_slot(slot);
  op.set_token(token);
  *op.mutable_owner() = owner;
  return op;
}

}  // namespace

wire::Request PoolRenew(const std::string& pool, const std::string& profile,
                        const std::string& slot, uint64_t token,
                        const wire::PoolOwnerRef& owner) {
  wire::Request r;
  *r.mutable_pool_renew() = LeaseOp(pool, profile, slot, token, owner);
  return r;
}

wire::Request PoolActivate(const std::string& pool, const std::string& profile,
                           const std::string& slot, uint64_t token,
                           const wire::PoolOwnerRef& owner) {
  wire::Request r;
  *r.mutable_pool_activate() = LeaseOp(pool, profile, slot, token, owner);
  return r;
}

wire::Request PoolRelease(const std::string& pool, const std::string& profile,
                          const std::string& slot, uint64_t token,
                          const wire::PoolOwnerRef& owner) {
  wire::Request r;
  *r.mutable_pool_release() = LeaseOp(pool, profile, slot, token, owner);
  return r;
}

wire::Request PoolRecover(const std::string& pool, const std::string& profile,
                          const std::string& slot, uint64_t token, const std::string& evidence) {
  wire::Request r;
  auto* rec = r.mutable_pool_recover();
  rec->set_pool(pool);
  rec->set_profile(profile);
  rec->set_slot(slot);
  rec->set_token(token);
  rec->set_evidence(evidence);
  return r;
}

wire::Request PoolDrain(const std::string& pool, bool draining) {
  wire::Request r;
  r.mutable_pool_drain()->set_pool(pool);
  r.mutable_pool_drain()->set_draining(draining);
  return r;
}

wire::Request PoolStatus(const std::string& pool) {
  wire::Request r;
  r.mutable_pool_status()->set_pool(pool);
  return r;
}

wire::Request PoolStop() {
  wire::Request r;
  r.mutable_pool_stop();
  return r;
}

wire::Request PoolDelete(const std::string& pool) {
  wire::Request r;
  r.mutable_pool_delete()->set_pool(pool);
  return r;
}

}  // namespace fencelock::protocol::request
