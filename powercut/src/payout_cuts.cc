// The power-cut run of the payout demo's whole host (fencelock-powercut payout;
// docs/durability.md): lockd's state directory, the payout store and the rail's ledger on a
// file system that forgets what was never synced, the logs beside it.
//
// Each round loads more payouts, starts lockd and the rail on what the last cut left (after the
// first), and lets the workers pay for 0.2 to 3 s; then every process of the host is killed
// (SIGKILL: lockd, the rail and the workers) and the power cut, as in the lockd run: in half
// the rounds the power goes at a write drawn from the next 400, with that write in flight. A
// last round without a cut lets the workers finish. The checks:
//   - lockd and the rail start after every cut (a refusal fails the run);
//   - every token a worker was granted is above every token granted before the cut that
//     preceded it, and no token is granted twice (from the workers' logs, which are not on the
//     forgetful disk);
//   - the reconciliation of the rail's ledger against the store: every payout loaded is in the
//     store (each load was committed before its round began), every payout paid exactly once,
//     no SUBMIT for a payout already paid, and no request fenced out by lockd (its counter read
//     just before each cut, and at the end).
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "payout-demo/cluster.h"
#include "powered_mount.h"
#include "runs.h"

namespace fencelock::payout {
namespace {

using powercut::CutTally;
using powercut::PoweredMount;
using powercut::RunOptions;

class PayoutRun {
 public:
  explicit PayoutRun(const RunOptions& options)
      : options_(options), mount_(options.dir, options.forgetfs_binary), rng_(options.seed) {}

  int Main() {
    if (absl::Status s = Setup(); !s.ok()) return Fail(s);
    for (round_ = 1; round_ <= options_.cuts && violations_.empty(); ++round_) {
      if (absl::Status s = Round(); !s.ok()) return Fail(s);
    }
    if (violations_.empty()) {
      if (absl::Status s = Finish(); !s.ok()) return Fail(s);
    }
    std::printf("%d power cuts of the payout host (seed %lu): %ld payouts, %ld paid once, %ld "
                "paid twice, %ld left unpaid, %ld SUBMITs of a payout already paid, %.0f "
                "requests fenced out by lockd, %ld grants checked (highest token %lu), %ld "
                "abandoned payouts, %s; %zu violations\n",
                tally_.cuts, static_cast<unsigned long>(options_.seed),
                static_cast<long>(reconciled_.payouts), static_cast<long>(reconciled_.paid_once),
                static_cast<long>(reconciled_.paid_twice), static_cast<long>(reconciled_.left),
                static_cast<long>(reconciled_.rail_duplicates), fenced_out_,
                static_cast<long>(grants_), static_cast<unsigned long>(highest_token_),
                static_cast<long>(Abandoned()), tally_.Describe().c_str(), violations_.size());
    for (const std::string& v : violations_) std::printf("VIOLATION: %s\n", v.c_str());
    return violations_.empty() ? 0 : 1;
  }

 private:
  int Fail(const absl::Status& s) {
    std::printf("round %d (seed %lu): %s\n", round_, static_cast<unsigned long>(options_.seed),
                s.ToString().c_str());
    return 1;
  }
  void Violation(const std::string& what) {
    violations_.push_back(absl::StrCat("round ", round_, ": ", what));
  }
  int64_t Abandoned() const {
    int64_t n = 0;
    for (const auto& [reason, count] : reconciled_.abandoned) n += count;
    return n;
  }

  absl::Status Setup() {
    if (absl::Status s = mount_.Mount(); !s.ok()) return s;
    auto host = mount_.MakeDurableDirectory("host");
    if (!host.ok()) return host.status();
    std::filesystem::create_directories(options_.dir + "/run");
    auto cluster = Cluster::Start(
        {.dir = options_.dir + "/run",
         .data_dir = *host,
         .lockd_extra_args = {absl::StrCat("--wal-segment-bytes=", options_.wal_segment_bytes)},
         .lockd_binary = options_.lockd_binary,
         .rail_binary = options_.rail_binary,
         .worker_binary = options_.worker_binary,
         .rail_latency = absl::Milliseconds(5),
         .rail_jitter = absl::Milliseconds(5),
         .rail_seed = options_.seed});
    if (!cluster.ok()) return cluster.status();
    cluster_ = std::move(*cluster);
    return absl::OkStatus();
  }

  absl::Status StartWorkers(const std::string& prefix) {
    names_.clear();
    for (int i = 1; i <= options_.workers; ++i) {
      const std::string name = absl::StrCat(prefix, "-w", i);
      auto worker = cluster_->StartWorker(name);
      if (!worker.ok()) return worker.status();
      names_.push_back(name);
    }
    return absl::OkStatus();
  }

  // lockd and the rail on what the cut left: both must start.
  absl::Status Restart() {
    if (absl::Status s = cluster_->StartLockd(); !s.ok()) {
      Violation(absl::StrCat("lockd did not start after the cut: ", s.message(), ": ",
                             LastLine(cluster_->Path("logs/lockd.log"))));
      return absl::OkStatus();
    }
    if (absl::Status s = cluster_->StartRail(); !s.ok()) {
      Violation(absl::StrCat("the rail did not start after the cut: ", s.message(), ": ",
                             LastLine(cluster_->Path("logs/rail.log"))));
    }
    return absl::OkStatus();
  }

  static std::string LastLine(const std::string& path) {
    return powercut::LastLine(powercut::ReadFile(path));
  }

