// The admission pools' requests (protocol version 2): from the wire to PoolService and back.
#include "dispatch_pool.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "protocol/codes.h"
#include "protocol/millis.h"
#include "protocol/pool_wire.h"
#include "protocol/version.h"

namespace fencelock::server {
namespace {

PoolOwner OwnerOf(const wire::PoolOwnerRef& ref) { return PoolOwner{ref.epoch(), ref.key()}; }

// One pool request on its way through DispatchPool: who asks, the access rules of ADR 0004 for
// it, and a handler per request body, each answering in `resp`.
struct PoolCall {
  const wire::Request& req;
  ConnectionState& conn;
  DispatchHost& host;
  const MonoTime now;
  wire::Response& resp;
  LockService& service;
  PoolService& pools;
  const Permissions& permissions;
  const std::string& who;   // the caller's identity
  const std::string name;   // and how messages name it
  const bool with_file;     // a permissions file decides (else the Unix socket's owner rules)

  void Finish(const absl::Status& s) {
    resp.set_code(protocol::PoolCodeFromStatus(s));
    if (!s.ok()) resp.set_message(std::string(s.message()));
  }
  absl::Status OperatorOnly(const char* what) const {
    if (permissions.IsOperator(who)) return absl::OkStatus();
    if (!with_file) {
      return service.Deny(absl::StrCat(
          name, " may not ", what, ": without a permissions file only the owner of lockd's state (",
          permissions.state_owner().empty() ? "unknown" : permissions.state_owner(),
          ") is the operator (ADR 0004)"));
    }
    return service.Deny(absl::StrCat(name, " may not ", what, " (", permissions.source(),
                                     " has no \"operator\" rule for it)"));
  }
  absl::Status ManagerOnly(const std::string& pool, const std::string& profile) const {
    if (permissions.MayManage(who, pool, profile)) return absl::OkStatus();
    return service.Deny(absl::StrCat(name, " may not manage ", pool, "/", profile, " (",
                                     permissions.source(), " has no \"manage\" rule for it)"));
  }
  // ADR 0004: a profile's manager is the identity that claimed it. The owner key is not enough:
  // a request of the current epoch from another identity is refused, whatever it knows (one
  // of an earlier epoch goes on, to be refused as stale).
  absl::Status ClaimerOnly(const std::string& pool, const std::string& profile,
                           const wire::PoolOwnerRef& owner) const {
    if (absl::Status s = ManagerOnly(pool, profile); !s.ok()) return s;
    const PoolOwnerState* current = pools.Owner(pool, profile);
    if (current == nullptr || current->epoch != owner.epoch() || current->claimed_by.empty() ||
        current->claimed_by == name) {
      return absl::OkStatus();
    }
    return service.Deny(absl::StrCat(name, " may not act for ", pool, "/", profile, " epoch ",
                                     current->epoch, ": ", current->claimed_by,
                                     " claimed it, and only the identity that claimed a profile "
                                     "manages it (ADR 0004)"));
  }
  // Without a file, a profile another identity claimed is taken over only by the same identity
  // (a replacement manager) or by the operator; with one, its "manage" rules decide.
  absl::Status MayClaim(const std::string& pool, const std::string& profile) const {
    if (absl::Status s = ManagerOnly(pool, profile); !s.ok() || with_file) return s;
    const PoolOwnerState* current = pools.Owner(pool, profile);
    if (current == nullptr || current->claimed_by.empty() || current->claimed_by == name ||
        permissions.IsOperator(who)) {
      return absl::OkStatus();
    }
    return service.Deny(absl::StrCat(name, " may not claim ", pool, "/", profile, ": ",
                                     current->claimed_by, " manages it (epoch ", current->epoch,
                                     "); without a permissions file only that identity or the "
                                     "operator (", permissions.state_owner(),
                                     ") may claim it again (ADR 0004)"));
  }

