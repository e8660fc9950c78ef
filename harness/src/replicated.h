// What the replicated scenarios share (issues 16, 33 and 37, docs/harness.md): lockd's state in
// a 3-member etcd cluster and three lockd replicas on it. scenarios_replicated.cc faults the
// serving replica, etcd or its data once (Replicated); scenarios_etcd_faults.cc runs the longer
// etcd faults (elections, a slow or full etcd, a stepped clock, taken ports). The long holders
// and the prober here watch every run from the clients' side.
#ifndef FENCELOCK_HARNESS_REPLICATED_H_
#define FENCELOCK_HARNESS_REPLICATED_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "harness/fault_proxy.h"
#include "payout-demo/cluster.h"
#include "process/history.h"
#include "scenario_support.h"

namespace fencelock::harness::replicated {

// Replicated runs (issue 16): lockd's state in a 3-member etcd cluster, three lockd replicas on
// it (lockd-a serving, lockd-b and lockd-c standing by), the workers given all three.
inline constexpr absl::Duration kOwnerTtl = absl::Seconds(2);  // each replica's lease on the prefix
inline constexpr absl::Duration kOwnerTtlThroughElection = absl::Seconds(5);

// How long the standbys have stood by before any fault: longer than a long holder's TTL, so
// that a replica that counted restored leases from the start of its wait would expire live
// holders at once (issue 33).
inline constexpr absl::Duration kStandbyWait = absl::Seconds(7);

// The replicated shape: 3 etcd members (requiring client certificates when the run has
// Env::etcd_tls_dir) and 3 lockd replicas with `owner_ttl` on the prefix.
void Replicas(const Env& env, absl::Duration owner_ttl, payout::ClusterOptions& o);

// Holders that keep a lock for seconds across whatever the run does (issue 33), checking every
// millisecond that they still hold it (checkStillHeld, the client's local check on its own
// boot-time clock). Each hold is recorded as "acquire" (begin: sent, end: the grant received)
// and "held" (begin: the grant received, end: the last check that passed), so that the
// checker compares every holder's timeline with the others' (client-believed overlaps). Four
// holders, each with a client of its own given every replica, share two locks, so that a lock
// is always wanted by another holder when its holder's lease could be misjudged. One hold in
// three is shared (ADR 0006; its "acquire" says so), which the checker lets overlap only
// another shared hold.
class LongHolders {
 public:
  static constexpr absl::Duration kTtl = absl::Seconds(5);

  LongHolders(const std::string& servers, const std::string& history_dir, uint64_t seed);
  ~LongHolders() { Stop(); }
  void Stop();
  // Stops them and judges what they saw: each started, held something, and (from the checker,
  // later) no hold overlapped another. Losses are allowed (a failover can outlast a holder's
  // lease; D5 loses the lock cleanly). `fault_at`: when the run's fault came, for the count of
  // holds across it (0: no single fault).
  void Judge(Outcome& out, int64_t fault_at = 0);
  std::string error() const;
  // Holds whose span [grant received, last check passed] contains `at_ns`.
  int64_t HeldAcross(int64_t at_ns) const;

 private:
  void Run(int i, const std::string& servers, const std::string& history_dir, uint64_t seed);

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> holds_{0}, lost_{0};
  mutable absl::Mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> spans_ ABSL_GUARDED_BY(mu_);
  std::string error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// Acquires and releases a lock every 10 ms through a client given every replica, noting when
// each grant arrived: the pauses a client sees, on its boot-time clock.
class Prober {
 public:
  explicit Prober(const std::string& servers) : thread_([this, servers] { Run(servers); }) {}
  ~Prober() { Stop(); }
  void Stop();
  // The longest time without a grant over [from_ns, to_ns], counting from the last grant
  // before from_ns.
  absl::Duration LongestPause(int64_t from_ns, int64_t to_ns) const;
  int64_t grants() const;

 private:
  void Run(const std::string& servers);

  std::atomic<bool> stop_{false};
  mutable absl::Mutex mu_;
  std::vector<int64_t> grants_ ABSL_GUARDED_BY(mu_);  // ascending
  std::thread thread_;
};

// What a stranger who can read etcd would try as session secrets: every 16-byte protobuf field
// with SessionOpened.secret's tag (3) and every 32-byte one with secret_digest's (5), in the
// bytes etcdctl printed.
std::set<std::string> SecretCandidates(const std::string& dump);
// The first grant decided by a replica other than `old` (any, if old < 0) at or after `from_ns`.
std::optional<history::Record> FirstGrantAfter(History& h, const std::string& old, int64_t from_ns);
// When `replica` began to serve after `from_ns`, by its own record. lockd writes its port file
// (which is how the cluster learns that it serves) before that record, so the record may come
// a little after the cluster noticed: it is waited for, not merely looked up.
absl::StatusOr<history::Record> AwaitServingRecord(History& h, const std::string& replica,
                                                   int64_t from_ns);
// The last act of `replica` and the ownership deadline it held for it.
std::optional<history::Record> LastAct(History& h, const std::string& replica);
// One fault proxy per etcd member (made on first use) and the --etcd endpoints through them.
std::string ProxiedEndpoints(std::vector<std::unique_ptr<FaultProxy>>& proxies,
                             payout::EtcdCluster& etcd);

// --- the scenarios ---
enum class HaFault { kLockdKill, kLockdFreeze, kEtcdLeaderKill, kEtcdCut, kOwnerDeleted,
                     kEtcdStranger };
// One fault of the serving replica, of etcd or of its data, under load (scenarios_replicated.cc).
absl::Status Replicated(Env& env, Outcome& out, HaFault fault);
// scenarios_etcd_faults.cc:
absl::Status Elections(Env& env, Outcome& out);
absl::Status SlowEtcd(Env& env, Outcome& out);
absl::Status ReplicaClockStep(Env& env, Outcome& out);
absl::Status EtcdNoSpace(Env& env, Outcome& out);
absl::Status PortTaken(Env& env, Outcome& out);

}  // namespace fencelock::harness::replicated

#endif  // FENCELOCK_HARNESS_REPLICATED_H_
