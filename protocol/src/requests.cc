#include "protocol/requests.h"

#include <algorithm>

namespace fencelock::protocol::request {
namespace {

uint64_t Millis(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(d)));
}

}  // namespace

wire::Request OpenSession(absl::Duration ttl) {
  wire::Request r;
  r.mutable_open_session()->set_ttl_ms(Millis(ttl));
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

wire::Request Acquire(uint64_t session, const std::string& lock, absl::Duration wait,
                      absl::Duration ttl) {
  wire::Request r;
  auto* a = r.mutable_acquire();
  a->set_session_id(session);
  a->set_lock(lock);
  a->set_wait_timeout_ms(Millis(wait));
  a->set_ttl_ms(Millis(ttl));
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

}  // namespace fencelock::protocol::request
