// lockd's core, free of sockets, threads and real time: the lock service, request dispatch, the
// reply gate, lease expiry, the stall watch and each connection's protocol state, driven by an
// injected TimeSource and writing through an injected CommitLog.
//
// A transport (lockd's Asio listeners, or the deterministic simulator's network) calls
// Connect() for each new connection with a sink for its replies, Receive() with the request
// frames of each read, and Disconnect() when the peer is gone. The core answers through the
// sink once what a reply reflects is committed (the reply gate), pushes the outcome of queued
// acquires, expires leases on its timers, and, when it itself did not run for longer than the
// stall threshold, extends every lease by the time it lost before reading the clock for anything
// else.
//
// Not thread-safe: everything, the TimeSource's callbacks included, runs on one thread.
#ifndef FENCELOCK_LOCK_SERVER_SERVER_CORE_H_
#define FENCELOCK_LOCK_SERVER_SERVER_CORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "clock/time_source.h"
#include "lock-server/commit_log.h"
#include "lock-server/lock_service.h"
#include "lock-server/options.h"
#include "lock-server/permissions.h"

namespace fencelock::wire {
class Response;
class StatsReply;
}  // namespace fencelock::wire

namespace fencelock::server {

// Where the core writes one connection's replies. Implemented by the transport.
class ConnectionSink {
 public:
  virtual ~ConnectionSink() = default;
  // Writes encoded frames to the peer, after everything sent before. Must not call back into
  // the core (a write error closes the connection later, through Disconnect()).
  virtual void Send(std::string_view frames) = 0;
  // Stops reading requests; closes the connection once what was sent is flushed (a transport
  // may let the peer's remaining input drain for a moment first). Called at most once.
  virtual void CloseAfterSend() = 0;
};

// A reply by which lockd acts as the server of the state: a lock granted, a session renewed, a
// token confirmed valid. What the history of an HA run checks: no two lockd replicas act at
// once (harness/checker.h). kFencedOut is a stale token refused (lock_fenced_out_total), so
// that the count survives a replica that was killed.
struct Act {
  enum Kind { kGrant, kRenew, kValidate, kFencedOut };
  Kind kind;
  // Read before the check that the state is still this lockd's to serve, which found it so
  // until `owned_until` (Leadership::ServesUntil): at < owned_until.
  MonoTime at;
  MonoTime owned_until;
  std::string key;  // the lock; for kRenew the session id
  uint64_t token = 0;
};

struct CoreOptions {
  // The rules' limits and default TTLs. on_fenced_out defaults to `log`.
  ServiceOptions service;
  // The connections' limits and timeouts (the core uses the per-connection ones).
  ConnectionOptions connections;
  // lockd's own stalls. When the core's time source shows that it did not run for longer than
  // this (it was frozen, suspended with its VM, or starved of CPU), every session and lock
  // lease is extended by the time it lost, before any expiry or request is processed: clients
  // cannot renew a lease with a server that is not running, so the stall must not cost them
  // their leases. This is safe (a lease only looks held longer; the fences do not depend on
  // it) and keeps requests that waited in lockd's socket from being counted as fenced out. A
  // dead client's locks free that much later. Zero disables it. Default: 1 s.
  absl::Duration stall_threshold = absl::Seconds(1);
  // Where operator messages go (stalls, fenced-out requests). Default: stderr, "lockd: " first.
  std::function<void(const std::string&)> log;
  // Where session secrets come from: 16 bytes each that nobody can guess. Default: the
  // kernel's random number generator (getrandom). The simulator passes its seeded one.
  std::function<std::string()> session_secrets;
  // What each identity may do. Default: everything but the operator's rights (no permissions
  // file, and no known owner of the state: see Permissions::WithoutFile).
  Permissions permissions;
  // Called on the core's thread once a commit fault has been answered (every reply held for a
  // commit refused) and only if the log cannot come back from it (Leadership::leased).
  // Default: nothing (the core stays up, refusing what needs the state).
  std::function<void(const absl::Status&)> on_ending_fault;
  // Called for every act (see Act) as its reply is handed to the reply gate, and for every
  // stale token refused. Default: nothing.
  std::function<void(const Act&)> on_act;
  // Called on the core's thread when an operator's PoolStop was accepted (every pool drains
  // and holds no lease), after its reply was handed to the connection. Default: nothing (the
  // request is answered OK and lockd keeps serving).
  std::function<void()> on_stop_requested;
  // Called (on the core's thread) before a pool is published: takes the host's admission lock
  // if this lockd does not hold it yet, or says who does (ADR 0005). Returns a line for `log`
  // when it took the lock ("" when it held it already). Default: none (OK).
  std::function<absl::StatusOr<std::string>()> hold_admission_namespace;
  // Called (on the core's thread) when a publish was refused and no pool exists: the lock
  // taken for it goes (DispatchHost::LetGoOfAdmissionNamespace). Default: none.
  std::function<void()> let_go_of_admission_namespace;
  // With etcd: times this process was deposed before this core (it stood by again after each),
  // and why the last time; GetStats reports them. Default: none.
  uint64_t depositions = 0;
  std::string last_deposition;
};

// Figures the core counts (counters.h's FENCELOCK_CORE_COUNTERS; the transport's through
// ServerCore::CountTransportEvent), with the lock rules' and the pools', for GetStats and the
// metrics export.
struct CoreStats {
  ServiceStats service;
  PoolStats pools;
  FENCELOCK_COUNTERS_STRUCT_BODY(FENCELOCK_CORE_COUNTERS)
  // Every counter lockd keeps: the lock rules', the pools', then the core's.
  template <typename F>
  void ForEachCounter(F&& f) const {
    service.ForEach(f);
    pools.ForEach(f);
    ForEach(f);
  }
};

// What a transport did to a connection on its own, for the core's figures.
enum class TransportEvent {
  kClosedSlowReader,  // closed for not reading its replies
  kRefused,           // refused at admission
};

class ServerCore {
 public:
  // Starts from `opened` (the recovered state and the log that continues it). `time` outlives
  // the core. Does nothing until Start().
  ServerCore(const CoreOptions& options, TimeSource* time, OpenedCommitLog opened);
  ~ServerCore();
  ServerCore(const ServerCore&) = delete;
  ServerCore& operator=(const ServerCore&) = delete;

