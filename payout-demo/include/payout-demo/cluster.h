// A payout run's processes, for the demo runner and the fault harness: lockd on a fresh state
// directory, the rail simulator, payout workers, the payout store they share, and the
// reconciliation of the rail's ledger against the store once the work is done. Replicated
// (ClusterOptions::etcd_members), lockd's state lives in a local etcd cluster instead and
// several lockd replicas share it: the first serves, the others stand by (issue 16).
//
// Every process logs to <dir>/logs/<name>.log; with `history` on, each also appends timed
// records to <dir>/history/<name>.log (process/history.h). The destructor stops every process
// still running (SIGCONT, SIGTERM, then SIGKILL), a frozen one included.
#ifndef FENCELOCK_PAYOUT_DEMO_CLUSTER_H_
#define FENCELOCK_PAYOUT_DEMO_CLUSTER_H_

#include <cstdint>
#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "net/tls.h"
#include "payout-demo/etcd_cluster.h"
#include "payout-demo/store.h"
#include "protocol/defaults.h"
#include "process/process.h"

namespace fencelock::payout {

struct ClusterOptions {
  std::string dir;  // an existing, empty directory
  // Where lockd's state directory (lockd/), the store (payouts.db) and the rail's ledger
  // (rail.db) go, an existing directory: the power-cut run puts them on a file system that
  // forgets, and the logs and port files beside it. Default: empty, `dir`.
  std::string data_dir;
  // More flags for every `lockd init` and `lockd serve` of a local lockd (the power-cut run
  // gives a small --wal-segment-bytes). Default: none.
  std::vector<std::string> lockd_extra_args;
  std::string lockd_binary, rail_binary, worker_binary;
  // The Python payout worker (python/examples/payout_worker.py), for StartWorker(..., python):
  // the interpreter, the script and the directory of the fencelock module. Default: empty, no
  // Python workers (a tree without the module).
  std::string python, python_worker, python_module_dir;
  absl::Duration rail_latency = absl::Milliseconds(20);
  absl::Duration rail_jitter = absl::Milliseconds(10);
  absl::Duration rail_read_timeout = absl::Milliseconds(500);
  uint64_t rail_seed = 1;
  absl::Duration session_ttl = absl::Seconds(5);
  absl::Duration lock_ttl = absl::Seconds(5);
  double margin = defaults::kSafetyMargin;
  bool history = false;
  // "NAME=value" entries added to every worker's environment (the harness runs workers with
  // libfaketime this way). Default: none.
  std::vector<std::string> worker_environment;
  // A directory made by scripts/make-certs.sh DIR lockd worker: lockd serves TLS with
  // lockd.{crt,key}, and every worker connects with worker.{crt,key}. Default: empty,
  // plaintext loopback.
  std::string tls_dir;
  // Replicated: lockd's state in an etcd cluster of this many members (EtcdCluster), served by
  // `lockd_replicas` lockd processes on one prefix, lockd-a serving and the others standing by
  // (--etcd-standby), each on a port of its own that the workers all get (--lockd=a,b,c).
  // Every replica appends its acts to the history (lockd --history) when `history` is on.
  // Default: 0, one lockd on a local state directory.
  int etcd_members = 0;
  std::string etcd_binary = "/usr/bin/etcd";
  int lockd_replicas = 3;
  // Replicated: certificates made by scripts/make-certs.sh DIR etcd lockd; the etcd members
  // then require client certificates (EtcdClusterOptions::tls_dir) and every replica presents
  // lockd's. Default: empty, plaintext to etcd.
  std::string etcd_tls_dir;
  // Replicated: more of etcd's flags for every member (EtcdClusterOptions::extra_args).
  std::vector<std::string> etcd_extra_args;
  // A replica's lease on the prefix (lockd --etcd-owner-ttl). Default: 2 s.
  absl::Duration etcd_owner_ttl = absl::Seconds(2);
  // The --etcd endpoints replica `i` is given; default (empty): the cluster's own. The harness
  // routes a replica through fault proxies this way.
  std::function<absl::StatusOr<std::string>(int replica, EtcdCluster& etcd)> etcd_route;
  // "NAME=value" entries added to replica `i`'s environment (the harness steps one replica's
  // wall clock with libfaketime this way). Default: none.
  std::function<std::vector<std::string>(int replica)> lockd_environment;
};

// The rail's ledger against the store, after the run.
struct Reconciliation {
  int64_t payouts = 0, paid_once = 0, paid_twice = 0, left = 0;
  double lock_fenced_out = -1;  // lockd's lock_fenced_out_total
  int64_t rail_duplicates = 0, rail_fenced_out = 0, status_queries = 0, claims = 0;
  std::map<std::string, int64_t> abandoned;  // by reason
  // Every payout paid exactly once and both must-be-zero counters at zero.
  bool ok() const {
    return paid_twice == 0 && left == 0 && paid_once == payouts && lock_fenced_out == 0 &&
           rail_duplicates == 0;
  }
};

// Follows a growing text file line by line.
class LineTail {
 public:
  explicit LineTail(std::string path) : path_(std::move(path)) {}
  // New complete lines since the last call. The file is opened once it exists and then kept
  // open; a partial last line is left for the next call.
  std::vector<std::string> Poll();

 private:
  std::string path_;
  std::ifstream in_;
  std::string partial_;
};

class Cluster {
 public:
  // Initializes lockd's state directory and starts lockd and the rail.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(ClusterOptions options);
  ~Cluster();

