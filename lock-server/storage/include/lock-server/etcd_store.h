// The part of etcd's v3 API that the etcd commit log needs (ranges, transactions, leases,
// compaction, watches), as an interface: the log runs the same against a real etcd cluster
// over gRPC (lock-server/etcd_client.h) and against the simulated etcd (sim/sim_etcd.h).
//
// Two layers. EtcdClient is etcd's API as blocking calls. EtcdCalls is how the log reaches it
// without ever blocking its own thread: a call is handed over, runs elsewhere (on a thread
// that only carries it, or at the simulated etcd's simulated time), and its answer comes back
// as a task on the log's thread. CallOnThreads() makes the first into the second with threads;
// the simulator makes it with simulated latency and faults.
//
// The requests and replies are etcd's own protobuf messages. An implementation answers as etcd
// does: kNotFound for a lease that does not exist (a put on it included), kOutOfRange for a
// revision compacted away, kUnavailable or kDeadlineExceeded when it cannot answer (and then a
// request may or may not have been applied), and other codes for requests etcd refuses.
//
// Thread-safety: EtcdClient and EtcdWatch may be called from several threads at once; EtcdCalls
// belongs to its owner's thread.
#ifndef FENCELOCK_LOCK_SERVER_ETCD_STORE_H_
#define FENCELOCK_LOCK_SERVER_ETCD_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <functional>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clock/time_source.h"
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
  // The same without blocking: nullopt when nothing new has happened yet. Only the simulated
  // etcd, whose clients run on one thread, offers it; kUnimplemented otherwise.
  virtual absl::StatusOr<std::optional<Changes>> Poll() {
    return absl::UnimplementedError("this watch can only block");
  }
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

// An answer worth asking again: a member that timed out or is away, an election under way.
inline bool IsTransient(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

// A watch started through EtcdCalls. Destroying it stops the watch: no more reports after that.
class EtcdWatching {
 public:
  virtual ~EtcdWatching() = default;
};

// etcd without blocking the caller's thread (the owner: lockd's event loop, or a simulated
// node). Everything an EtcdCalls reports runs on the owner's thread, never inside the call that
// asked for it, and never after the EtcdCalls is destroyed. Not thread-safe: the owner's thread
// only.
class EtcdCalls {
 public:
  // Destroying it drops every answer not yet delivered; calls already handed over still run
  // (a lease revoked at a clean stop reaches etcd).
  virtual ~EtcdCalls() = default;
  // Runs `call` on the client, away from the owner's thread; then, on the owner's thread, the
  // task it returned. Calls may run at the same time and be answered in any order.
  using Call = std::function<std::function<void()>(EtcdClient&)>;
  virtual void Submit(Call call) = 0;
  // Watches `key` from `start_revision`: `report` gets each batch of changes, in order, on the
  // owner's thread; after a non-OK one (as EtcdWatch::Next's) it is never called again.
  using WatchReport = std::function<void(absl::StatusOr<EtcdWatch::Changes>)>;
  virtual std::unique_ptr<EtcdWatching> Watch(std::string key, int64_t start_revision,
                                              WatchReport report) = 0;
  // The members' endpoints (the client's).
  virtual const std::vector<std::string>& endpoints() const = 0;
};

// Submit() with a typed answer: `call` runs on the client, `reply` gets its result on the
// owner's thread.
template <typename T>
void CallEtcd(EtcdCalls& calls, std::function<T(EtcdClient&)> call,
              std::function<void(T)> reply) {
  calls.Submit([call = std::move(call), reply = std::move(reply)](EtcdClient& c) mutable {
    return std::function<void()>(
        [result = call(c), reply = std::move(reply)]() mutable { reply(std::move(result)); });
  });
}

// EtcdCalls over a blocking client, with threads that only carry its calls: a few workers for
// calls (more are started while every one is busy, up to 8; beyond that calls wait their
// turn) and one thread per watch. Answers are posted to `owner`, whose Post() must be
// thread-safe (lockd's Asio loop). Its destructor waits for the calls under way (each at most
// the client's request timeout) and runs the ones still queued, dropping their answers.
std::unique_ptr<EtcdCalls> CallOnThreads(std::unique_ptr<EtcdClient> client, TimeSource* owner);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ETCD_STORE_H_