  // Gives every restored session, lock lease and provisional pool lease its full TTL from now
  // (the state may have been restored long before: a standby's wait, a slow restore), then
  // arms the expiry timer and the stall watch.
  void Start();
  // Cancels every timer; connections are left to the transport (which disconnects them).
  void Stop();

  // A new connection whose replies go to `sink` (which stays valid until Disconnect()), from a
  // peer authenticated as `identity` (empty: none, as on plaintext TCP). Arms its Hello
  // timeout.
  ConnectionId Connect(ConnectionSink* sink, std::string identity = "");
  // The complete request frames (payloads, without length prefixes) of one read, received now.
  // Every lease they touch is measured from one reading of the clock.
  void Receive(ConnectionId id, std::span<const std::string> payloads);
  // The connection's byte stream cannot continue (a frame announced more than the maximum):
  // counts a protocol error, answers `code` with `message`, and closes after sending.
  void RejectStream(ConnectionId id, int code, const std::string& message);
  // The peer is gone: its queued acquires are cancelled, its held replies dropped.
  void Disconnect(ConnectionId id);
  // Replies of `id` that wait for their commit (requests in flight, for back pressure).
  size_t HeldReplies(ConnectionId id) const;
  void CountTransportEvent(TransportEvent event);
  // Replaces the permissions (a reload): requests from now on are judged by `permissions`;
  // sessions and the locks they hold are left as they are.
  void SetPermissions(Permissions permissions);

  const LockService& service() const;
  const CommitLog& log() const;
  // Whether it serves, and until when. A core whose leadership is StandingBy answers every
  // request NOT_LEADER naming the serving replica, and closes the connection.
  const Leadership& leadership() const;
  CoreStats stats() const;
  void FillStats(wire::StatsReply* stats) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_SERVER_CORE_H_
