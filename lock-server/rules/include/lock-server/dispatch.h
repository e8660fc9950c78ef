// What lockd does with one request frame, apart from the connection it came on: parse it,
// check the connection's state (Hello first, the per-connection session limit), apply it to
// the LockService, and build the reply. The server's connections call it for every frame, and
// so does the dispatch fuzz target, against a LockService and nothing else.
//
// Not thread-safe: the caller's one thread owns the host and the connection state.
#ifndef FENCELOCK_LOCK_SERVER_DISPATCH_H_
#define FENCELOCK_LOCK_SERVER_DISPATCH_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "clock/clock.h"
#include "fencelock/wire.pb.h"
#include "lock-server/leadership.h"
#include "lock-server/lock_service.h"
#include "lock-server/permissions.h"

namespace fencelock::server {

// What lockd remembers about one connection between its requests.
struct ConnectionState {
  // Who drives the sessions of this connection (see LockService::Authorize).
  Caller caller;
  bool hello_done = false;
  uint32_t version = 0;  // negotiated by Hello
  std::vector<SessionId> sessions;  // opened on this connection (some may have ended since)
  // Sessions opened elsewhere and resumed on this connection (a client that reconnected),
  // at most max_sessions_per_connection, the newest last.
  std::vector<SessionId> renewed;
  // This connection's Acquires that wait in a queue, by request id (WithdrawAcquire names them
  // so): the one index of them. Dispatch adds them, refusing an id already here; whoever
  // answers a waiter removes it; a closed connection's are cancelled from it.
  absl::flat_hash_map<uint64_t, WaiterId> queued;
};

// What a request may need from the server around the lock service.
class DispatchHost {
 public:
  virtual ~DispatchHost() = default;
  virtual LockService& service() = 0;
  // The commit fault that stopped mutations; nullptr while healthy.
  virtual const absl::Status* fault() const = 0;
  // What an operator does about it, for the refusals' messages.
  virtual std::string FaultRemedy() const { return "restart it once the disk is fixed"; }
  // A standby replica's answer to everything: NOT_LEADER naming the serving replica (its TCP
  // address, and how it describes itself). Null for a lockd that does not stand by.
  virtual const StandingBy* standby() const { return nullptr; }
  virtual WaiterId NextWaiterId() = 0;
  // The secret of a new session: 16 bytes nobody can guess (see OpenSessionReply.secret).
  virtual std::string NewSessionSecret() = 0;
  virtual void CountProtocolError() = 0;
  virtual void FillStats(wire::StatsReply* stats) const = 0;
  virtual size_t max_sessions_per_connection() const = 0;
  // What each identity may acquire and list (lockd's permissions file).
  virtual const Permissions& permissions() const = 0;
  // Largest reply frame lockd sends, in bytes.
  virtual size_t max_frame_bytes() const = 0;
  // An operator's PoolStop was accepted: stop serving once its reply is out. Default: nothing.
  virtual void RequestStop() {}
  // Before a pool is published: this lockd becomes the host's admission coordinator, or is
  // told (kFailedPrecondition) which other process is (ADR 0005). Default: OK.
  virtual absl::Status HoldAdmissionNamespace() { return absl::OkStatus(); }
  // A publish was refused and lockd coordinates no pool after all: it lets go of the host's
  // admission lock it took for it, so that a mistaken publish on the wrong lockd does not keep
  // the host's coordinator out. Default: nothing.
  virtual void LetGoOfAdmissionNamespace() {}
};

struct Dispatched {
  enum class Then {
    kReply,          // send `response`
    kReplyAndClose,  // send `response`, then close: the stream cannot continue
    kQueued,         // no reply now: `waiter` is answered by a push when its wait is settled
  };
  Then then = Then::kReply;
  wire::Response response;  // request_id set whenever the request parsed
  WaiterId waiter = 0;
  // Set when the reply reflects nothing but these facts, each already in the state: the
  // sessions' opening and the grants of these tokens (a KeepAlive that renewed its session and
  // every lock it named, a Renew that renewed every session it named and all their locks).
  // Renewals are never logged, so such a reply needs only those records committed, not every
  // record applied before it (docs/durability.md, "What a reply waits for").
  struct Reflects {
    std::vector<SessionId> sessions;
    std::vector<FenceToken> grants;
  };
  std::optional<Reflects> reflects;
};

// `now` is when the frame was received: every lease it touches is measured from it.
Dispatched Dispatch(std::string_view payload, ConnectionState& conn, DispatchHost& host,
                    MonoTime now);

// Answers ListLocks from the service's state as of `now`: one page of at most query.limit
// entries and query.max_bytes bytes, never more than `max_page_bytes`. Costs a seek and the
// page, however many locks and sessions exist.
void FillList(const LockService& service, const wire::ListLocks& query, wire::ListReply* list,
              MonoTime now, size_t max_page_bytes);


}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_DISPATCH_H_
