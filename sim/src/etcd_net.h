// The simulated network between lockd replicas and the simulated etcd: an EtcdCalls for each
// replica whose calls reach SimEtcd and come back as events of the simulation, with latency,
// slow periods and request timeouts, and with watches polled as etcd changes. Leases expire on
// etcd's clock (true time) when they run out, not only when a call finds them.
//
// A call's two legs are drawn when it is submitted. One whose request takes longer than the
// request timeout never reaches etcd and fails kDeadlineExceeded at the timeout; one whose
// request arrives in time but whose answer would not is applied, and fails kDeadlineExceeded
// at the timeout all the same (the reply was lost after the commit, as gRPC's deadline makes
// it). A replica that crashed sends nothing more; what it sent before still arrives. Answers
// are delivered on the replica's node, and never to a later incarnation of it.
//
// Single-threaded, like the rest of the simulation.
#ifndef FENCELOCK_SIM_ETCD_NET_H_
#define FENCELOCK_SIM_ETCD_NET_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "lock-server/etcd_store.h"
#include "sim/sim_etcd.h"
#include "world.h"

namespace fencelock::sim {

class EtcdNet {
 public:
  // etcd's own events (its calls, watches and lease expiries) run on `etcd_node`, which never
  // pauses. `etcd` must have been built on a clock of true time; everything outlives this.
  EtcdNet(World* world, Rng* rng, int etcd_node, SimEtcd* etcd);
  ~EtcdNet();
  EtcdNet(const EtcdNet&) = delete;
  EtcdNet& operator=(const EtcdNet&) = delete;

  // The calls of the replica on `node`, named `name` (SimEtcd::Partition's), whose requests
  // time out after `timeout`. Once `*dead` is true (the replica crashed), nothing it submits is
  // sent. `txn_check` (may be empty) runs before each transaction reaches etcd, and again
  // with its outcome: the simulator's checks of who commits.
  struct TxnCheck {
    std::function<void(const etcdserverpb::TxnRequest&)> before;
    std::function<void(const etcdserverpb::TxnRequest&,
                       const absl::StatusOr<etcdserverpb::TxnResponse>&)>
        after;
  };
  std::unique_ptr<server::EtcdCalls> Connect(int node, const std::string& name,
                                             absl::Duration timeout,
                                             std::shared_ptr<const bool> dead, TxnCheck check);

  // A slow member: until true time `until`, each leg of a call takes 20 to 600 ms.
  void SlowUntil(int64_t until) { slow_until_ = std::max(slow_until_, until); }
  // The replica on `node` stalls (a GC pause, a swapped-out page) for `length` of true time
  // from the moment etcd applies its next lease renewal: its answer waits for the replica, and
  // the lease may run out before the replica reads it.
  void StallAtNextRenewal(int node, int64_t length) { stalls_[node] = length; }

  // How many calls reached etcd, timed out, and how many watch reports were sent.
  uint64_t calls() const { return calls_; }
  uint64_t timeouts() const { return timeouts_; }

  // SimEtcd's observer calls this (a change, or nullptr for a fault): watches are polled at
  // once, and the expiry tick re-armed.
  void OnChange();

  struct WatchEntry;

 private:
  class Calls;
  class Watching;
  int64_t Leg();
  void Stall(int node);
  void PollWatches();
  void ArmTick();

  World* const world_;
  Rng* const rng_;
  const int etcd_node_;
  SimEtcd* const etcd_;
  int64_t slow_until_ = 0;
  uint64_t calls_ = 0;
  uint64_t timeouts_ = 0;
  bool poll_scheduled_ = false;
  int64_t tick_at_ = INT64_MAX;  // the earliest expiry tick scheduled
  std::list<std::shared_ptr<WatchEntry>> watches_;
  std::map<int, int64_t> stalls_;  // by node
};

}  // namespace fencelock::sim

#endif  // FENCELOCK_SIM_ETCD_NET_H_
