// The admission pools' client (ADR-0003 and ADR-0006; docs/admission.md): what a profile
// manager and an operator send to lockd's admission coordinator. lockctl's `pool` commands are
// this client, so that a shell manager and a C++ manager speak the protocol the same way (both
// pass protocol/conformance/pool_*.txt).
//
// A manager claims its profile once (Claim returns the owner it presents from then on),
// publishes demand, acquires a provisional lease for one slot, renews it while pre-launch work
// continues, activates it before starting the worker, and releases the exact slot when it sees
// the worker exit. A replacement manager claims the profile again (the old manager's requests
// are refused from then on), lists the leases (Status), and releases those whose workers it
// proves absent.
//
// Every call blocks for at most `timeout` and returns the server's verdict as a status:
// kNotFound (no such pool, profile or lease), kFailedPrecondition (an incompatible
// generation, a draining pool, a slot already leased, a repeated or stale recovery),
// kAborted (this manager's epoch is stale), kPermissionDenied, kInvalidArgument, or
// kUnavailable / kDeadlineExceeded when lockd cannot be reached.
//
// Thread-safe: calls may come from several threads; they share one connection.
#ifndef FENCELOCK_LOCK_CLIENT_POOL_CLIENT_H_
#define FENCELOCK_LOCK_CLIENT_POOL_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "api/export.h"
#include "protocol/pool_view.h"

namespace fencelock {

struct PoolClientOptions {
  // lockd's address: "host:port", "unix:/path", or a comma-separated list of replicas.
  // Default: "127.0.0.1:7420".
  std::string server = "127.0.0.1:7420";
  // The longest one call (connecting included) may take. Default: 5 s.
  absl::Duration timeout = absl::Seconds(5);
  // Sent in Hello, for lockd's logs. Default: "fencelock-pool".
  std::string client_name = "fencelock-pool";
  // TLS (docs/security.md): PEM files; all three or none. Default: none, plaintext.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;  // default: the host of `server`
};

// What a manager presents with every request for its profile: the epoch its claim opened and
// the key that proves it. As text (lockctl's --owner): "<epoch>:<key in hex>".
struct FENCELOCK_API PoolOwnerId {
  uint64_t epoch = 0;
  std::string key;
  std::string ToString() const;
  static absl::StatusOr<PoolOwnerId> Parse(const std::string& text);
};

struct PoolLeaseGrant {
  bool granted = false;  // false: no units now; `refusal` has the figures
  uint64_t token = 0;
  absl::Duration ttl;
  uint64_t decision = 0;
  std::string refusal;
};

class FENCELOCK_API PoolClient {
 public:
  // Does not connect: the first call does, and a call after a broken connection reconnects.
  static absl::StatusOr<std::unique_ptr<PoolClient>> Create(const PoolClientOptions& options);
  virtual ~PoolClient() = default;

  // Operator: publishes a policy generation; returns the generation lockd acknowledged.
  virtual absl::StatusOr<uint64_t> publish(const std::string& pool, uint64_t generation,
                                           uint64_t budget,
                                           const std::vector<PoolProfileDef>& profiles) = 0;
  // Manager: takes `profile` of `pool` at policy `generation` (the current one).
  virtual absl::StatusOr<PoolOwnerId> claim(const std::string& pool, const std::string& profile,
                                            uint64_t generation) = 0;
  virtual absl::Status ack(const std::string& pool, const std::string& profile,
                           const PoolOwnerId& owner, uint64_t generation) = 0;
  virtual absl::Status setDemand(const std::string& pool, const std::string& profile,
                                 const PoolOwnerId& owner, uint64_t slots) = 0;
  // `ttl` zero: lockd's default provisional TTL.
  virtual absl::StatusOr<PoolLeaseGrant> acquire(const std::string& pool,
                                                 const std::string& profile,
                                                 const std::string& slot,
                                                 const PoolOwnerId& owner,
                                                 absl::Duration ttl) = 0;
  // Returns the lease's TTL, renewed from when lockd received the request.
  virtual absl::StatusOr<absl::Duration> renew(const std::string& pool,
                                               const std::string& profile,
                                               const std::string& slot, uint64_t token,
                                               const PoolOwnerId& owner) = 0;
  // Returns the decision number. Only after OK may the worker start.
  virtual absl::StatusOr<uint64_t> activate(const std::string& pool, const std::string& profile,
                                            const std::string& slot, uint64_t token,
                                            const PoolOwnerId& owner) = 0;
  virtual absl::StatusOr<uint64_t> release(const std::string& pool, const std::string& profile,
                                           const std::string& slot, uint64_t token,
                                           const PoolOwnerId& owner) = 0;
  // Operator: the fenced recovery of an active lease whose worker is proved gone.
  virtual absl::StatusOr<uint64_t> recover(const std::string& pool, const std::string& profile,
                                           const std::string& slot, uint64_t token,
                                           const std::string& evidence) = 0;
  virtual absl::Status drain(const std::string& pool, bool draining) = 0;
  virtual absl::StatusOr<PoolView> status(const std::string& pool) = 0;
  // Operator: stops lockd once every pool drains and holds no lease.
  virtual absl::Status stop() = 0;
  // Operator: deletes a pool that drains and holds no lease, freeing its name and its place
  // among the (at most 64) pools lockd coordinates. Needs a lockd of protocol version 4.
  virtual absl::Status deletePool(const std::string& pool) = 0;
};

}  // namespace fencelock

#endif  // FENCELOCK_LOCK_CLIENT_POOL_CLIENT_H_
