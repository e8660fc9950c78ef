// The etcd client of a real cluster (lock-server/etcd_store.h's interface) over etcd's v3 gRPC
// API: blocking calls against a list of endpoints. Each call has a deadline (on gRPC's
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
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "etcd/etcd_kv.grpc.pb.h"
#include "lock-server/etcd_commit_log.h"
#include "lock-server/etcd_store.h"

namespace grpc {
class ClientContext;
}

namespace fencelock::server {

class GrpcEtcdClient final : public EtcdClient {
 public:
  // `endpoints` are host:port of etcd's client URLs, spoken to as `access` says (TLS, a user).
  // kInvalidArgument for an empty list or an empty entry, and for access files that cannot be
  // read, do not parse, or do not go together (a key that is not the certificate's), naming the
  // flag. Connects lazily: the first call tells whether etcd answers.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(std::vector<std::string> endpoints,
                                                            absl::Duration timeout,
                                                            const EtcdAccess& access = {});

  absl::StatusOr<etcdserverpb::RangeResponse> Range(
      const etcdserverpb::RangeRequest& request) override;
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& request) override;
  absl::Status Compact(int64_t revision) override;
  absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl) override;
  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t id) override;
  absl::Status LeaseRevoke(int64_t id) override;
  absl::StatusOr<LeaseLife> LeaseTimeToLive(int64_t id) override;
  // Watches `key` from `start_revision` (inclusive) on the endpoint that answered last; the
  // next endpoints when it cannot be written to. Whether etcd accepted the watch comes from
  // its Next(). A member that stops answering leaves the watch blocked: callers keep checking
  // by other means too, and Cancel() it.
  absl::StatusOr<std::unique_ptr<EtcdWatch>> Watch(const std::string& key,
                                                   int64_t start_revision) override;
  absl::StatusOr<etcdserverpb::StatusResponse> MemberStatus(size_t i) override;

  const std::vector<std::string>& endpoints() const override { return endpoints_; }
  size_t current() const override { return current_.load(); }

 private:
  struct Endpoint {
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };
  struct Pem {
    std::string ca, cert, key;
  };
  GrpcEtcdClient(std::vector<std::string> endpoints, absl::Duration timeout, EtcdAccess access,
                 const Pem& pem);
  // Runs `call(endpoint, context)` on the current endpoint, then on the others while the
  // failure says the endpoint could not be used. With a user, a call etcd refuses for its token
  // is sent again once with a new one.
  template <typename Call>
  absl::Status WithFailover(const char* what, Call call);
  // The deadline, and the token when there is a user (asking etcd for one if there is none).
  absl::Status Prepare(size_t i, grpc::ClientContext& context);
  // `s` with what to check when it looks like TLS went wrong.
  absl::Status Explain(absl::Status s) const;
  // Asks endpoint `i` for a token for access_.user, replacing `stale` (if it still is the one).
  absl::Status Authenticate(size_t i, const std::string& stale);

  const std::vector<std::string> endpoints_;
  const absl::Duration timeout_;
  const EtcdAccess access_;
  std::vector<Endpoint> stubs_;
  std::atomic<size_t> current_{0};
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);  // etcd's token for access_.user; empty: none yet
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ETCD_CLIENT_H_
