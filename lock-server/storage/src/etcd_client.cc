#include "lock-server/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "clock/std_mutex.h"

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
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::UnauthenticatedError(message);
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::PermissionDeniedError(message);
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

// A PEM file's text; kInvalidArgument naming the flag when it cannot be read or is not PEM.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) text.clear();
  if (text.empty() || text.size() > (size_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=", path, ": ", text.empty() ? "cannot be read, or is empty" : "is over 1 MiB"));
  }
  if (text.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, " is not a PEM file"));
  }
  return text;
}

// Whether `key` is the private key of the first certificate in `cert` (both PEM).
absl::Status CheckKeyPair(const std::string& cert, const std::string& key, const EtcdAccess& a) {
  BIO* cert_bio = BIO_new_mem_buf(cert.data(), static_cast<int>(cert.size()));
  BIO* key_bio = BIO_new_mem_buf(key.data(), static_cast<int>(key.size()));
  X509* x509 = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  absl::Status s;
  if (x509 == nullptr) {
    s = absl::InvalidArgumentError(
        absl::StrCat("--etcd-tls-cert=", a.cert_file, " holds no certificate"));
  } else if (pkey == nullptr) {
    s = absl::InvalidArgumentError(absl::StrCat(
        "--etcd-tls-key=", a.key_file, " holds no private key (or one with a passphrase)"));
  } else if (X509_check_private_key(x509, pkey) != 1) {
    s = absl::InvalidArgumentError(absl::StrCat("--etcd-tls-key=", a.key_file,
                                                " is not the key of --etcd-tls-cert=", a.cert_file));
  }
  ERR_clear_error();
  EVP_PKEY_free(pkey);
  X509_free(x509);
  BIO_free(key_bio);
  BIO_free(cert_bio);
  return s;
}

}  // namespace

GrpcEtcdClient::GrpcEtcdClient(std::vector<std::string> endpoints, absl::Duration timeout,
                               EtcdAccess access, const Pem& pem)
    : endpoints_(std::move(endpoints)), timeout_(timeout), access_(std::move(access)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (access_.tls()) {
    credentials = grpc::SslCredentials(grpc::SslCredentialsOptions{
        .pem_root_certs = pem.ca, .pem_private_key = pem.key, .pem_cert_chain = pem.cert});
  }
  for (const std::string& e : endpoints_) {
    auto channel = grpc::CreateCustomChannel(e, credentials, args);
    stubs_.push_back(Endpoint{etcdserverpb::KV::NewStub(channel),
                              etcdserverpb::Lease::NewStub(channel),
                              etcdserverpb::Maintenance::NewStub(channel),
                              etcdserverpb::Watch::NewStub(channel),
                              etcdserverpb::Auth::NewStub(channel)});
  }
}

absl::StatusOr<std::unique_ptr<EtcdClient>> GrpcEtcdClient::Create(std::vector<std::string> endpoints,
                                                               absl::Duration timeout,
                                                               const EtcdAccess& access) {
  if (endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoints (--etcd)");
  for (const std::string& e : endpoints) {
    if (e.empty()) return absl::InvalidArgumentError("an empty etcd endpoint (--etcd)");
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the etcd request timeout must be positive");
  }
  if (access.cert_file.empty() != access.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--etcd-tls-cert and --etcd-tls-key go together: give both or neither");
  }
  if (!access.cert_file.empty() && access.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate for etcd (--etcd-tls-cert) needs TLS: give --etcd-tls-ca, the CA "
        "etcd's certificate chains to");
  }
  if (access.user.empty() != access.password.empty()) {
    return absl::InvalidArgumentError(
        "an etcd user needs its password and a password its user: give --etcd-user and "
        "--etcd-password-file together");
  }
  Pem pem;
  if (access.tls()) {
    auto ca = ReadPem(access.ca_file, "--etcd-tls-ca");
    if (!ca.ok()) return ca.status();
    pem.ca = std::move(*ca);
    if (!access.cert_file.empty()) {
      auto cert = ReadPem(access.cert_file, "--etcd-tls-cert");
      if (!cert.ok()) return cert.status();
      auto key = ReadPem(access.key_file, "--etcd-tls-key");
      if (!key.ok()) return key.status();
      if (absl::Status s = CheckKeyPair(*cert, *key, access); !s.ok()) return s;
      pem.cert = std::move(*cert);
      pem.key = std::move(*key);
    }
  }
  return std::unique_ptr<EtcdClient>(
      new GrpcEtcdClient(std::move(endpoints), timeout, access, pem));
}

absl::Status GrpcEtcdClient::Prepare(size_t i, grpc::ClientContext& context) {
  SetDeadline(context, timeout_);
  if (access_.user.empty()) return absl::OkStatus();
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    token = token_;
  }
  if (token.empty()) {
    if (absl::Status s = Authenticate(i, ""); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    token = token_;
  }
  context.AddMetadata("token", token);
  return absl::OkStatus();
}

