// Every counter lockd keeps, declared once here, in a list per part that counts: the lock
// rules (LockService), the admission pools (PoolService) and the core's transport and clock
// (ServerCore). Each entry is X(field, metric, help):
//   - `field` is the member of the part's stats struct that counts it (the structs below are
//     made from the lists) and, for the lock rules' and the core's counters, the field of that
//     name in wire.proto's StatsReply where it has one (the pools' are in StatsReply.counters
//     only: their field names repeat the locks');
//   - `metric` is its Prometheus name, the name it has in StatsReply.counters (every counter is
//     there), and the name docs/metrics.md gives it (counters_doc_test checks);
//   - `help` is its Prometheus help text.
// Adding a counter is a line here and the increment where it happens: the struct, GetStats, the
// Prometheus export and lockctl status all read the lists.
#ifndef FENCELOCK_LOCK_SERVER_COUNTERS_H_
#define FENCELOCK_LOCK_SERVER_COUNTERS_H_

#include <cstdint>

// The lock rules (LockService::stats()).
#define FENCELOCK_LOCK_COUNTERS(X)                                                              \
  X(grants_total, "lockd_grants_total", "Locks granted")                                        \
  X(shared_grants_total, "lockd_shared_grants_total", "Locks granted in shared mode (ADR 0006)") \
  X(fenced_out_total, "lock_fenced_out_total",                                                  \
    "Requests from a lock's own session that presented a token it lost (fence 1); must be "     \
    "zero")                                                                                     \
  X(foreign_tokens_total, "lockd_foreign_tokens_total",                                         \
    "Requests refused for a token their session never held (not a lease violation)")            \
  X(session_expiries_total, "lockd_session_expiries_total",                                     \
    "Sessions that expired on lockd's clock")                                                   \
  X(lock_expiries_total, "lockd_lock_expiries_total", "Lock leases that expired on lockd's clock") \
  X(permission_denied_total, "lockd_permission_denied_total",                                   \
    "Requests refused for driving a session that is not the sender's, or resuming one with a "  \
    "wrong secret")                                                                             \
  X(lock_delays_started_total, "lockd_lock_delays_started_total",                               \
    "Lock delays started by a lost holder (lease expired or session ended; ADR 0006)")          \
  X(lock_delay_blocked_acquires_total, "lockd_lock_delay_blocked_acquires_total",               \
    "Acquires a lock delay held back (answered busy or queued when nothing else did)")

// The admission pools (PoolService::stats()).
#define FENCELOCK_POOL_COUNTERS(X)                                                              \
  X(grants_total, "lockd_pool_grants_total", "Admission pools: provisional leases granted")     \
  X(refusals_total, "lockd_pool_refusals_total",                                                \
    "Admission pools: acquires refused for want of units")                                      \
  X(provisional_expiries_total, "lockd_pool_provisional_expiries_total",                        \
    "Admission pools: provisional leases that expired before activation")                       \
  X(releases_total, "lockd_pool_releases_total", "Admission pools: leases released")            \
  X(reconciliations_total, "lockd_pool_reconciliations_total",                                  \
    "Admission pools: leases released by a replacement manager that proved the worker absent")  \
  X(recoveries_total, "lockd_pool_recoveries_total",                                            \
    "Admission pools: active leases freed by an operator's fenced recovery (tombstoned)")       \
  X(stale_owner_total, "lockd_pool_stale_owner_total",                                          \
    "Admission pools: requests refused from a manager whose profile was claimed since")         \
  X(demand_expiries_total, "lockd_pool_demand_expiries_total",                                  \
    "Admission pools: positive demand dropped after --pool-demand-ttl without a refresh")

// The core: connections and lockd's own clock (ServerCore::stats()).
#define FENCELOCK_CORE_COUNTERS(X)                                                              \
  X(protocol_errors_total, "lockd_protocol_errors_total",                                       \
    "Connections closed for malformed or refused input")                                        \
  X(stalls_total, "lockd_stalls_total",                                                         \
    "Times lockd did not run for longer than --stall-threshold (leases extended)")              \
  X(connections_closed_slow_total, "lockd_connections_closed_slow_total",                       \
    "Connections closed for not reading their replies (--slow-reader-timeout)")                 \
  X(connections_closed_idle_total, "lockd_connections_closed_idle_total",                       \
    "Connections closed after sending nothing past --idle-timeout")                             \
  X(connections_refused_total, "lockd_connections_refused_total",                               \
    "Connections refused at admission (a connection limit, descriptors, a user id)")

namespace fencelock::server {

// One counter as the lists give it, with its value: what GetStats, the Prometheus export and
// the tests walk.
struct CounterRef {
  const char* field;
  const char* metric;
  const char* help;
  uint64_t value;
};

}  // namespace fencelock::server

// The body of a stats struct made from `LIST`: a member per counter, and ForEach(f), which
// calls f(CounterRef) for each in the list's order.
#define FENCELOCK_COUNTER_FIELD(field, metric, help) uint64_t field = 0;
#define FENCELOCK_COUNTER_VISIT(field, metric, help) \
  f(::fencelock::server::CounterRef{#field, metric, help, field});
#define FENCELOCK_COUNTERS_STRUCT_BODY(LIST) \
  LIST(FENCELOCK_COUNTER_FIELD)              \
  template <typename F>                      \
  void ForEach(F&& f) const {                \
    LIST(FENCELOCK_COUNTER_VISIT)            \
  }

#endif  // FENCELOCK_LOCK_SERVER_COUNTERS_H_
