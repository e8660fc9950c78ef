#include "lock-client/pool_client.h"

#include <poll.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "fencelock/wire.pb.h"
#include "net/blocking_connection.h"
#include "net/tls.h"
#include "protocol/address.h"
#include "protocol/codes.h"
#include "protocol/millis.h"
#include "protocol/pool_wire.h"
#include "protocol/requests.h"

namespace fencelock {
namespace {

using net::BlockingConnection;
namespace req = protocol::request;

wire::PoolOwnerRef OwnerRef(const PoolOwnerId& owner) {
  return req::Owner(owner.epoch, owner.key);
}

class PoolClientImpl final : public PoolClient {
 public:
  PoolClientImpl(const PoolClientOptions& options, std::vector<protocol::Address> replicas,
                 std::shared_ptr<net::TlsContext> tls)
      : options_(options), replicas_(std::move(replicas)), tls_(std::move(tls)) {}

  absl::StatusOr<uint64_t> publish(const std::string& pool, uint64_t generation, uint64_t budget,
                                   const std::vector<PoolProfileDef>& profiles) override {
    std::vector<wire::PoolProfile> defs;
    for (const PoolProfileDef& p : profiles) defs.push_back(protocol::ToWire(p));
    auto reply = Call(req::PoolPublish(pool, generation, budget, defs));
    if (!reply.ok()) return reply.status();
    return reply->pool_publish().generation();
  }

  absl::StatusOr<PoolOwnerId> claim(const std::string& pool, const std::string& profile,
                                    uint64_t generation) override {
    auto reply = Call(req::PoolClaim(pool, profile, generation));
    if (!reply.ok()) return reply.status();
    return PoolOwnerId{reply->pool_claim().owner().epoch(), reply->pool_claim().owner().key()};
  }

  absl::Status ack(const std::string& pool, const std::string& profile, const PoolOwnerId& owner,
                   uint64_t generation) override {
    return Call(req::PoolAck(pool, profile, OwnerRef(owner), generation)).status();
  }

  absl::Status setDemand(const std::string& pool, const std::string& profile,
                         const PoolOwnerId& owner, uint64_t slots) override {
    return Call(req::PoolSetDemand(pool, profile, OwnerRef(owner), slots)).status();
  }

  absl::StatusOr<PoolLeaseGrant> acquire(const std::string& pool, const std::string& profile,
                                         const std::string& slot, const PoolOwnerId& owner,
                                         absl::Duration ttl) override {
    auto reply = Call(req::PoolAcquire(pool, profile, slot, OwnerRef(owner), ttl));
    if (!reply.ok()) return reply.status();
    const auto& a = reply->pool_acquire();
    return PoolLeaseGrant{a.granted(), a.token(), protocol::FromWireMillis(a.ttl_ms()), a.decision(),
                          a.refusal()};
  }

  absl::StatusOr<absl::Duration> renew(const std::string& pool, const std::string& profile,
                                       const std::string& slot, uint64_t token,
                                       const PoolOwnerId& owner) override {
    auto reply = Call(req::PoolRenew(pool, profile, slot, token, OwnerRef(owner)));
    if (!reply.ok()) return reply.status();
    return protocol::FromWireMillis(reply->pool_lease().ttl_ms());
  }

  absl::StatusOr<uint64_t> activate(const std::string& pool, const std::string& profile,
                                    const std::string& slot, uint64_t token,
                                    const PoolOwnerId& owner) override {
    return Decision(req::PoolActivate(pool, profile, slot, token, OwnerRef(owner)));
  }

  absl::StatusOr<uint64_t> release(const std::string& pool, const std::string& profile,
                                   const std::string& slot, uint64_t token,
                                   const PoolOwnerId& owner) override {
    return Decision(req::PoolRelease(pool, profile, slot, token, OwnerRef(owner)));
  }

  absl::StatusOr<uint64_t> recover(const std::string& pool, const std::string& profile,
                                   const std::string& slot, uint64_t token,
                                   const std::string& evidence) override {
    return Decision(req::PoolRecover(pool, profile, slot, token, evidence));
  }

  absl::Status drain(const std::string& pool, bool draining) override {
    return Call(req::PoolDrain(pool, draining)).status();
  }

  absl::StatusOr<PoolView> status(const std::string& pool) override {
    auto reply = Call(req::PoolStatus(pool));
    if (!reply.ok()) return reply.status();
    return protocol::FromWire(reply->pool_status());
  }

  absl::Status stop() override {
    return Call(req::PoolStop()).status();
  }

  absl::Status deletePool(const std::string& pool) override {
    return Call(req::PoolDelete(pool)).status();
  }

