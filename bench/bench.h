// What fencelock-bench's workloads and its run share (fencelock_bench.cc reads the flags and
// runs the workloads in turn): the lockd they measure, the heartbeat workloads (heartbeat.cc),
// the lock-cycle systems (cycles.cc), one payout demo run (payout_scaling.cc) and the plots
// (plots.cc). common.h holds the clock, the percentiles and the closed-loop drivers.
#ifndef FENCELOCK_BENCH_BENCH_H_
#define FENCELOCK_BENCH_BENCH_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common.h"
#include "margin_sweep.h"
#include "net/blocking_connection.h"
#include "process/process.h"
#include "testing/local_lockd.h"

// The flags the workloads read (defined in fencelock_bench.cc).
ABSL_DECLARE_FLAG(absl::Duration, heartbeat);
ABSL_DECLARE_FLAG(absl::Duration, session_ttl);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(absl::Duration, library_heartbeat);

namespace fencelock::bench {

// A lockd on a fresh state folder in `dir`, on a free port, with the connection limits the
// 64-client and 10,000-session workloads need; stopped when destroyed.
absl::StatusOr<std::unique_ptr<testing::LocalLockd>> StartLockd(const std::string& binary,
                                                                const std::string& dir);

// A connection to lockd as the benchmark's raw driver, with --timeout.
absl::StatusOr<std::unique_ptr<net::BlockingConnection>> Connect(const std::string& address);

// lockd's GetStats through `conn`; an error for a failed call or a refusal.
absl::StatusOr<wire::StatsReply> Stats(net::BlockingConnection& conn);

// Receives the replies to `ids` (in any order) into `out`, in the order of `ids`.
absl::Status ReceiveAll(net::BlockingConnection& conn, const std::vector<uint64_t>& ids,
                        std::vector<wire::Response>& out);

// --- heartbeat RTT (heartbeat.cc) ---
// One connection's sessions, each holding the lock hb/<id>.
struct Heartbeater {
  std::unique_ptr<net::BlockingConnection> conn;
  std::vector<std::pair<uint64_t, uint64_t>> sessions;  // session id, token
};
// Opens `count` sessions on one connection, each acquiring hb/<first + i>.
absl::Status OpenSessions(Heartbeater& h, const std::string& address, size_t count,
                          size_t first);
// The durable load beside a heartbeat run: a connection of its own that acquires and releases
// `lock` as fast as lockd answers, counting each cycle, until `stop` (or a failure).
void CycleLoad(const std::string& address, const std::string& lock, const std::atomic<bool>& stop,
               std::atomic<uint64_t>& cycles);
struct HeartbeatResult {
  Percentiles rtt;
  std::vector<int64_t> rtt_ns;  // every sample, for the histogram
  size_t timeouts = 0;
  size_t failures = 0;
  double cycles_per_second = 0;  // of the load, when loaded
};
// Every session renews once per period, spread evenly over it, until `seconds` pass; with
// `load_clients`, a durable lock-cycle load runs beside it.
HeartbeatResult RunHeartbeats(std::vector<Heartbeater>& hs, double seconds, const std::string& label,
                              const std::string& address, int load_clients);
struct LibraryHeartbeatResult {
  double heartbeats = 0, failures = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0;  // milliseconds, from the histogram's buckets
  double cycles_per_second = 0;
};
// Clients of the library, each holding one lock and renewing it on the library's own heartbeat
// (its default period), all counting into one registry; read over `seconds`, idle then loaded.
std::vector<LibraryHeartbeatResult> RunLibraryHeartbeats(const std::string& address, size_t n,
                                                         double seconds, int load_clients,
                                                         std::string* error);

// --- lock cycles (cycles.cc) ---
// fencelock's systems: through the client library, or the raw protocol driver; each client on
// a lock of its own or (`contended`) all on one; `pipelined`: each Release sent with the next
// Acquire.
CyclerFactory LibraryCyclers(const std::string& address, bool contended, bool pipelined = false);
CyclerFactory RawCyclers(const std::string& address, bool contended, bool pipelined = false);
// The raw driver with every client on one thread.
StreamCyclerFactory LockdStreamCyclers(const std::string& address, bool pipelined);
// One system of the lock-cycle comparison.
struct System {
  std::string key;   // in results.json and the plot's data
  std::string name;  // in the tables and the plot
  CyclerFactory make;  // a thread per client (RunCycles); or, when empty:
  bool fencelock = false;
  StreamCyclerFactory stream = nullptr;  // every client on one thread (RunStreamCycles)
};
// One system at one client count, over the rounds.
struct Runs {
  std::vector<double> rates;
  std::vector<int64_t> acquire_ns;
  size_t errors = 0;
  std::string first_error;
  double min() const { return rates.empty() ? 0 : *std::min_element(rates.begin(), rates.end()); }
  double max() const { return rates.empty() ? 0 : *std::max_element(rates.begin(), rates.end()); }
  double median() const { return Median(rates); }
};

// --- payout scaling (payout_scaling.cc) ---
// One payout demo run without faults, from its --report_json.
struct DemoRun {
  bool ok = false;
  double payouts_per_second = 0;
  int64_t paid_once = 0, paid_twice = 0, left = 0, lock_fenced_out = 0, rail_duplicates = 0;
};
// The payout demo without faults in `dir`: `workers` workers paying `payouts` payouts.
absl::StatusOr<DemoRun> RunDemo(const std::string& demo, const std::string& lockd,
                                const std::string& rail, const std::string& worker,
                                const std::string& dir, int workers, int payouts);

// --- plots (plots.cc) ---
// One heartbeat run: its session count, idle or loaded.
struct HeartbeatVariant {
  size_t sessions;
  bool loaded;
  HeartbeatResult result;
};
// gnuplot scripts: each writes its data to `data_path` and returns the script's body.
std::string HeartbeatPlot(const std::vector<HeartbeatVariant>& variants, double threshold_ms,
                          const std::string& data_path);
std::string CyclesPlot(const std::vector<System>& systems, const std::vector<int>& clients,
                       const std::vector<std::vector<Runs>>& runs, const std::string& data_path);
std::string MarginPlot(const std::vector<MarginPoint>& points, const std::string& data_path);
// The scale workload's points (results.json's scale.held_locks): the cycle rate and the client's
// CPU per cycle against the locks held, on a log scale.
std::string ScalePlot(const Json& points, const std::string& data_path);
// Runs `body` through `gnuplot` into DIR/NAME.png.
absl::Status Gnuplot(const std::string& gnuplot, const std::string& dir, const std::string& name,
                     const std::string& body);

// --- the scale workload (scale.cc, scale_storms.cc) ---
// VmRSS of process `pid`, in bytes; 0 if it cannot be read.
uint64_t ResidentBytes(pid_t pid);
// A Client of this process acquiring and releasing one lock in a closed loop on a thread of its
// own, from Start to Stop: how long lockd keeps an unrelated request waiting beside the work
// being measured. Each acquire and each release is a sample.
class Probe {
 public:
  struct Sample {
    MonoTime start;  // when the request was made
    int64_t ns;      // how long it took
  };
  static absl::StatusOr<std::unique_ptr<Probe>> Start(const std::string& address,
                                                      const std::string& lock);
  ~Probe();
  // Stops the loop: every request's sample. Then failures() says how many failed.
  std::vector<Sample> Stop();
  size_t failures() const { return failures_; }
  const absl::Status& first_error() const { return first_error_; }
  // The times of the requests made in [from, to).
  static std::vector<int64_t> Between(const std::vector<Sample>& samples, MonoTime from,
                                      MonoTime to);