  void Publish();
  void Claim();
  void Ack();
  void SetDemand();
  void Acquire();
  void LeaseOp();
  void Recover();
  void Drain();
  void Status();
  void Delete();
  void Stop();
};

void PoolCall::Publish() {
  const auto& r = req.pool_publish();
  if (absl::Status s = OperatorOnly("publish pool policies"); !s.ok()) return Finish(s);
  if (absl::Status s = host.HoldAdmissionNamespace(); !s.ok()) return Finish(s);
  PoolPolicy policy{r.generation(), r.budget(), {}};
  for (const auto& p : r.profiles()) {
    policy.profiles.push_back(
        protocol::FromWire(p));
  }
  auto generation = pools.Publish(r.pool(), std::move(policy), now);
  if (generation.ok()) resp.mutable_pool_publish()->set_generation(*generation);
  if (!generation.ok() && pools.PoolNames().empty()) host.LetGoOfAdmissionNamespace();
  return Finish(generation.status());
}

void PoolCall::Claim() {
  const auto& r = req.pool_claim();
  if (absl::Status s = MayClaim(r.pool(), r.profile()); !s.ok()) return Finish(s);
  auto owner =
      pools.Claim(r.pool(), r.profile(), r.generation(), host.NewSessionSecret(), name, now);
  if (owner.ok()) {
    resp.mutable_pool_claim()->mutable_owner()->set_epoch(owner->epoch);
    resp.mutable_pool_claim()->mutable_owner()->set_key(owner->key);
  }
  return Finish(owner.status());
}

void PoolCall::Ack() {
  const auto& r = req.pool_ack();
  if (absl::Status s = ClaimerOnly(r.pool(), r.profile(), r.owner()); !s.ok()) {
    return Finish(s);
  }
  return Finish(pools.Ack(r.pool(), r.profile(), OwnerOf(r.owner()), r.generation(), now));
}

void PoolCall::SetDemand() {
  const auto& r = req.pool_set_demand();
  if (absl::Status s = ClaimerOnly(r.pool(), r.profile(), r.owner()); !s.ok()) {
    return Finish(s);
  }
  return Finish(pools.SetDemand(r.pool(), r.profile(), OwnerOf(r.owner()), r.slots(), now));
}

void PoolCall::Acquire() {
  const auto& r = req.pool_acquire();
  if (absl::Status s = ClaimerOnly(r.pool(), r.profile(), r.owner()); !s.ok()) {
    return Finish(s);
  }
  auto grant = pools.Acquire(r.pool(), r.profile(), r.slot(), OwnerOf(r.owner()),
                             protocol::FromWireMillis(r.ttl_ms()), now);
  if (grant.ok()) {
    auto* reply = resp.mutable_pool_acquire();
    reply->set_granted(grant->granted);
    if (grant->granted) {
      reply->set_token(grant->token.value());
      reply->set_ttl_ms(protocol::ToWireMillis(grant->ttl));
      reply->set_decision(grant->decision);
    } else {
      reply->set_refusal(grant->refusal);
    }
  }
  return Finish(grant.status());
}

void PoolCall::LeaseOp() {
  const wire::PoolLeaseOp& r = req.body_case() == wire::Request::kPoolRenew ? req.pool_renew()
                               : req.body_case() == wire::Request::kPoolActivate
                                   ? req.pool_activate()
                                   : req.pool_release();
  if (absl::Status s = ClaimerOnly(r.pool(), r.profile(), r.owner()); !s.ok()) {
    return Finish(s);
  }
  const PoolOwner owner = OwnerOf(r.owner());
  auto* reply = resp.mutable_pool_lease();
  if (req.body_case() == wire::Request::kPoolRenew) {
    auto ttl = pools.Renew(r.pool(), r.profile(), r.slot(), FenceToken(r.token()), owner, now);
    if (ttl.ok()) reply->set_ttl_ms(protocol::ToWireMillis(*ttl));
    return Finish(ttl.status());
  }
  auto decision =
      req.body_case() == wire::Request::kPoolActivate
          ? pools.Activate(r.pool(), r.profile(), r.slot(), FenceToken(r.token()), owner, now)
          : pools.Release(r.pool(), r.profile(), r.slot(), FenceToken(r.token()), owner, now);
  if (decision.ok()) reply->set_decision(*decision);
  return Finish(decision.status());
}

void PoolCall::Recover() {
  const auto& r = req.pool_recover();
  if (absl::Status s = OperatorOnly("recover pool leases"); !s.ok()) return Finish(s);
  auto decision =
      pools.Recover(r.pool(), r.profile(), r.slot(), FenceToken(r.token()), r.evidence(), now);
  if (decision.ok()) resp.mutable_pool_lease()->set_decision(*decision);
  return Finish(decision.status());
}

void PoolCall::Drain() {
  const auto& r = req.pool_drain();
  if (absl::Status s = OperatorOnly("drain pools"); !s.ok()) return Finish(s);
  return Finish(pools.SetDrain(r.pool(), r.draining(), now));
}

void PoolCall::Status() {
  const auto& r = req.pool_status();
  if (!permissions.MayList(who) && !permissions.IsOperator(who) &&
      !permissions.MayManageAny(who, r.pool())) {
    return Finish(service.Deny(absl::StrCat(
        Permissions::Name(who), " may not see pool ", r.pool(), " (", permissions.source(),
        " has no \"list\", \"operator\" or \"manage\" rule for it)")));
  }
  auto status = pools.Status(r.pool(), now);
  if (status.ok()) {
    protocol::ToWire(*status, resp.mutable_pool_status());
    if (const absl::Status* fault = host.fault(); fault != nullptr) {
      resp.mutable_pool_status()->set_degraded(absl::StrCat(
          "no new admission: lockd could not make its state durable (", fault->message(),
          "); every lease shown stays granted, and nothing is reclaimed; ",
          host.FaultRemedy()));
    }
  }
  return Finish(status.status());
}

void PoolCall::Delete() {
  if (!RequireVersion(conn, protocol::kPoolDeleteProtocolVersion, "PoolDelete needs", host,
                      resp)) {
    return;
  }
  if (absl::Status s = OperatorOnly("delete pools"); !s.ok()) return Finish(s);
  return Finish(pools.Delete(req.pool_delete().pool(), now));
}

void PoolCall::Stop() {
  // A request that ends the service: the operator's (without a file, the owner of lockd's
  // state on the Unix socket).
  if (absl::Status s = OperatorOnly("stop lockd"); !s.ok()) return Finish(s);
  if (absl::Status s = pools.CheckRetired(); !s.ok()) return Finish(s);
  host.RequestStop();
  return Finish(absl::OkStatus());
}

}  // namespace

bool IsPoolRequest(const wire::Request& req) {
  switch (req.body_case()) {
    case wire::Request::kPoolPublish:
    case wire::Request::kPoolClaim:
    case wire::Request::kPoolAck:
    case wire::Request::kPoolSetDemand:
    case wire::Request::kPoolAcquire:
    case wire::Request::kPoolRenew:
    case wire::Request::kPoolActivate:
    case wire::Request::kPoolRelease:
    case wire::Request::kPoolRecover:
    case wire::Request::kPoolDrain:
    case wire::Request::kPoolStatus:
    case wire::Request::kPoolStop:
    case wire::Request::kPoolDelete:
      return true;
    default:
      return false;
  }
}

bool RequireVersion(const ConnectionState& conn, uint32_t needed, const char* what,
                    DispatchHost& host, wire::Response& resp) {
  if (conn.version >= needed) return true;
  host.CountProtocolError();
  resp.set_code(wire::UNSUPPORTED_VERSION);
  resp.set_message(absl::StrCat(what, " protocol version ", needed,
                                "; this connection negotiated version ", conn.version));
  return false;
}

void DispatchPool(const wire::Request& req, ConnectionState& conn, DispatchHost& host,
                  MonoTime now, wire::Response& resp) {
  if (!RequireVersion(conn, protocol::kPoolProtocolVersion, "pool requests need", host, resp)) {
    return;
  }
  LockService& service = host.service();
  service.Advance(now);
  PoolService& pools = service.pools();
  const Permissions& permissions = host.permissions();
  const std::string& who = conn.caller.identity;
  const std::string name = Permissions::Name(who);
  const bool with_file = !permissions.source().empty();
  PoolCall call{req, conn, host, now, resp, service, pools, permissions, who, name, with_file};
  // ADR 0004: managers reach pools on the Unix socket (an identity "uid:<n>", the kernel's
  // word). Over TCP, plaintext or TLS, only a permissions file opens them, and its rules decide.
  if (!with_file && !absl::StartsWith(who, "uid:")) {
    return call.Finish(service.Deny(absl::StrCat(
        "pool requests are served only on lockd's Unix socket (ADR 0004), and ", name,
        " came over TCP; to serve pools over the network, give its identity a \"manage\" or "
        "\"operator\" rule in a permissions file (--permissions)")));
  }
  switch (req.body_case()) {
    case wire::Request::kPoolPublish:
      call.Publish();
      return;
    case wire::Request::kPoolClaim:
      call.Claim();
      return;
    case wire::Request::kPoolAck:
      call.Ack();
      return;
    case wire::Request::kPoolSetDemand:
      call.SetDemand();
      return;
    case wire::Request::kPoolAcquire:
      call.Acquire();
      return;
    case wire::Request::kPoolRenew:
    case wire::Request::kPoolActivate:
    case wire::Request::kPoolRelease:
      call.LeaseOp();
      return;
    case wire::Request::kPoolRecover:
      call.Recover();
      return;
    case wire::Request::kPoolDrain:
      call.Drain();
      return;
    case wire::Request::kPoolStatus:
      call.Status();
      return;
    case wire::Request::kPoolDelete:
      call.Delete();
      return;
    case wire::Request::kPoolStop:
      call.Stop();
      return;
    default:
      return call.Finish(absl::InternalError("not a pool request"));
  }
}

}  // namespace fencelock::server