  std::string Path(const std::string& name) const { return options_.dir + "/" + name; }
  // Where lockd's state, the store and the ledger are (ClusterOptions::data_dir).
  std::string DataPath(const std::string& name) const {
    return (options_.data_dir.empty() ? options_.dir : options_.data_dir) + "/" + name;
  }
  // Replicated: the etcd prefix the replicas serve.
  const std::string& etcd_prefix() const { return etcd_prefix_; }
  std::string HistoryPath(const std::string& process) const {
    return Path("history/" + process + ".log");
  }
  const ClusterOptions& options() const { return options_; }
  // What the workers are given: lockd's address, or every replica's, comma-separated.
  const std::string& lockd_address() const { return lockd_address_; }
  // For the harness's own connections to lockd: a TLS client context with the workers'
  // certificate when the cluster runs TLS (ClusterOptions::tls_dir), else nullptr.
  std::shared_ptr<net::TlsContext> lockd_tls() const { return lockd_tls_; }
  // The port of lockd, or of the first replica.
  int lockd_port() const { return replicas_[0].port; }
  // The port of replica `i`.
  int replica_port(int i) const { return replicas_[i].port; }
  const std::string& rail_address() const { return rail_address_; }
  // lockd; replicated, the replica that serves now (see ServingReplica()).
  process::Child& lockd() { return replicas_[std::max(ServingReplica(), 0)].child; }
  bool replicated() const { return etcd_ != nullptr; }
  EtcdCluster* etcd() { return etcd_.get(); }
  int replica_count() const { return static_cast<int>(replicas_.size()); }
  process::Child& replica(int i) { return replicas_[i].child; }
  // "lockd" or "lockd-a", "lockd-b", ...: its name in the logs and the history.
  const std::string& replica_name(int i) const { return replicas_[i].name; }
  // The replica that serves: running, and listening (it wrote its port file), the newest such
  // if several did; -1 if none does.
  int ServingReplica();
  // Waits up to `timeout` for a replica other than `not_this` (-1: any) to serve.
  absl::StatusOr<int> AwaitServingReplica(int not_this, absl::Duration timeout);
  process::Child& rail() { return rail_; }
  // Starts the rail on its ledger (again, once it has exited: the power-cut run restarts it).
  absl::Status StartRail();
  // The runner's own connection to the store (open unless CloseStore() closed it).
  PayoutStore& store() { return *store_; }
  // Closes the runner's connection to the store, and opens it again (Load() and Reconcile()
  // do when it is closed): on a host whose power is cut, no connection of a process that is
  // gone is closed cleanly, and closing the last one checkpoints the WAL.
  void CloseStore() { store_.reset(); }
  absl::Status OpenStore();

  // Loads `count` PENDING payouts (ids continue after any loaded before).
  absl::Status Load(int64_t count, int64_t amount_cents);
  // Starts worker `name` with the run's TTLs and margin, talking to `lockd_address` (empty:
  // lockd itself; a fault proxy's address otherwise), with `extra_args` appended; with
  // `python`, the Python payout worker on the fencelock module instead of `worker_binary`
  // (kFailedPrecondition without one; kInvalidArgument with `history`, which it does not keep).
  absl::StatusOr<process::Child*> StartWorker(const std::string& name,
                                              const std::vector<std::string>& extra_args = {},
                                              const std::string& lockd_address = "",
                                              bool python = false);
  process::Child* worker(const std::string& name);
  std::vector<std::string> worker_names() const;

  // Starts `lockd serve` on the state directory, on the port it had before if any; replicated,
  // starts replica `replica` again (as a standby) once it has exited.
  absl::Status StartLockd(int replica = 0);
  // A value of lockd's /metrics (an unlabelled series); replicated, the serving replica's.
  absl::StatusOr<double> LockdMetric(const std::string& name);

  // Reads lockd's lock_fenced_out_total (replicated: the lockd-fenced-out records of every
  // replica in the history, so that a killed replica's count is not lost), stops lockd and the
  // rail, and reconciles the rail's ledger against the store. Call after the workers are done.
  absl::StatusOr<Reconciliation> Reconcile();

 private:
  explicit Cluster(ClusterOptions options) : options_(std::move(options)) {}
  absl::StatusOr<process::Child> Spawn(const std::string& binary,
                                       const std::vector<std::string>& args,
                                       const std::string& log) const;
  absl::Status StartEtcd();
  std::vector<std::string> ServeArgs(int replica, bool standby);

  struct Replica {
    std::string name;
    process::Child child;
    int port = 0;          // 0 until known (a local lockd picks its own)
    int metrics_port = 0;  // read from its port file once it serves
    int serving_since = 0;  // the order in which replicas began to serve; 0: not seen serving
  };
  const ClusterOptions options_;
  std::unique_ptr<EtcdCluster> etcd_;
  std::string etcd_prefix_;
  std::vector<Replica> replicas_;
  int servings_ = 0;
  process::Child rail_;
  std::map<std::string, process::Child> workers_;
  std::string lockd_address_, rail_address_;
  std::shared_ptr<net::TlsContext> lockd_tls_;
  std::unique_ptr<PayoutStore> store_;
};

}  // namespace fencelock::payout

#endif  // FENCELOCK_PAYOUT_DEMO_CLUSTER_H_
