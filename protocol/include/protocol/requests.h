// Requests as every speaker of the protocol builds them: the client core, the benchmark's
// drivers, durable_bench, the harness, the tests and the simulator. Request ids are set by
// whoever sends them; durations go on the wire in whole milliseconds (a negative one as 0).
#ifndef FENCELOCK_PROTOCOL_REQUESTS_H_
#define FENCELOCK_PROTOCOL_REQUESTS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "fencelock/wire.pb.h"

namespace fencelock::protocol::request {

wire::Request OpenSession(absl::Duration ttl);
wire::Request Resume(uint64_t session, const std::string& secret);
// Renews `session`; AddLock adds the renewal of a lock held under `token`.
wire::Request KeepAlive(uint64_t session);
void AddLock(wire::Request& keep_alive, const std::string& lock, uint64_t token);
wire::Request KeepAlive(uint64_t session, const std::string& lock, uint64_t token);
// `wait` zero: answered at once (busy if held); `ttl` zero: lockd's default lease.
wire::Request Acquire(uint64_t session, const std::string& lock,
                      absl::Duration wait = absl::ZeroDuration(),
                      absl::Duration ttl = absl::ZeroDuration());
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

}  // namespace fencelock::protocol::request

#endif  // FENCELOCK_PROTOCOL_REQUESTS_H_
