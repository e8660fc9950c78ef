// Requests as every speaker of the protocol builds them: the client core, the benchmark's
// drivers, durable_bench, the harness, the tests and the simulator. Request ids are set by
// whoever sends them; durations go on the wire in whole milliseconds (a negative one as 0).
#ifndef FENCELOCK_PROTOCOL_REQUESTS_H_
#define FENCELOCK_PROTOCOL_REQUESTS_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "fencelock/wire.pb.h"

namespace fencelock::protocol::request {

wire::Request OpenSession(absl::Duration ttl);
wire::Request Resume(uint64_t session, const std::string& secret);
// Renews `session`; AddLock adds the renewal of a lock held under `token`.
wire::Request KeepAlive(uint64_t session);
void AddLock(wire::Request& keep_alive, const std::string& lock, uint64_t token);
wire::Request KeepAlive(uint64_t session, const std::string& lock, uint64_t token);
// Renews each of `sessions` and every lock each holds, naming none (protocol version 6).
wire::Request Renew(std::initializer_list<uint64_t> sessions);
// `wait` zero: answered at once (busy if held); `ttl` zero: lockd's default lease. A mode
// other than exclusive, or a lock delay, needs protocol version 5; with neither, the request
// is what every version reads.
wire::Request Acquire(uint64_t session, const std::string& lock,
                      absl::Duration wait = absl::ZeroDuration(),
                      absl::Duration ttl = absl::ZeroDuration(),
                      wire::LockMode mode = wire::EXCLUSIVE,
                      std::optional<absl::Duration> lock_delay = std::nullopt);
// With `relinquish`, clean-up by a client that already stopped treating the lock as held: a
// stale token is not counted as fenced out (docs/contracts.md).
wire::Request Release(uint64_t session, const std::string& lock, uint64_t token,
                      bool relinquish = false);
wire::Request Close(uint64_t session);
// A resource's check of `token`; with `as_holder`, the holder's own confirmation.
wire::Request Validate(const std::string& lock, uint64_t token, uint64_t as_holder = 0);
// Takes the Acquire this connection sent with `acquire_request_id` out of its queue.
wire::Request WithdrawAcquire(uint64_t session, uint64_t acquire_request_id);
wire::Request GetStats();
wire::Request ListLocks(uint32_t limit);
// A listing with options, each as wire.proto's ListLocks says (zero: the default).
struct ListQuery {
  std::string prefix;
  std::string start_after;
  uint32_t limit = 0;
  bool include_sessions = false;
  bool skip_locks = false;
  uint64_t sessions_after = 0;
  uint32_t max_bytes = 0;
};
wire::Request ListLocks(const ListQuery& query);

// Admission pools (protocol version 2). A manager's owner reference is the epoch and key its
// claim returned.
wire::PoolOwnerRef Owner(uint64_t epoch, const std::string& key);
wire::Request PoolPublish(const std::string& pool, uint64_t generation, uint64_t budget,
                          const std::vector<wire::PoolProfile>& profiles);
wire::Request PoolClaim(const std::string& pool, const std::string& profile,
                        uint64_t generation);
wire::Request PoolAck(const std::string& pool, const std::string& profile,
                      const wire::PoolOwnerRef& owner, uint64_t generation);
wire::Request PoolSetDemand(const std::string& pool, const std::string& profile,
                            const wire::PoolOwnerRef& owner, uint64_t slots);
// `ttl` zero: lockd's default provisional lease.
wire::Request PoolAcquire(const std::string& pool, const std::string& profile,
                          const std::string& slot, const wire::PoolOwnerRef& owner,
                          absl::Duration ttl = absl::ZeroDuration());
wire::Request PoolRenew(const std::string& pool, const std::string& profile,
                        const std::string& slot, uint64_t token, const wire::PoolOwnerRef& owner);
wire::Request PoolActivate(const std::string& pool, const std::string& profile,
                           const std::string& slot, uint64_t token,
                           const wire::PoolOwnerRef& owner);
wire::Request PoolRelease(const std::string& pool, const std::string& profile,
                          const std::string& slot, uint64_t token,
                          const wire::PoolOwnerRef& owner);
wire::Request PoolRecover(const std::string& pool, const std::string& profile,
                          const std::string& slot, uint64_t token, const std::string& evidence);
wire::Request PoolDrain(const std::string& pool, bool draining);
wire::Request PoolStatus(const std::string& pool);
wire::Request PoolStop();
wire::Request PoolDelete(const std::string& pool);

}  // namespace fencelock::protocol::request

#endif  // FENCELOCK_PROTOCOL_REQUESTS_H_