absl::Status GrpcEtcdClient::Authenticate(size_t i, const std::string& stale) {
  etcdserverpb::AuthenticateRequest request;
  request.set_name(access_.user);
  request.set_password(access_.password);
  etcdserverpb::AuthenticateResponse response;
  grpc::ClientContext context;
  SetDeadline(context, timeout_);
  absl::Status s = FromGrpc("authenticate", endpoints_[i],
                            stubs_[i].auth->Authenticate(&context, request, &response));
  if (!s.ok()) {
    if (TryAnother(s)) return s;
    // A wrong name or password, or an etcd without auth: nothing to retry.
    return absl::PermissionDeniedError(absl::StrCat(
        "etcd refused user \"", access_.user, "\" (--etcd-user, --etcd-password-file): ",
        s.message()));
  }
  absl::MutexLock lock(&mu_);
  if (token_ == stale) token_ = response.token();
  return absl::OkStatus();
}

absl::Status GrpcEtcdClient::Explain(absl::Status s) const {
  const absl::string_view m = s.message();
  if (absl::IsPermissionDenied(s) && !absl::StrContains(m, "--etcd-user")) {
    return absl::PermissionDeniedError(absl::StrCat(
        m, " (etcd's auth is on: ",
        access_.user.empty() ? std::string("lockd's client certificate's common name")
                             : absl::StrCat("user \"", access_.user, "\""),
        " needs a role with readwrite on the prefix's keys; see docs/high-availability.md)"));
  }
  if (absl::IsInvalidArgument(s) && absl::StrContains(m, "user name is empty")) {
    return absl::PermissionDeniedError(absl::StrCat(
        m, " (etcd's auth is on: give --etcd-user and --etcd-password-file, or a client "
           "certificate whose common name is an etcd user)"));
  }
  if (!absl::IsUnavailable(s)) return s;
  // What gRPC says when TLS went wrong: the handshake failed (etcd's certificate), or etcd
  // closed the connection during it (lockd's certificate, or plaintext to a TLS port).
  if (!absl::StrContains(m, "andshake") && !absl::StrContains(m, "Connection reset by peer") &&
      !absl::StrContains(m, "Socket closed") && !absl::StrContains(m, "certificate") &&
      !absl::StrContains(m, "Endpoint read failed")) {
    return s;
  }
  const std::string hint =
      access_.tls()
          ? absl::StrCat("TLS to etcd: etcd's certificate must chain to --etcd-tls-ca=",
                         access_.ca_file, " and name the endpoint's host",
                         access_.cert_file.empty()
                             ? std::string(", and an etcd that requires client certificates "
                                           "needs --etcd-tls-cert and --etcd-tls-key")
                             : absl::StrCat(", and --etcd-tls-cert=", access_.cert_file,
                                            " must chain to a CA etcd trusts (its "
                                            "--trusted-ca-file)"))
          : std::string("an etcd that speaks TLS needs --etcd-tls-ca (and, if it requires "
                        "client certificates, --etcd-tls-cert and --etcd-tls-key)");
  return absl::UnavailableError(absl::StrCat(m, " (", hint, ")"));
}

template <typename Call>
absl::Status GrpcEtcdClient::WithFailover(const char* what, Call call) {
  absl::Status last;
  const size_t first = current_.load();
  for (size_t n = 0; n < stubs_.size(); ++n) {
    const size_t i = (first + n) % stubs_.size();
    for (int attempt = 0; attempt < 2; ++attempt) {
      grpc::ClientContext context;
      last = Prepare(i, context);
      if (last.ok()) last = FromGrpc(what, endpoints_[i], call(stubs_[i], context));
      // etcd no longer knows the token (it restarted, or the token timed out): a new one.
      if (attempt == 0 && absl::IsUnauthenticated(last) && !access_.user.empty()) {
        std::string stale;
        {
          absl::MutexLock lock(&mu_);
          stale = token_;
        }
        last = Authenticate(i, stale);
        if (last.ok()) continue;
      }
      break;
    }
    if (last.ok()) {
      current_ = i;
      return last;
    }
    if (!TryAnother(last)) return Explain(last);
  }
  return Explain(last);
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
  // `token`: etcd's token for lockd's user; empty for none.
  GrpcWatch(etcdserverpb::Watch::Stub* stub, std::string endpoint, const std::string& token)
      : endpoint_(std::move(endpoint)) {
    if (!token.empty()) context_.AddMetadata("token", token);
    stream_ = stub->Watch(&context_);
  }
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
    StdMutexLock lock(&mu_);
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
      StdMutexLock lock(&mu_);
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
  StdMutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdWatch>> GrpcEtcdClient::Watch(const std::string& key,
                                                              int64_t start_revision) {
  absl::Status last;
  const size_t first = current_.load();
  for (size_t n = 0; n < stubs_.size(); ++n) {
    const size_t i = (first + n) % stubs_.size();
    std::string token;
    if (!access_.user.empty()) {
      grpc::ClientContext unused;  // Prepare asks etcd for a token if there is none yet
      last = Prepare(i, unused);
      if (!last.ok()) {
        if (!TryAnother(last)) return last;
        continue;
      }
      absl::MutexLock lock(&mu_);
      token = token_;
    }
    auto watch = std::make_unique<GrpcWatch>(stubs_[i].watch.get(), endpoints_[i], token);
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
  if (absl::Status s = Prepare(i, context); !s.ok()) return s;
  etcdserverpb::StatusResponse response;
  absl::Status s = FromGrpc("status", endpoints_[i],
                            stubs_[i].maintenance->Status(&context, {}, &response));
  if (!s.ok()) return s;
  return response;
}

}  // namespace fencelock::server
