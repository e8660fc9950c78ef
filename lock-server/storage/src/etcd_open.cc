// The etcd commit log's entry points on a real cluster: each connects a gRPC client to
// options.endpoints and hands it to the log (etcd_commit_log.cc, which knows no gRPC), its
// calls carried by threads (CallOnThreads).
#include <optional>

#include "lock-server/etcd_client.h"
#include "lock-server/etcd_commit_log.h"
#include "net/asio.h"
#include "net/asio_time_source.h"

namespace fencelock::server {

absl::Status InitEtcdPrefix(const EtcdCommitLogOptions& options) {
  auto etcd = GrpcEtcdClient::Create(options.endpoints, options.request_timeout, options.access);
  if (!etcd.ok()) return etcd.status();
  return InitEtcdPrefixOn(options, **etcd);
}

std::unique_ptr<EtcdLogOpening> OpenEtcdCommitLog(const EtcdCommitLogOptions& options,
                                                  TimeSource* time, EtcdLogOpened done) {
  auto etcd = GrpcEtcdClient::Create(options.endpoints, options.request_timeout, options.access);
  if (!etcd.ok()) {
    time->Post([done, s = etcd.status()] { done(s); });
    return nullptr;
  }
  return OpenEtcdCommitLogOn(options, time, CallOnThreads(std::move(*etcd), time),
                             std::move(done));
}

absl::StatusOr<EtcdDestroyOutcome> DestroyEtcdPrefix(
    const EtcdCommitLogOptions& options,
    const std::function<std::vector<std::string>(const StateMachine&)>& held) {
  auto etcd = GrpcEtcdClient::Create(options.endpoints, options.request_timeout, options.access);
  if (!etcd.ok()) return etcd.status();
  asio::io_context io(1);
  AsioTimeSource time(io, Clock::Real());
  std::optional<absl::StatusOr<EtcdDestroyOutcome>> outcome;
  auto work = asio::make_work_guard(io);
  {
    auto destroying = DestroyEtcdPrefixOn(
        options, &time, CallOnThreads(std::move(*etcd), &time), held,
        [&](absl::StatusOr<EtcdDestroyOutcome> out) { outcome = std::move(out); });
    while (!outcome.has_value()) io.run_one();
  }  // the ownership given back; its revoke runs before the calls' threads end
  return std::move(*outcome);
}

}  // namespace fencelock::server
