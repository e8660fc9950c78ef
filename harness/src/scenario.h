// The harness's scenarios (docs/harness.md): each starts lockd, the rail and workers as
// processes in a fresh directory, injects one kind of fault, and judges the run by the
// reconciliation, the must-be-zero counters and the history checker.
#ifndef FENCELOCK_HARNESS_SCENARIO_H_
#define FENCELOCK_HARNESS_SCENARIO_H_

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "harness/checker.h"

namespace fencelock::harness {

struct Binaries {
  std::string lockd, rail, worker;
  std::string etcd = "/usr/bin/etcd";  // the replicated scenarios' etcd members
};

// What one run is given.
struct Env {
  std::string dir;  // fresh and empty; everything of the run goes here
  uint64_t seed = 1;
  bool quick = false;  // the short variant CTest runs
  Binaries binaries;
  // Certificates for TLS between the workers and lockd (ClusterOptions::tls_dir); empty:
  // plaintext loopback.
  std::string tls_dir;
  // Certificates made by scripts/make-certs.sh DIR etcd lockd: the replicated scenarios' etcd
  // members then require client certificates, and lockd and etcdctl present lockd's. Empty:
  // plaintext to etcd.
  std::string etcd_tls_dir;
  // ha-etcd-elections: the owner TTL of the replicas (zero: 2 s) and how many times the etcd
  // leader is killed (zero: 3 with quick, else 10).
  absl::Duration etcd_owner_ttl = absl::ZeroDuration();
  int elections = 0;
  std::mt19937_64 rng;
  // A value in [lo, hi] from the run's seed.
  int64_t Uniform(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  }
};

// What one run found.
struct Outcome {
  std::string scenario;
  uint64_t seed = 0;
  std::string dir;
  absl::Duration wall;
  std::vector<std::string> failures;  // empty: passed
  std::vector<std::pair<std::string, std::string>> figures;  // in the order measured
  CheckResult check;
  bool passed() const { return failures.empty(); }
  void Figure(std::string name, std::string value) {
    figures.emplace_back(std::move(name), std::move(value));
  }
  void Expect(bool holds, std::string failure) {
    if (!holds) failures.push_back(std::move(failure));
  }
};

struct Scenario {
  std::string name;
  std::string proves;  // one line, for `list` and the report
  std::function<absl::Status(Env&, Outcome&)> run;
  // lockd's state in a local etcd cluster with three lockd replicas (issue 16): `run ha` and
  // `soak --ha` choose these, `run all` and `soak` the others.
  bool replicated = false;
};

const std::vector<Scenario>& Scenarios();
const Scenario* FindScenario(const std::string& name);

// Runs `scenario` in env.dir and fills an outcome; an error while running is a failure.
Outcome RunScenario(const Scenario& scenario, Env& env);

}  // namespace fencelock::harness

#endif  // FENCELOCK_HARNESS_SCENARIO_H_
