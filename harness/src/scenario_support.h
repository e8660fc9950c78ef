// What the harness's scenarios share (scenarios.cc: one lockd; scenarios_replicated.cc: lockd
// replicas on etcd): starting the payout cluster with the scenario settings, following the
// history as the processes write it, waiting, and judging a run.
#ifndef FENCELOCK_HARNESS_SCENARIO_SUPPORT_H_
#define FENCELOCK_HARNESS_SCENARIO_SUPPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "protocol/defaults.h"
#include "payout-demo/cluster.h"
#include "process/history.h"
#include "scenario.h"

namespace fencelock::harness {

// Every scenario's processes use these. The usable lease, 4 s x 0.7 = 2.8 s, covers a rail
// submit's worst case, 300 ms + 2 s (D4), with room for the heartbeat.
inline constexpr absl::Duration kTtl = absl::Seconds(4);
inline constexpr double kMargin = defaults::kSafetyMargin;  // the contract's margin

std::string Secs(absl::Duration d);
// The time since `ns` on the history's clock.
absl::Duration Since(int64_t ns);

// Starts lockd and the rail with the scenario settings and loads `payouts` payouts. Workers
// get `worker_environment` ("NAME=value") on top of the harness's environment; `adjust` changes
// the options last (the replicated scenarios add etcd there).
absl::StatusOr<std::unique_ptr<payout::Cluster>> StartCluster(
    Env& env, int64_t payouts, std::vector<std::string> worker_environment = {},
    absl::Duration ttl = kTtl,
    const std::function<void(payout::ClusterOptions&)>& adjust = nullptr);
// Starts w1, w2 and w3, reaching lockd at `via` (empty: directly).
absl::Status StartWorkers(payout::Cluster& c, const std::string& via = "");
// Payouts loaded by the scenarios that fault lockd or the network under load.
int64_t BusyPayouts(const Env& env);
// A cluster with `payouts` payouts that w1, w2 and w3 are already paying through lockd.
absl::StatusOr<std::unique_ptr<payout::Cluster>> StartPaying(Env& env, int64_t payouts,
                                                             absl::Duration ttl = kTtl);

// Follows every history file of the run as the processes append to them.
class History {
 public:
  explicit History(std::string dir) : dir_(std::move(dir)) {}
  void Poll();
  // The first record (in the order read) that `match` accepts.
  std::optional<history::Record> Find(const std::function<bool(const history::Record&)>& match);
  int64_t Count(const std::string& event);

 private:
  std::string dir_;
  std::map<std::string, payout::LineTail> tails_;
  std::vector<history::Record> records_;
  std::map<std::string, int64_t> counts_;  // records_ per event
};

// Polls `done` every 5 ms until it holds or `timeout` passes.
absl::Status WaitUntil(const std::function<bool()>& done, absl::Duration timeout,
                       const std::string& what);
// Waits until `count` payouts have been paid (by anyone), for a fault in the middle of the run.
absl::Status AwaitPaid(History& h, int64_t count);
// Waits until each started worker has opened its lockd session, so that faults meet work in
// progress.
absl::Status AwaitSessions(payout::Cluster& c);
// Waits for every worker not in `killed` to exit; each must exit 0 (nothing left unpaid).
absl::Status WaitWorkers(payout::Cluster& cluster, Outcome& out, absl::Duration timeout,
                         const std::set<std::string>& killed = {});

struct Expectations {
  bool fences_quiet = true;       // lock_fenced_out_total and rail_fenced_out_total are zero
  bool expect_overlap = false;    // the client check is off: a client-believed overlap is due
  int64_t max_abandoned = -1;     // at most this many payouts abandoned; -1: any number
};
// Reconciles the ledger against the store, runs the history checker, and judges the run.
absl::Status Finish(payout::Cluster& cluster, Outcome& out, const Expectations& expect);

// The environment that runs a process under Debian's libfaketime, its wall clock offset by
// what `offset_file` holds (reread every second; "+0" to begin with), its monotonic and
// boot-time clocks untouched; kFailedPrecondition when libfaketime is not installed.
absl::StatusOr<std::vector<std::string>> FaketimeEnvironment(const std::string& offset_file);
// Steps the wall clock of the processes run with FaketimeEnvironment(offset_file): "+1h",
// "-1h", "+0".
void SetWallClockOffset(const std::string& offset_file, const std::string& offset);

// The replicated scenarios (scenarios_replicated.cc).
std::vector<Scenario> ReplicatedScenarios();

}  // namespace fencelock::harness

#endif  // FENCELOCK_HARNESS_SCENARIO_SUPPORT_H_