 private:
  Probe() = default;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<Sample> samples_;  // written by thread_ until it is joined
  size_t failures_ = 0;          // likewise
  absl::Status first_error_;     // likewise
};
// Held locks put into lockd by the raw driver: `locks` names `prefix` + 8 digits, in sessions
// of 1,000 locks (an hour's TTL), from 8 threads, 64 acquires in flight per connection; each
// acquire's lease TTL is `ttl(i)` for lock i when it is sent (refused under a second: the fill
// fell behind).
struct FillPlan {
  size_t locks = 0;
  std::string prefix;
  std::function<absl::Duration(size_t)> ttl;
};
// The fill's time, in seconds.
absl::StatusOr<double> FillLocks(const std::string& address, const FillPlan& plan);

// --- the run ---
// The run's settings: every flag, read and checked once (ReadSettings), before anything starts.
struct Settings {
  std::string binary;  // lockd
  double seconds, cycle_seconds;
  int rounds;
  double margin_seconds, arrival_seconds, arrival_rate;
  int margin_workers, load_clients;
  std::vector<size_t> counts;  // --sessions
  std::vector<int> clients;    // --cycle-clients
  std::vector<double> margins;
  std::vector<absl::Duration> margin_ttls;
  std::vector<int> scaling_workers;
  int scaling_payouts;
  bool want_redis, want_etcd;             // --peers
  std::vector<std::string> system_keys;  // every lock-cycle system
  std::vector<std::string> only;         // --systems: those measured (empty: all)
  std::string rail, worker, demo, out, gnuplot;
  absl::Duration heartbeat;  // the raw driver's period
  int library_sessions;
  std::string redis_binary, etcd_binary;
  double threshold_ms;  // ADR-006 6.5: lease x margin / 3
  bool run_heartbeat = true, run_cycles = true, run_margin = true, run_payout = true;  // --workloads
  std::vector<size_t> scale_held;   // --scale-held (empty: none of that dimension)
  std::vector<size_t> scale_names;  // --scale-names (likewise)
  std::vector<size_t> scale_waiters;   // --scale-waiters (likewise)
  std::vector<size_t> scale_expiries;  // --scale-expiries (likewise)
  std::vector<size_t> scale_sessions;  // --scale-sessions (likewise)
  std::vector<size_t> scale_standby;   // --scale-standby (likewise)
  double scale_seconds = 5;
  int scale_restarts = 1;  // --scale-restarts: of each --scale-names point
  bool scale_snapshot = true;  // --scale-snapshot: churn each such point until a snapshot
  uint64_t scale_wal_segment_bytes = 0;  // --scale-wal-segment-bytes (0: lockd's own)
  std::string root;     // where the servers' data goes, under $TMPDIR
};

// What the run found, as the workloads go: results.json so far, summary.md's tables, the
// plots' data, and whether any figure is not to be trusted.
struct Report {
  Json json = Json::object();
  std::string table, library_table, cycles_table, margin_table, scaling_table, scale_table,
      scale_names_table, scale_waiters_table, scale_expiries_table, scale_sessions_table,
      scale_standby_table;
  Json scale_points = Json::array();  // results.json's scale.held_locks
  Json scale_names = Json::array();   // results.json's scale.names
  std::vector<HeartbeatVariant> variants;
  std::vector<System> systems;
  std::vector<std::vector<Runs>> runs;  // [system][client count]
  std::vector<MarginPoint> points;
  std::string versions;  // of the peers
  bool broken = false;   // a refusal or error anywhere
};

// --- the workloads, in the order the run takes them ---
// heartbeat.cc: the raw driver's sessions at each --sessions, then the library's.
absl::Status RunHeartbeatWorkloads(const Settings& s, Report& report);
// cycles.cc: lockd and the peers at each --cycle-clients, in interleaved rounds.
absl::Status RunCycleWorkloads(const Settings& s, Report& report);
// margin_sweep.cc, with --rail and --worker.
void RunMarginSweepWorkload(const Settings& s, Report& report);
// payout_scaling.cc, with --demo.
void RunPayoutScaling(const Settings& s, Report& report);
// scale.cc: the cost at each size of the work (--scale-names, --scale-sessions,
// --scale-waiters, --scale-expiries, --scale-standby, --scale-held); the floors, for the
// waiters' hand-offs.
absl::Status RunScaleWorkloads(const Settings& s, const Percentiles& fsync,
                               const Percentiles& loopback, Report& report);
// scale_storms.cc: its waiters and its leases ending at one moment.
absl::Status RunWaiters(const Settings& s, const Percentiles& fsync, const Percentiles& loopback,
                        Report& report);
absl::Status RunExpiries(const Settings& s, Report& report);
// scale_sessions.cc: its sessions on one lockd.
absl::Status RunSessions(const Settings& s, Report& report);
// scale_standby.cc: a standby taking over held locks on etcd (with --etcd's binary).
absl::Status RunStandby(const Settings& s, Report& report);
// report.cc: prints the summary; with --out, writes results.json, summary.md and the plots.
void WriteReport(const Settings& s, const Percentiles& fsync, const Percentiles& loopback,
                 Report& report);

}  // namespace fencelock::bench

#endif  // FENCELOCK_BENCH_BENCH_H_