 private:
  // The decision number an activation, release or recovery answers.
  absl::StatusOr<uint64_t> Decision(wire::Request request) {
    auto reply = Call(std::move(request));
    if (!reply.ok()) return reply.status();
    return reply->pool_lease().decision();
  }
  // The reply when its code is OK; otherwise the code as a status with lockd's message.
  absl::StatusOr<wire::Response> Call(wire::Request request) {
    absl::MutexLock lock(&mu_);
    if (conn_ != nullptr && Ended(*conn_)) conn_.reset();
    if (conn_ == nullptr) {
      auto connected = Connect();
      if (!connected.ok()) return connected.status();
      conn_ = std::move(*connected);
    }
    auto reply = conn_->Call(std::move(request));
    if (!reply.ok()) {
      // Broken, or a reply that may still come: the next call starts on a new connection.
      conn_.reset();
      return reply.status();
    }
    if (reply->code() != wire::OK) return protocol::StatusFromCode(reply->code(), reply->message());
    return reply;
  }

  // Whether lockd ended the idle connection (it restarted, failed over, or timed it out: it
  // says why, then closes it), so that no request is sent on it that could only fail. Between
  // calls nothing is awaited on it: anything to read is such an end.
  static bool Ended(const BlockingConnection& conn) {
    pollfd p{.fd = conn.fd(), .events = POLLIN | POLLRDHUP, .revents = 0};
    return ::poll(&p, 1, 0) != 0;
  }

  // mu_ held. The replica that answered last first, then the others in order, each with the
  // whole timeout (a standby or a replica that is down refuses at once). A standby that names
  // the serving replica sends the next try there, if it is in the list.
  absl::StatusOr<std::unique_ptr<BlockingConnection>> Connect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<size_t> order;
    for (size_t n = 0; n < replicas_.size(); ++n) order.push_back((preferred_ + n) % replicas_.size());
    std::vector<std::string> failures;
    for (size_t n = 0; n < order.size(); ++n) {
      const size_t i = order[n];
      auto connected = BlockingConnection::Connect({.server = replicas_[i].text,
                                                    .timeout = options_.timeout,
                                                    .client_name = options_.client_name,
                                                    .tls = tls_,
                                                    .tls_server_name = options_.tls_server_name});
      if (connected.ok()) {
        preferred_ = i;
        return connected;
      }
      const absl::Status& s = connected.status();
      if (replicas_.size() == 1 || absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s)) {
        return s;
      }
      failures.push_back(std::string(s.message()));
      if (auto leader = s.GetPayload(net::kStandbyLeaderPayload); leader.has_value()) {
        const std::string serving(leader->Flatten());
        auto named = std::find_if(order.begin() + static_cast<std::ptrdiff_t>(n) + 1, order.end(),
                                  [&](size_t j) { return replicas_[j].text == serving; });
        if (named != order.end()) std::rotate(order.begin() + static_cast<std::ptrdiff_t>(n) + 1, named, named + 1);
      }
    }
    return absl::UnavailableError(
        absl::StrCat("no lockd replica answered: ", absl::StrJoin(failures, "; ")));
  }

  const PoolClientOptions options_;
  const std::vector<protocol::Address> replicas_;
  const std::shared_ptr<net::TlsContext> tls_;
  absl::Mutex mu_;  // one call at a time: a reconnect is not raced
  std::unique_ptr<BlockingConnection> conn_ ABSL_GUARDED_BY(mu_);
  size_t preferred_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::string PoolOwnerId::ToString() const {
  return absl::StrCat(epoch, ":", absl::BytesToHexString(key));
}

absl::StatusOr<PoolOwnerId> PoolOwnerId::Parse(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
  PoolOwnerId owner;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &owner.epoch) || owner.epoch == 0 ||
      parts[1].empty() || parts[1].size() % 2 != 0 ||
      parts[1].find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\" is not an owner: <epoch>:<key in hex>, as `lockctl pool claim` prints it"));
  }
  owner.key = absl::HexStringToBytes(parts[1]);
  return owner;
}

absl::StatusOr<std::unique_ptr<PoolClient>> PoolClient::Create(const PoolClientOptions& options) {
  if (options.timeout <= absl::ZeroDuration() || options.timeout > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat("the pool client's timeout ",
                                                   absl::FormatDuration(options.timeout),
                                                   " must be positive and at most 1h"));
  }
  auto replicas = protocol::ParseAddressList(options.server);
  if (!replicas.ok()) return replicas.status();
  std::shared_ptr<net::TlsContext> tls;
  const net::TlsFiles tls_files{.ca_file = options.tls_ca_file,
                                .cert_file = options.tls_cert_file,
                                .key_file = options.tls_key_file};
  if (tls_files.enabled()) {
    auto loaded = net::TlsContext::Create(tls_files, net::TlsRole::kClient, "tls_");
    if (!loaded.ok()) return loaded.status();
    tls = std::move(*loaded);
  }
  return std::unique_ptr<PoolClient>(new PoolClientImpl(options, std::move(*replicas), std::move(tls)));
}

}  // namespace fencelock
