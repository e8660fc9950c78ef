// A simulated etcd cluster: the part of etcd's v3 semantics that the etcd commit log relies on
// (lock-server/etcd_store.h), in memory, linearizable, with leases that expire on a clock of its
// own, and with a cluster's faults on demand:
//   - a linearizable KV with one revision per change, create/mod revisions and versions;
//   - transactions with compares (version, create, mod, value, lease) and puts, deletes and
//     ranges in either branch; a put on a lease that does not exist fails the whole
//     transaction, kNotFound, as in etcd;
//   - leases granted in whole seconds, kept alive, revoked, and expiring on the clock: the keys
//     on an expired lease go in one revision;
//   - compaction (older revisions are refused kOutOfRange) and watches of one key;
//   - faults: unavailable for a while (a leader election: every call fails kUnavailable and
//     open watches break), a reply lost after its transaction was applied, NOSPACE.
// Time passes only through the clock: a lease expires when a call (or Tick()) finds its
// deadline passed, as etcd's leader would find it.
//
// Thread-safe: clients may call from several threads; the test moves the clock from another.
#ifndef FENCELOCK_SIM_SIM_ETCD_H_
#define FENCELOCK_SIM_SIM_ETCD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "clock/clock.h"
#include "lock-server/etcd_store.h"

namespace fencelock::sim {

class SimEtcd {
 public:
  // Leases expire on `clock`, which must outlive this object and every client.
  explicit SimEtcd(Clock* clock);
  ~SimEtcd();
  SimEtcd(const SimEtcd&) = delete;
  SimEtcd& operator=(const SimEtcd&) = delete;

  // A client of the cluster, as one lockd replica has: its calls see the faults set below.
  // `name` is the client's, for Partition(); `members` the cluster's endpoints it reports
  // (MemberStatus answers for each).
  std::unique_ptr<server::EtcdClient> Connect(std::string name,
                                              std::vector<std::string> members = {"sim-etcd-0"});

  // --- faults ---
  // While true, every call fails kUnavailable and changes nothing, and open watches break:
  // the cluster has no leader (an election, a partition).
  void SetUnavailable(bool unavailable);
  // While true, the calls of the clients named `name` fail kUnavailable, and their watches
  // break: that replica is cut off from etcd (the others are not).
  void Partition(const std::string& name, bool partitioned);
  // The next `n` transactions that change something are applied, and then answered kUnavailable:
  // the reply was lost after the commit.
  void LoseRepliesAfterCommit(int n);
  // While true, a transaction that writes fails kResourceExhausted ("etcdserver: mvcc: database
  // space exceeded"), as etcd does once its quota alarm is raised.
  void SetNoSpace(bool no_space);

  // --- for tests, as an operator with etcdctl would ---
  // Expires what the clock says has expired (calls do it too).
  void Tick();
  int64_t revision() const;
  // Every key under `prefix` with its value, in key order.
  std::vector<std::pair<std::string, std::string>> Dump(const std::string& prefix) const;
  // Deletes `key` (one revision, watched like any change); whether it existed.
  bool Delete(const std::string& key);
  // Puts `key` without a lease.
  void Put(const std::string& key, const std::string& value);
  // Leases currently alive.
  size_t leases() const;
  // `key` as it is now, or nullopt.
  std::optional<etcdserverpb::KeyValue> Get(const std::string& key) const;
  // When lease `id` runs out on the clock, or nullopt if it is gone.
  std::optional<MonoTime> LeaseExpiresAt(int64_t id) const;
  // When the next lease runs out on the clock (MonoTime::Max() for none): Tick() then.
  MonoTime NextExpiry() const;

  // --- for a simulator on one thread ---
  // `fn` is called after every change (with its event: a put, or a delete by a call, by hand or
  // by a lease running out) and, with nullptr, after every fault set or lifted, so that open
  // watches are polled (EtcdWatch::Poll). It runs while the cluster's lock is held: it must
  // not call this object. Set it before any client connects.
  void SetObserver(std::function<void(const etcdserverpb::Event*)> fn);

  struct Core;  // the cluster's state, shared with its clients and watches

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace fencelock::sim

#endif  // FENCELOCK_SIM_SIM_ETCD_H_
