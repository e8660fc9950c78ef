// A blocking client for the part of etcd's v3 gRPC API that the etcd commit log needs: ranges,
// transactions and leases, against a list of endpoints. Each call has a deadline (on gRPC's
// monotonic clock); a call that cannot reach its endpoint is tried on the next one, once around
// the list. Only requests that are safe to repeat are sent through it (puts of the same values,
// deletes, compares), so a retry after a reply was lost changes nothing.
//
// Thread-safe: gRPC stubs may be used from several threads.
#ifndef FENCELOCK_LOCK_SERVER_ETCD_CLIENT_H_
#define FENCELOCK_LOCK_SERVER_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd/etcd_kv.grpc.pb.h"

namespace fencelock::server {

// One watch on one key, on one endpoint's stream. Thread-safe: Cancel() may be called from
// any thread while another blocks in Next().
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  // Blocks until etcd reports changes of the key (its events, in revision order, and the
  // revision the reply is current to), then returns them. kCancelled after Cancel();
  // kOutOfRange when the start revision was compacted away; kUnavailable when the stream broke
  // (the member went away): watch again.
  struct Changes {
    std::vector<etcdserverpb::Event> events;
    int64_t revision = 0;
  };
  virtual absl::StatusOr<Changes> Next() = 0;
  // Ends a Next() under way, and every later one, with kCancelled.
  virtual void Cancel() = 0;
};

class EtcdClient {
 public:
  // `endpoints` are host:port of etcd's client URLs (plaintext). kInvalidArgument for an empty
  // list or an empty entry. Connects lazily: the first call tells whether etcd answers.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(std::vector<std::string> endpoints,
                                                            absl::Duration timeout);

  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& request);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request);
  // Drops the history before `revision` (etcd keeps every old value until compacted).
  absl::Status Compact(int64_t revision);
  // A lease of `ttl` (whole seconds, at least 1); its id.
  absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl);
  // Renews lease `id` once; the TTL etcd now counts from, or kNotFound if the lease is gone.
  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t id);
  absl::Status LeaseRevoke(int64_t id);
  // The time lease `id` has left and the TTL it was granted; kNotFound when it has expired or
  // never existed.
  struct LeaseLife {
    absl::Duration left;
    absl::Duration granted;
  };
  absl::StatusOr<LeaseLife> LeaseTimeToLive(int64_t id);
  // Watches `key` from `start_revision` (inclusive) on the endpoint that answered last; the
  // next endpoints when it cannot be written to. Whether etcd accepted the watch comes from
  // its Next(). A member that stops answering leaves the watch blocked: callers keep checking
  // by other means too, and Cancel() it.
  absl::StatusOr<std::unique_ptr<EtcdWatch>> Watch(const std::string& key, int64_t start_revision);
  // Status of the member at endpoints()[i].
  absl::StatusOr<etcdserverpb::StatusResponse> MemberStatus(size_t i);

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // The endpoint calls go to first (the last one that answered).
  size_t current() const { return current_.load(); }

 private:
  struct Endpoint {
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  };
  EtcdClient(std::vector<std::string> endpoints, absl::Duration timeout);
  // Runs `call(endpoint, context)` on the current endpoint, then on the others while the
  // failure says the endpoint could not be used.
  template <typename Call>
  absl::Status WithFailover(const char* what, Call call);

  const std::vector<std::string> endpoints_;
  const absl::Duration timeout_;
  std::vector<Endpoint> stubs_;
  std::atomic<size_t> current_{0};
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ETCD_CLIENT_H_
