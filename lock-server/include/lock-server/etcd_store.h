// The part of etcd's v3 API that the etcd commit log needs (ranges, transactions, leases,
// compaction, watches), as an interface: the log runs the same against a real etcd cluster
// over gRPC (lock-server/src/etcd_client.h) and against the simulated etcd (sim/sim_etcd.h).
//
// The requests and replies are etcd's own protobuf messages. An implementation answers as etcd
// does: kNotFound for a lease that does not exist (a put on it included), kOutOfRange for a
// revision compacted away, kUnavailable or kDeadlineExceeded when it cannot answer (and then a
// request may or may not have been applied), and other codes for requests etcd refuses.
//
// Thread-safe: every method may be called from several threads at once.
#ifndef FENCELOCK_LOCK_SERVER_ETCD_STORE_H_
#define FENCELOCK_LOCK_SERVER_ETCD_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcd/etcd_kv.pb.h"

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
  virtual ~EtcdClient() = default;

  virtual absl::StatusOr<etcdserverpb::RangeResponse> Range(
      const etcdserverpb::RangeRequest& request) = 0;
  virtual absl::StatusOr<etcdserverpb::TxnResponse> Txn(
      const etcdserverpb::TxnRequest& request) = 0;
  // Drops the history before `revision` (etcd keeps every old value until compacted).
  virtual absl::Status Compact(int64_t revision) = 0;
  // A lease of `ttl` (whole seconds, at least 1); its id.
  virtual absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl) = 0;
  // Renews lease `id` once; the TTL etcd now counts from, or kNotFound if the lease is gone.
  virtual absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t id) = 0;
  virtual absl::Status LeaseRevoke(int64_t id) = 0;
  // The time lease `id` has left and the TTL it was granted; kNotFound when it has expired or
  // never existed.
  struct LeaseLife {
    absl::Duration left;
    absl::Duration granted;
  };
  virtual absl::StatusOr<LeaseLife> LeaseTimeToLive(int64_t id) = 0;
  // Watches `key` from `start_revision` (inclusive). Whether etcd accepted the watch comes from
  // its Next(). A member that stops answering may leave the watch blocked: callers keep
  // checking by other means too, and Cancel() it.
  virtual absl::StatusOr<std::unique_ptr<EtcdWatch>> Watch(const std::string& key,
                                                           int64_t start_revision) = 0;
  // Status of the member at endpoints()[i].
  virtual absl::StatusOr<etcdserverpb::StatusResponse> MemberStatus(size_t i) = 0;

  // The members' client endpoints, host:port (names, for a simulated cluster).
  virtual const std::vector<std::string>& endpoints() const = 0;
  // The endpoint calls go to first (the last one that answered).
  virtual size_t current() const = 0;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ETCD_STORE_H_
