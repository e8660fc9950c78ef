// lockd's options that its parts share, each declared once with its default: the rules'
// (ServiceOptions, with the admission pools' PoolOptions) and the connections'
// (ConnectionOptions). ServerOptions (server.h) holds them beside the server's own; the `lockd`
// binary binds its flags to these fields; ServerOptions::Validate() (server_options.cc) checks
// them all in one place. Light on purpose: no protobuf, no Asio.
#ifndef FENCELOCK_LOCK_SERVER_OPTIONS_H_
#define FENCELOCK_LOCK_SERVER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "protocol/defaults.h"

namespace fencelock::server {

struct PoolOptions {
  // How long positive demand stays current without a refresh (ADR-0006). Default: 30 s.
  absl::Duration demand_ttl = defaults::kPoolDemandTtl;
  // Provisional lease TTL for an Acquire that asks for none. Default: 30 s.
  absl::Duration default_provisional_ttl = absl::Seconds(30);
  // Accepted range of a requested provisional TTL. Default: 100 ms to 1 h.
  absl::Duration min_provisional_ttl = absl::Milliseconds(100);
  absl::Duration max_provisional_ttl = absl::Hours(1);
  // Largest budget a pool may have; every unit may become one lease in status, and a full
  // pool's status must fit in one frame of the default 1 MiB. Default: 4096.
  uint64_t max_budget = 4096;
  // Most profiles in one policy. Default: 256.
  size_t max_profiles = 256;
  // Most pools lockd coordinates. Default: 64.
  size_t max_pools = 64;
  // Longest pool, profile or slot name, in bytes. Default: 64.
  size_t max_name_bytes = 64;
  // Longest recovery evidence, in bytes. Default: 1024.
  size_t max_evidence_bytes = 1024;
};

struct ServiceOptions {
  // TTL for a session that asks for none (lock.session.ttl). Default: 15 s.
  absl::Duration default_session_ttl = defaults::kSessionTtl;
  // Lease TTL for an acquire that asks for none (lock.default.ttl). Default: 30 s.
  absl::Duration default_lock_ttl = defaults::kLockTtl;
  // Accepted range for requested session and lock TTLs. Default: 10 ms to 1 h.
  absl::Duration min_ttl = absl::Milliseconds(10);
  absl::Duration max_ttl = absl::Hours(1);
  // Longest queue wait an acquire may ask for. Default: 1 h.
  absl::Duration max_wait = absl::Hours(1);
  // Longest lock name, in bytes. Default: 512.
  size_t max_lock_name_bytes = 512;
  // Locks one session may hold and wait for together; one more is kResourceExhausted.
  // Default: 1024.
  size_t max_locks_per_session = 1024;
  // Waiters queued on one lock; one more is kResourceExhausted. Default: 1024.
  size_t max_waiters_per_lock = 1024;
  // Told about every counted FENCED_OUT (a must-be-zero event), with the lock, the stale token
  // and the current holder, so that an operator can find who sent it. Default: none.
  std::function<void(const std::string&)> on_fenced_out;
  // Told about every request refused for a token its session never held (counted in
  // foreign_tokens_total, not as fenced out). Default: none.
  std::function<void(const std::string&)> on_foreign_token;
  // Told about every request refused for driving a session that is not the caller's, or for
  // resuming one with the wrong secret (counted in permission_denied_total). Default: none.
  std::function<void(const std::string&)> on_permission_denied;
  // How many ended leases (lock, token, holder session) are remembered, the last to end, to
  // tell a lock's own session acting on a lost lease (fenced out, must be zero) from a request
  // naming a token its sender never held. Leases that ended earlier, and every lease that ended
  // before this process started, count as foreign. Default: 65536 (about 3 MB).
  size_t remembered_lease_ends = 65536;
  // The lock delay (ADR 0006) of an acquire that asks for none: after its holder is lost (not
  // released), the lock is not granted again for this long (a lost shared holder delays
  // exclusive grants only). Default: zero, none.
  absl::Duration default_lock_delay = absl::ZeroDuration();
  // The longest lock delay an acquire may ask for; one above is refused. Default: 60 s.
  absl::Duration max_lock_delay = absl::Seconds(60);
  // Admission pools' limits and timings (pool_service.h).
  PoolOptions pools;
};

// What one connection, and all of them together, may take of lockd: the core keeps the
// per-connection limits and timeouts, the transport (Listener, AsioConnection) the rest.
struct ConnectionOptions {
  // Open connections, over both listeners. One more gets LIMIT_EXCEEDED and is closed.
  // Server::Create makes sure the process may open that many files (plus lockd's own): it
  // raises the soft limit up to the hard one if it must, and refuses a value the hard limit
  // cannot hold. Default: 1024.
  size_t max_connections = 1024;
  // Open connections of one peer: one user id (the Unix socket's peer credentials; for a
  // loopback TCP peer, the owner of its socket), or one address for a remote peer. One more
  // gets LIMIT_EXCEEDED, so that no one peer can take the connections of the others. Capped at
  // max_connections. Default: 256.
  size_t max_connections_per_peer = 256;
  // Sessions opened on one connection that are still open. Default: 64.
  size_t max_sessions_per_connection = 64;
  // Largest frame accepted or sent; a larger reply is replaced by an UNAVAILABLE error.
  // Default: 1 MiB.
  size_t max_frame_bytes = size_t{1} << 20;
  // A connection that has not sent Hello within this long is told HELLO_REQUIRED and closed.
  // Default: 10 s.
  absl::Duration hello_timeout = absl::Seconds(10);
  // A connection that has sent nothing for this long, and has no open session (opened or
  // renewed on it) and no queued acquire, is told so and closed. Default: 60 s.
  absl::Duration idle_timeout = absl::Seconds(60);
  // Requests of one connection whose replies wait for their commit: above this, lockd stops
  // reading the connection until commits release replies (back pressure). Default: 256.
  size_t max_requests_in_flight = 256;
  // A connection whose replies stay unread (more than 2 MiB, or two frames, waiting) for this
  // long is closed; lockd stops reading its requests as soon as they pile up. Default: 30 s.
  absl::Duration slow_reader_timeout = absl::Seconds(30);
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_OPTIONS_H_
