// A profile manager's side of the admission pools (seeds ADR-0003 and ADR-0006;
// docs/admission.md), built on PoolClient: everything a manager must do besides creating,
// starting and watching its workers.
//
// Start() claims the profile (from then on a previous manager's requests are refused),
// acknowledges the policy generation, and reconciles the leases the profile already holds: for
// each, the caller says what became of its worker, and the manager keeps the leases of workers
// that run or were created under an active lease and releases exactly the others. Then:
//
//   auto lease = manager->acquire("slot-3", absl::Minutes(10));  // provisional, renewed
//   ... create the worker, do not start it ...
//   if (manager->activate(*lease).ok()) { start the worker; wait for it to exit; }
//   else { remove the created worker; }
//   manager->release(*lease);  // the exact slot and token
//
// In the background, once a second (ADR-0006's autoscaled cadence), the manager publishes its
// demand: the acquires waiting plus what setDemand() announced, so that fairness protects its
// share across lockd's 30 s demand expiry and across a lockd restart (which forgets demand). A
// waiting acquire asks again every 2 s (the fixed managers' cadence). It renews its provisional
// leases well inside their TTL. If another manager claims the profile, every call answers
// kAborted from then on and health() says so: this manager must stop admitting.
//
// Thread-safe: acquire, activate and release may be called from several threads at once.
#ifndef FENCELOCK_LOCK_CLIENT_POOL_MANAGER_H_
#define FENCELOCK_LOCK_CLIENT_POOL_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lock-client/pool_client.h"
#include "protocol/defaults.h"

namespace fencelock {

// What a (re)starting manager knows of the worker a lease of its profile was taken for.
enum class PoolWorkerState : uint8_t {
  kAbsent,   // proved gone, or never created: its units may be freed
  kCreated,  // created and never started
  kRunning,  // started, and it may still run: its units stay taken
};

// One lease the manager holds: what acquire() returns and activate() and release() take.
struct PoolAdmission {
  std::string slot;
  uint64_t token = 0;
  bool active = false;
};

struct PoolManagerOptions {
  // How to reach lockd: on its Unix socket (ADR 0004). Default: PoolClientOptions' defaults.
  PoolClientOptions client;
  std::string pool;     // required
  std::string profile;  // required
  // The policy generation this manager enforces. 0: the pool's current one at Start(), and each
  // later one that still has this profile, acknowledged when an acquire is refused for it.
  // Otherwise exactly that one: Start() and acquire() fail with kFailedPrecondition once the
  // pool publishes another. Default: 0.
  uint64_t generation = 0;
  // Required: for each lease the profile holds at Start() (a previous manager's, whose workers
  // may still run), what became of its worker. An active lease whose worker is kAbsent is
  // released (a reconciliation); one whose worker was created or runs is kept, and the created
  // worker may start. A provisional lease is released unless its worker runs (then it is
  // activated, so that its units stay taken): a created worker under a provisional lease must
  // be removed, never started. Called on the thread that calls Start().
  std::function<PoolWorkerState(const PoolLeaseView&)> reconcile;
  // How often demand is published. Default: 1 s (ADR-0006's autoscaled managers); at most a
  // third of lockd's demand TTL (30 s by default, at least 3 s).
  absl::Duration demand_refresh = defaults::kPoolDemandRefresh;
  // How often a waiting acquire asks again while there are no units. Default: 2 s (ADR-0006's
  // fixed managers).
  absl::Duration acquire_retry = defaults::kPoolAcquireRetry;
  // The provisional leases' TTL; they are renewed every third of it. Zero: lockd's default
  // (--pool-provisional-ttl). Default: zero.
  absl::Duration provisional_ttl = absl::ZeroDuration();
  // How long release() keeps trying while lockd cannot be reached. Default: 30 s.
  absl::Duration release_patience = absl::Seconds(30);
};

// What Start() did with the leases it found.
struct PoolReconciliation {
  std::vector<PoolAdmission> kept;      // now this manager's: release each when its worker exits
  std::vector<PoolAdmission> released;  // freed: their workers were absent or never started
};

class PoolManager {
 public:
  // Claims the profile, acknowledges the generation and reconciles (see PoolManagerOptions::
  // reconcile). Blocks for the requests this takes. Fails with kInvalidArgument for bad options,
  // and with lockd's verdict when the claim, the acknowledgement or a reconciling release is
  // refused (kPermissionDenied: this identity may not manage the profile; kUnavailable: lockd
  // cannot be reached). After a failure nothing is left claimed but the claim itself.
  static absl::StatusOr<std::unique_ptr<PoolManager>> Start(PoolManagerOptions options);
  // Stops publishing demand (and publishes zero). Releases nothing: active leases stay, for
  // their workers may still run; provisional ones expire on lockd by themselves.
  virtual ~PoolManager() = default;

  // The owner this manager presents (lockctl's --owner form: ToString()).
  virtual PoolOwnerId owner() const = 0;
  virtual const PoolReconciliation& reconciliation() const = 0;

  // The demand this manager announces besides the acquires waiting (an autoscaled manager's
  // queued jobs). Published at once and refreshed in the background while positive.
  virtual void setDemand(uint64_t slots) = 0;

  // A provisional lease on `slot`, renewed in the background until activate() or release().
  // While there are no units it asks again every acquire_retry, for up to `wait`; then
  // kDeadlineExceeded with lockd's last refusal (the figures). Also fails with
  // kFailedPrecondition (the slot is leased already, the pool drains, the generation is not
  // this manager's), kAborted (fenced out), kUnavailable (lockd unreachable for a whole try).
  virtual absl::StatusOr<PoolAdmission> acquire(const std::string& slot,
                                                absl::Duration wait) = 0;
  // Makes the lease active. Only after OK may the worker start. kNotFound: the provisional
  // lease expired or was released; remove the created worker and never start it.
  virtual absl::Status activate(PoolAdmission& admission) = 0;
  // Releases exactly that slot and token, trying for release_patience while lockd cannot be
  // reached. OK also when lockd no longer has it (a provisional lease that expired). kAborted:
  // another manager owns the profile now, and with it this lease.
  virtual absl::Status release(const PoolAdmission& admission) = 0;

  // The leases this manager holds, kept at Start() and acquired since.
  virtual std::vector<PoolAdmission> leases() const = 0;
  // OK while this manager may admit. kAborted once another manager claimed the profile (then
  // for good); the last failure of the background requests otherwise (kUnavailable while lockd
  // cannot be reached), OK again once they succeed.
  virtual absl::Status health() const = 0;
};

}  // namespace fencelock

#endif  // FENCELOCK_LOCK_CLIENT_POOL_MANAGER_H_
