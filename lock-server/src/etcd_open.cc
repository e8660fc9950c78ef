// The etcd commit log's entry points on a real cluster: each connects a gRPC client to
// options.endpoints and hands it to the log (etcd_commit_log.cc, which knows no gRPC).
#include "etcd_client.h"
#include "lock-server/etcd_commit_log.h"

namespace fencelock::server {

absl::Status InitEtcdPrefix(const EtcdCommitLogOptions& options) {
  auto etcd = GrpcEtcdClient::Create(options.endpoints, options.request_timeout);
  if (!etcd.ok()) return etcd.status();
  return InitEtcdPrefixOn(options, **etcd);
}

absl::StatusOr<OpenedCommitLog> OpenEtcdCommitLog(const EtcdCommitLogOptions& options,
                                                  PostToOwner post) {
  auto etcd = GrpcEtcdClient::Create(options.endpoints, options.request_timeout);
  if (!etcd.ok()) return etcd.status();
  return OpenEtcdCommitLogOn(options, std::move(*etcd), std::move(post));
}

absl::StatusOr<EtcdDestroyOutcome> DestroyEtcdPrefix(
    const EtcdCommitLogOptions& options,
    const std::function<std::vector<std::string>(const StateMachine&)>& held) {
  auto etcd = GrpcEtcdClient::Create(options.endpoints, options.request_timeout);
  if (!etcd.ok()) return etcd.status();
  return DestroyEtcdPrefixOn(options, std::move(*etcd), held);
}

}  // namespace fencelock::server