  // The tokens the workers of this round were granted ("<name> acquired payout/N token T"):
  // each above the floor, none granted twice.
  void CheckTokens() {
    uint64_t highest = highest_token_;
    for (const std::string& name : names_) {
      for (absl::string_view line :
           absl::StrSplit(powercut::ReadFile(cluster_->Path("logs/" + name + ".log")), '\n')) {
        std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
        uint64_t token = 0;
        if (f.size() < 5 || f[1] != "acquired" || f[3] != "token" ||
            !absl::SimpleAtoi(f[4], &token)) {
          continue;
        }
        ++grants_;
        if (token <= highest_token_) {
          Violation(absl::StrCat(name, " was granted ", f[2], " under token ", token,
                                 ", not above ", highest_token_,
                                 ", the highest granted before the cut"));
        }
        if (auto [it, fresh] = granted_.emplace(token, std::string(f[2])); !fresh) {
          Violation(absl::StrCat("token ", token, " was granted twice: for ", it->second,
                                 " and, to ", name, ", for ", f[2]));
        }
        highest = std::max(highest, token);
      }
    }
    highest_token_ = highest;
  }

  void ReadFencedOut() {
    if (auto fenced = cluster_->LockdMetric("lock_fenced_out_total"); fenced.ok()) {
      fenced_out_ += *fenced;
    }
  }

  absl::Status Round() {
    if (absl::Status s = cluster_->Load(options_.payouts_per_round, 1000); !s.ok()) return s;
    loaded_ += options_.payouts_per_round;
    cluster_->CloseStore();
    if (round_ > 1) {
      if (absl::Status s = Restart(); !s.ok() || !violations_.empty()) return s;
    }
    auto armed = mount_.MaybeArm(rng_);
    if (!armed.ok()) return armed.status();
    if (absl::Status s = StartWorkers(absl::StrCat("r", round_)); !s.ok()) return s;
    const bool frozen = mount_.RunUntil(
        absl::Milliseconds(200 + static_cast<int64_t>(rng_() % 2800)), *armed, absl::Milliseconds(10));
    // lockd copies its counters to /metrics every 250 ms: this misses at most the last period.
    if (!frozen) ReadFencedOut();
    // Every process of the host goes at once; the cut waits for their files to close.
    for (const std::string& name : names_) cluster_->worker(name)->Signal(SIGKILL);
    cluster_->lockd().Signal(SIGKILL);
    cluster_->rail().Signal(SIGKILL);
    const absl::Status cut = mount_.Cut(rng_, frozen, tally_);
    for (const std::string& name : names_) cluster_->worker(name)->Wait();
    cluster_->lockd().Wait();
    cluster_->rail().Wait();
    CheckTokens();
    return cut;
  }

  // No more cuts: the workers pay what is left, and the ledger is reconciled with the store.
  absl::Status Finish() {
    if (absl::Status s = Restart(); !s.ok() || !violations_.empty()) return s;
    if (absl::Status s = StartWorkers("last"); !s.ok()) return s;
    for (const std::string& name : names_) {
      const std::optional<int> status = cluster_->worker(name)->Wait(absl::Seconds(120));
      if (!status.has_value()) {
        return absl::DeadlineExceededError(absl::StrCat(
            name, " did not finish the payouts left within 120 s; see ",
            cluster_->Path("logs/" + name + ".log")));
      }
      if (*status != 0) {
        Violation(absl::StrCat(name, " ", process::DescribeStatus(*status), ": ",
                               LastLine(cluster_->Path("logs/" + name + ".log"))));
      }
    }
    CheckTokens();
    auto reconciled = cluster_->Reconcile();  // reads lockd's counter, then stops it and the rail
    if (!reconciled.ok()) return reconciled.status();
    reconciled_ = *reconciled;
    fenced_out_ += std::max(reconciled_.lock_fenced_out, 0.0);
    if (reconciled_.payouts != loaded_) {
      Violation(absl::StrCat("the store holds ", reconciled_.payouts, " payouts, but ", loaded_,
                             " were loaded, each load committed before the round began"));
    }
    if (reconciled_.paid_twice > 0 || reconciled_.left > 0 ||
        reconciled_.paid_once != reconciled_.payouts) {
      Violation(absl::StrCat("the reconciliation: of ", reconciled_.payouts, " payouts ",
                             reconciled_.paid_once, " were paid once, ", reconciled_.paid_twice,
                             " twice, and ", reconciled_.left, " are left"));
    }
    if (reconciled_.rail_duplicates > 0) {
      Violation(absl::StrCat("the rail saw ", reconciled_.rail_duplicates,
                             " SUBMITs of a payout it had paid"));
    }
    if (fenced_out_ > 0) {
      Violation(absl::StrCat("lockd fenced out ", fenced_out_, " requests"));
    }
    return absl::OkStatus();
  }

  const RunOptions options_;
  PoweredMount mount_;
  std::mt19937_64 rng_;
  std::unique_ptr<Cluster> cluster_;
  std::vector<std::string> names_;  // this round's workers
  int round_ = 0;
  std::map<uint64_t, std::string> granted_;  // token → the payout it was granted for
  uint64_t highest_token_ = 0;
  int64_t grants_ = 0;
  int64_t loaded_ = 0;  // payouts whose load the store acknowledged
  double fenced_out_ = 0;
  Reconciliation reconciled_;
  CutTally tally_;
  std::vector<std::string> violations_;
};

}  // namespace
}  // namespace fencelock::payout

namespace fencelock::powercut {

int RunPayoutCuts(const RunOptions& options) { return payout::PayoutRun(options).Main(); }

}  // namespace fencelock::powercut
