// A payout run's processes, for the demo runner and the fault harness: lockd on a fresh state
// directory, the rail simulator, payout workers, the payout store they share, and the
// reconciliation of the rail's ledger against the store once the work is done.
//
// Every process logs to <dir>/logs/<name>.log; with `history` on, each also appends timed
// records to <dir>/history/<name>.log (process/history.h). The destructor stops every process
// still running (SIGCONT, SIGTERM, then SIGKILL), a frozen one included.
#ifndef FENCELOCK_PAYOUT_DEMO_CLUSTER_H_
#define FENCELOCK_PAYOUT_DEMO_CLUSTER_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "net/tls.h"
#include "payout-demo/store.h"
#include "protocol/defaults.h"
#include "process/process.h"

namespace fencelock::payout {

struct ClusterOptions {
  std::string dir;  // an existing, empty directory
  std::string lockd_binary, rail_binary, worker_binary;
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
  std::string HistoryPath(const std::string& process) const {
    return Path("history/" + process + ".log");
  }
  const ClusterOptions& options() const { return options_; }
  const std::string& lockd_address() const { return lockd_address_; }
  // For the harness's own connections to lockd: a TLS client context with the workers'
  // certificate when the cluster runs TLS (ClusterOptions::tls_dir), else nullptr.
  std::shared_ptr<net::TlsContext> lockd_tls() const { return lockd_tls_; }
  int lockd_port() const { return lockd_port_; }
  const std::string& rail_address() const { return rail_address_; }
  process::Child& lockd() { return lockd_; }
  process::Child& rail() { return rail_; }
  PayoutStore& store() { return *store_; }

  // Loads `count` PENDING payouts (ids continue after any loaded before).
  absl::Status Load(int64_t count, int64_t amount_cents);
  // Starts worker `name` with the run's TTLs and margin, talking to `lockd_address` (empty:
  // lockd itself; a fault proxy's address otherwise), with `extra_args` appended.
  absl::StatusOr<process::Child*> StartWorker(const std::string& name,
                                              const std::vector<std::string>& extra_args = {},
                                              const std::string& lockd_address = "");
  process::Child* worker(const std::string& name);
  std::vector<std::string> worker_names() const;

  // Starts `lockd serve` on the state directory, on the port it had before if any.
  absl::Status StartLockd();
  // A value of lockd's /metrics (an unlabelled series).
  absl::StatusOr<double> LockdMetric(const std::string& name) const;

  // Reads lockd's lock_fenced_out_total, stops lockd and the rail, and reconciles the rail's
  // ledger against the store. Call after the workers are done.
  absl::StatusOr<Reconciliation> Reconcile();

 private:
  explicit Cluster(ClusterOptions options) : options_(std::move(options)) {}
  absl::StatusOr<process::Child> Spawn(const std::string& binary,
                                       const std::vector<std::string>& args,
                                       const std::string& log) const;
  absl::Status StartRail();

  const ClusterOptions options_;
  process::Child lockd_, rail_;
  std::map<std::string, process::Child> workers_;
  std::string lockd_address_, rail_address_;
  std::shared_ptr<net::TlsContext> lockd_tls_;
  int lockd_port_ = 0;
  int lockd_metrics_port_ = 0;
  std::unique_ptr<PayoutStore> store_;
};

}  // namespace fencelock::payout

#endif  // FENCELOCK_PAYOUT_DEMO_CLUSTER_H_
