#include "etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"

namespace fencelock::server {
namespace {

// Replies carry whole log batches and snapshot chunks: far above gRPC's 4 MiB default.
constexpr int kMaxMessageBytes = 64 << 20;

absl::Status FromGrpc(const char* what, const std::string& endpoint, const grpc::Status& s) {
  const std::string message =
      absl::StrCat("etcd at ", endpoint, ": ", what, ": ", s.error_message());
  switch (s.error_code()) {
    case grpc::StatusCode::OK:
      return absl::OkStatus();
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(message);
    case grpc::StatusCode::NOT_FOUND:
      return absl::NotFoundError(message);
    case grpc::StatusCode::INVALID_ARGUMENT:
      return absl::InvalidArgumentError(message);
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return absl::ResourceExhaustedError(message);
    case grpc::StatusCode::FAILED_PRECONDITION:
      return absl::FailedPreconditionError(message);
    case grpc::StatusCode::OUT_OF_RANGE:
      return absl::OutOfRangeError(message);
    default:
      return absl::UnavailableError(message);
  }
}

// Another endpoint may do better: it could not be reached, or it has no leader just now.
bool TryAnother(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  // gRPC's monotonic clock: a wall-clock step does not move the deadline.
  context.set_deadline(gpr_time_add(
      gpr_now(GPR_CLOCK_MONOTONIC),
      gpr_time_from_micros(absl::ToInt64Microseconds(timeout), GPR_TIMESPAN)));
}

}  // namespace

GrpcEtcdClient::GrpcEtcdClient(std::vector<std::string> endpoints, absl::Duration timeout)
    : endpoints_(std::move(endpoints)), timeout_(timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  for (const std::string& e : endpoints_) {
    auto channel = grpc::CreateCustomChannel(e, grpc::InsecureChannelCredentials(), args);
    stubs_.push_back(Endpoint{etcdserverpb::KV::NewStub(channel),
                              etcdserverpb::Lease::NewStub(channel),
                              etcdserverpb::Maintenance::NewStub(channel),
                              etcdserverpb::Watch::NewStub(channel)});
  }
}

absl::StatusOr<std::unique_ptr<EtcdClient>> GrpcEtcdClient::Create(std::vector<std::string> endpoints,
                                                               absl::Duration timeout) {
  if (endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoints (--etcd)");
  for (const std::string& e : endpoints) {
    if (e.empty()) return absl::InvalidArgumentError("an empty etcd endpoint (--etcd)");
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the etcd request timeout must be positive");
  }
  return std::unique_ptr<EtcdClient>(new GrpcEtcdClient(std::move(endpoints), timeout));
}

template <typename Call>
absl::Status GrpcEtcdClient::WithFailover(const char* what, Call call) {
  absl::Status last;
  const size_t first = current_.load();
  for (size_t n = 0; n < stubs_.size(); ++n) {
    const size_t i = (first + n) % stubs_.size();
    grpc::ClientContext context;
    SetDeadline(context, timeout_);
    last = FromGrpc(what, endpoints_[i], call(stubs_[i], context));
    if (last.ok()) {
      current_ = i;
      return last;
    }
    if (!TryAnother(last)) return last;
  }
  return last;
}

absl::StatusOr<etcdserverpb::RangeResponse> GrpcEtcdClient::Range(
    const etcdserverpb::RangeRequest& request) {
  etcdserverpb::RangeResponse response;
  absl::Status s = WithFailover("range", [&](Endpoint& e, grpc::ClientContext& c) {
    response.Clear();
    return e.kv->Range(&c, request, &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<etcdserverpb::TxnResponse> GrpcEtcdClient::Txn(const etcdserverpb::TxnRequest& request) {
  etcdserverpb::TxnResponse response;
  absl::Status s = WithFailover("txn", [&](Endpoint& e, grpc::ClientContext& c) {
    response.Clear();
    return e.kv->Txn(&c, request, &response);
  });
  if (!s.ok()) return s;
  return response;
}

absl::Status GrpcEtcdClient::Compact(int64_t revision) {
  etcdserverpb::CompactionRequest request;
  request.set_revision(revision);
  etcdserverpb::CompactionResponse response;
  absl::Status s = WithFailover("compact", [&](Endpoint& e, grpc::ClientContext& c) {
    return e.kv->Compact(&c, request, &response);
  });
  // Compacting to a revision already compacted (by another run, or an operator) is fine.
  if (absl::IsOutOfRange(s) || (!s.ok() && absl::StrContains(s.message(), "compacted"))) {
    return absl::OkStatus();
  }
  return s;
}

absl::StatusOr<int64_t> GrpcEtcdClient::LeaseGrant(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse response;
  absl::Status s = WithFailover("lease grant", [&](Endpoint& e, grpc::ClientContext& c) {
    return e.lease->LeaseGrant(&c, request, &response);
  });
  if (!s.ok()) return s;
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd refused a lease: ", response.error()));
  }
  return response.id();
}

absl::StatusOr<absl::Duration> GrpcEtcdClient::LeaseKeepAlive(int64_t id) {
  etcdserverpb::LeaseKeepAliveResponse response;
  absl::Status s = WithFailover("lease keep-alive", [&](Endpoint& e, grpc::ClientContext& c) {
    auto stream = e.lease->LeaseKeepAlive(&c);
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(id);
    if (!stream->Write(request) || !stream->Read(&response)) return stream->Finish();
    stream->WritesDone();
    return stream->Finish();
  });
  if (!s.ok()) return s;
  // etcd answers TTL 0 (or less) for a lease it no longer has.
  if (response.ttl() <= 0) return absl::NotFoundError(absl::StrCat("etcd lease ", id, " expired"));
  return absl::Seconds(response.ttl());
}

absl::Status GrpcEtcdClient::LeaseRevoke(int64_t id) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  etcdserverpb::LeaseRevokeResponse response;
  return WithFailover("lease revoke", [&](Endpoint& e, grpc::ClientContext& c) {
    return e.lease->LeaseRevoke(&c, request, &response);
  });
}

absl::StatusOr<EtcdClient::LeaseLife> GrpcEtcdClient::LeaseTimeToLive(int64_t id) {
  etcdserverpb::LeaseTimeToLiveRequest request;
  request.set_id(id);
  etcdserverpb::LeaseTimeToLiveResponse response;
  absl::Status s = WithFailover("lease time-to-live", [&](Endpoint& e, grpc::ClientContext& c) {
    return e.lease->LeaseTimeToLive(&c, request, &response);
  });
  if (!s.ok()) return s;
  if (response.ttl() <= 0) return absl::NotFoundError(absl::StrCat("etcd lease ", id, " expired"));
  return LeaseLife{absl::Seconds(response.ttl()), absl::Seconds(response.grantedttl())};
}

namespace {

class GrpcWatch final : public EtcdWatch {
 public:
  GrpcWatch(etcdserverpb::Watch::Stub* stub, std::string endpoint)
      : endpoint_(std::move(endpoint)), stream_(stub->Watch(&context_)) {}
  ~GrpcWatch() override {
    Cancel();
    if (!finished_) (void)stream_->Finish();
  }

  // Asks for the watch. etcd's confirmation, and whatever it says of the watch, come from
  // Next().
  absl::Status Create(const std::string& key, int64_t start_revision) {
    etcdserverpb::WatchRequest request;
    request.mutable_create_request()->set_key(key);
    request.mutable_create_request()->set_start_revision(start_revision);
    if (!stream_->Write(request)) return Broken("watch");
    return absl::OkStatus();
  }

  absl::StatusOr<Changes> Next() override {
    for (;;) {
      etcdserverpb::WatchResponse response;
      if (!stream_->Read(&response)) return Broken("watch");
      if (response.compact_revision() > 0) return Compacted(response);
      if (response.canceled()) {
        return absl::UnavailableError(absl::StrCat("etcd at ", endpoint_, " cancelled the watch: ",
                                                   response.cancel_reason()));
      }
      if (response.events_size() == 0) continue;  // the confirmation, or progress
      Changes changes;
      changes.revision = response.header().revision();
      for (auto& e : *response.mutable_events()) changes.events.push_back(std::move(e));
      return changes;
    }
  }

  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    cancelled_ = true;
    context_.TryCancel();
  }

 private:
  absl::Status Broken(const char* what) {
    if (!finished_) {
      finished_ = true;
      finish_ = stream_->Finish();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return absl::CancelledError("the watch was cancelled");
    }
    absl::Status s = FromGrpc(what, endpoint_, finish_);
    // A stream that ended without an error is still no watch.
    return s.ok() ? absl::UnavailableError(absl::StrCat("etcd at ", endpoint_, " ended the watch"))
                  : s;
  }
  absl::Status Compacted(const etcdserverpb::WatchResponse& r) {
    return absl::OutOfRangeError(absl::StrCat("etcd at ", endpoint_,
                                              " compacted the history the watch needs (to revision ",
                                              r.compact_revision(), ")"));
  }

  const std::string endpoint_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>>
      stream_;
  bool finished_ = false;  // Finish() was called (by the thread that reads)
  grpc::Status finish_;
  std::mutex mu_;
  bool cancelled_ = false;  // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdWatch>> GrpcEtcdClient::Watch(const std::string& key,
                                                              int64_t start_revision) {
  absl::Status last;
  const size_t first = current_.load();
  for (size_t n = 0; n < stubs_.size(); ++n) {
    const size_t i = (first + n) % stubs_.size();
    auto watch = std::make_unique<GrpcWatch>(stubs_[i].watch.get(), endpoints_[i]);
    last = watch->Create(key, start_revision);
    if (last.ok()) {
      current_ = i;
      return std::unique_ptr<EtcdWatch>(std::move(watch));
    }
    if (!TryAnother(last)) return last;
  }
  return last.ok() ? absl::UnavailableError("no etcd endpoint") : last;
}

absl::StatusOr<etcdserverpb::StatusResponse> GrpcEtcdClient::MemberStatus(size_t i) {
  if (i >= stubs_.size()) return absl::InvalidArgumentError("no such etcd endpoint");
  grpc::ClientContext context;
  SetDeadline(context, timeout_);
  etcdserverpb::StatusResponse response;
  absl::Status s = FromGrpc("status", endpoints_[i],
                            stubs_[i].maintenance->Status(&context, {}, &response));
  if (!s.ok()) return s;
  return response;
}

}  // namespace fencelock::server
