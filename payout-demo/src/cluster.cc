#include "payout-demo/cluster.h"

#include <filesystem>
#include <limits>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "clock/clock.h"
#include "metrics/http_get.h"
#include "process/history.h"
#include "payout-demo/rail.h"

namespace fencelock::payout {

std::vector<std::string> LineTail::Poll() {
  std::vector<std::string> lines;
  if (!in_.is_open()) {
    in_.open(path_);
    if (!in_.is_open()) return lines;
  }
  in_.clear();  // past the last EOF: the writer may have written more since
  std::string line;
  while (std::getline(in_, line)) {
    if (in_.eof()) {  // no newline yet: read it whole next time
      partial_ += line;
      break;
    }
    lines.push_back(partial_ + line);
    partial_.clear();
  }
  return lines;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(ClusterOptions options) {
  std::unique_ptr<Cluster> c(new Cluster(std::move(options)));
  std::error_code ec;
  std::filesystem::create_directories(c->Path("logs"), ec);
  if (c->options_.history) std::filesystem::create_directories(c->Path("history"), ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", c->Path("logs"), ": ", ec.message()));
  if (const std::string& tls = c->options_.tls_dir; !tls.empty()) {
    auto context = net::TlsContext::Create(
        {.ca_file = tls + "/ca.crt", .cert_file = tls + "/worker.crt", .key_file = tls + "/worker.key"},
        net::TlsRole::kClient, "worker ");
    if (!context.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the TLS directory ", tls, " (scripts/make-certs.sh DIR lockd worker): ",
          context.status().message()));
    }
    c->lockd_tls_ = std::move(*context);
  }
  if (c->options_.etcd_members > 0) {
    if (absl::Status s = c->StartEtcd(); !s.ok()) return s;
  } else {
    c->replicas_.push_back(Replica{.name = "lockd"});
    std::vector<std::string> init_args = {"init", "--data-dir=" + c->DataPath("lockd")};
    init_args.insert(init_args.end(), c->options_.lockd_extra_args.begin(),
                     c->options_.lockd_extra_args.end());
    auto init = c->Spawn(c->options_.lockd_binary, init_args, "logs/lockd.log");
    if (!init.ok()) return init.status();
    if (int status = *init->Wait(); status != 0) {
      return absl::InternalError(absl::StrCat("lockd init ", process::DescribeStatus(status),
                                              "; see ", c->Path("logs/lockd.log")));
    }
    if (absl::Status s = c->StartLockd(); !s.ok()) return s;
    c->lockd_address_ = absl::StrCat("127.0.0.1:", c->replicas_[0].port);
  }
  if (absl::Status s = c->StartRail(); !s.ok()) return s;
  if (absl::Status s = c->OpenStore(); !s.ok()) return s;
  return c;
}

absl::Status Cluster::OpenStore() {
  if (store_ != nullptr) return absl::OkStatus();
  auto store = PayoutStore::Open(DataPath("payouts.db"));
  if (!store.ok()) return store.status();
  store_ = std::move(*store);
  return absl::OkStatus();
}

absl::Status Cluster::StartEtcd() {
  const int n = options_.lockd_replicas;
  if (n < 1 || n > 26) {
    return absl::InvalidArgumentError(absl::StrCat("1 to 26 lockd replicas, not ", n));
  }
  auto etcd = EtcdCluster::Start({.dir = options_.dir,
                                  .etcd_binary = options_.etcd_binary,
                                  .members = options_.etcd_members,
                                  .tls_dir = options_.etcd_tls_dir,
                                  .extra_args = options_.etcd_extra_args});
  if (!etcd.ok()) return etcd.status();
  etcd_ = std::move(*etcd);
  etcd_prefix_ = "/fencelock/payouts";
  std::vector<std::string> init_args = {"init", "--etcd=" + etcd_->endpoints(),
                                        "--etcd-prefix=" + etcd_prefix_};
  for (std::string& flag : etcd_->LockdFlags()) init_args.push_back(std::move(flag));
  auto init = Spawn(options_.lockd_binary, init_args, "logs/lockd-init.log");
  if (!init.ok()) return init.status();
  if (int status = *init->Wait(); status != 0) {
    return absl::InternalError(absl::StrCat("lockd init --etcd ", process::DescribeStatus(status),
                                            "; see ", Path("logs/lockd-init.log")));
  }
  std::vector<std::string> addresses;
  for (int i = 0; i < n; ++i) {
    auto port = process::FreeLoopbackPort();
    if (!port.ok()) return port.status();
    replicas_.push_back(Replica{.name = absl::StrCat("lockd-", std::string(1, 'a' + i)),
                                .port = *port});
    addresses.push_back(absl::StrCat("127.0.0.1:", *port));
  }
  lockd_address_ = absl::StrJoin(addresses, ",");
  // lockd-a takes the prefix; the others stand by behind it.
  for (int i = 0; i < n; ++i) {
    if (absl::Status s = StartLockd(i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

Cluster::~Cluster() {
  for (auto& [name, worker] : workers_) worker.Stop();
  // Before etcd: a lockd that stops cleanly gives its lease on the prefix back.
  for (Replica& r : replicas_) r.child.Stop();
  rail_.Stop();
  etcd_.reset();
}

absl::StatusOr<process::Child> Cluster::Spawn(const std::string& binary,
                                              const std::vector<std::string>& args,
                                              const std::string& log) const {
  return process::Child::Spawn(binary, args, {.stdout_file = Path(log), .stderr_file = Path(log)});
}

std::vector<std::string> Cluster::ServeArgs(int i, bool standby) {
  const Replica& r = replicas_[i];
  std::vector<std::string> args = {"serve", absl::StrCat("--port=", r.port),
                                   "--port-file=" + Path(r.name + ".port"), "--metrics-port=0",
                                   "--metrics-port-file=" + Path(r.name + ".metrics-port")};
  if (replicated()) {
    args.insert(args.end(), {"--etcd-prefix=" + etcd_prefix_,
                             "--etcd-owner-ttl=" + absl::FormatDuration(options_.etcd_owner_ttl)});
    if (standby) args.push_back("--etcd-standby");
    if (options_.history) {
      args.insert(args.end(), {"--history=" + HistoryPath(r.name), "--history-name=" + r.name});
    }
  } else {
    args.push_back("--data-dir=" + DataPath("lockd"));
    args.insert(args.end(), options_.lockd_extra_args.begin(), options_.lockd_extra_args.end());
  }
  if (const std::string& tls = options_.tls_dir; !tls.empty()) {
    args.insert(args.end(), {"--tls-ca=" + tls + "/ca.crt", "--tls-cert=" + tls + "/lockd.crt",
                             "--tls-key=" + tls + "/lockd.key"});
  }
  return args;
}

absl::Status Cluster::StartLockd(int i) {
  Replica& r = replicas_[i];
  if (r.child.running() && !r.child.Wait(absl::ZeroDuration()).has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(r.name, " is still running"));
  }
  std::filesystem::remove(Path(r.name + ".port"));
  std::filesystem::remove(Path(r.name + ".metrics-port"));
  // Replicated, every replica but the first one's first start stands by: it serves once the
  // prefix is free.
  const bool standby = replicated() && (i != 0 || servings_ > 0);
  std::vector<std::string> args = ServeArgs(i, standby);
  if (replicated()) {
    std::string endpoints = etcd_->endpoints();
    if (options_.etcd_route) {
      auto routed = options_.etcd_route(i, *etcd_);
      if (!routed.ok()) return routed.status();
      endpoints = *routed;
    }
    args.push_back("--etcd=" + endpoints);
    for (std::string& flag : etcd_->LockdFlags()) args.push_back(std::move(flag));
  }
  const std::string log = Path("logs/" + r.name + ".log");
  // What this start says, past what earlier starts of the replica wrote to its log.
  LineTail said(log);
  (void)said.Poll();
  auto lockd = process::Child::Spawn(
      options_.lockd_binary, args,
      {.stdout_file = log,
       .stderr_file = log,
       .environment = options_.lockd_environment ? options_.lockd_environment(i)
                                                 : std::vector<std::string>{}});
  if (!lockd.ok()) return lockd.status();
  r.child = std::move(*lockd);
  r.serving_since = 0;
  if (standby) {
    // Up once it says it stands by (or serves already, if the prefix was free).
    const MonoTime give_up = Clock::Real()->Now() + absl::Seconds(30);
    for (bool up = false; !up;) {
      for (const std::string& line : said.Poll()) up = up || absl::StrContains(line, "standing by");
      up = up || std::filesystem::exists(Path(r.name + ".port"));
      if (up) break;
      if (r.child.Wait(absl::ZeroDuration()).has_value()) {
        return absl::InternalError(absl::StrCat(r.name, " ", process::DescribeStatus(*r.child.status()),
                                                "; see ", Path("logs/" + r.name + ".log")));
      }
      if (Clock::Real()->Now() > give_up) {
        return absl::DeadlineExceededError(absl::StrCat(r.name, " did not stand by within 30 s; see ",
                                                        Path("logs/" + r.name + ".log")));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::OkStatus();
  }
  auto port = process::AwaitPortFile(Path(r.name + ".port"), r.child, absl::Seconds(30));
  if (!port.ok()) return port.status();
  auto metrics_port = process::AwaitPortFile(Path(r.name + ".metrics-port"), r.child, absl::Seconds(5));
  if (!metrics_port.ok()) return metrics_port.status();
  r.port = *port;
  r.metrics_port = *metrics_port;
  r.serving_since = ++servings_;
  return absl::OkStatus();
}

int Cluster::ServingReplica() {
  int serving = -1;
  for (int i = 0; i < replica_count(); ++i) {
    Replica& r = replicas_[i];
    if (!r.child.running() || r.child.Wait(absl::ZeroDuration()).has_value()) continue;
    // lockd writes its port files once it serves, and removes them when it is deposed and
    // stands by again.
    if (!std::filesystem::exists(Path(r.name + ".port"))) {
      r.serving_since = 0;
      continue;
    }
    if (r.serving_since == 0) {
      std::ifstream metrics(Path(r.name + ".metrics-port"));
      if (!(metrics >> r.metrics_port)) continue;
      r.serving_since = ++servings_;
    }
    if (serving < 0 || r.serving_since > replicas_[serving].serving_since) serving = i;
  }
  return serving;
}

absl::StatusOr<int> Cluster::AwaitServingReplica(int not_this, absl::Duration timeout) {
  const MonoTime give_up = Clock::Real()->Now() + timeout;
  for (;;) {
    const int serving = ServingReplica();
    if (serving >= 0 && serving != not_this) return serving;
    if (Clock::Real()->Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no other lockd replica served within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

absl::Status Cluster::StartRail() {
  if (rail_.running() && !rail_.Wait(absl::ZeroDuration()).has_value()) {
    return absl::FailedPreconditionError("the rail is still running");
  }
  std::filesystem::remove(Path("rail.port"));
  std::vector<std::string> args = {
      "--db=" + DataPath("rail.db"), "--port=0", "--port-file=" + Path("rail.port"),
      "--latency=" + absl::FormatDuration(options_.rail_latency),
      "--jitter=" + absl::FormatDuration(options_.rail_jitter),
      "--read-timeout=" + absl::FormatDuration(options_.rail_read_timeout),
      absl::StrCat("--seed=", options_.rail_seed)};
  if (options_.history) args.push_back("--history=" + HistoryPath("rail"));
  auto rail = Spawn(options_.rail_binary, args, "logs/rail.log");
  if (!rail.ok()) return rail.status();
  rail_ = std::move(*rail);
  auto port = process::AwaitPortFile(Path("rail.port"), rail_, absl::Seconds(20));
  if (!port.ok()) return port.status();
  rail_address_ = absl::StrCat("127.0.0.1:", *port);
  return absl::OkStatus();
}

absl::Status Cluster::Load(int64_t count, int64_t amount_cents) {
  if (absl::Status s = OpenStore(); !s.ok()) return s;
  return store_->Load(count, amount_cents).status();
}

namespace {

// Whether `dir` holds the fencelock module (fencelock.cpython-*.so).
bool HasPythonModule(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind("fencelock.", 0) == 0) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<process::Child*> Cluster::StartWorker(const std::string& name,
                                                     const std::vector<std::string>& extra_args,
                                                     const std::string& lockd_address,
                                                     bool python) {
  if (python && options_.python.empty()) {
    return absl::FailedPreconditionError(
        "no Python worker in this build (the fencelock module is built in plain trees only)");
  }
  if (python && options_.history) {
    return absl::InvalidArgumentError(
        "the Python worker keeps no event history, which this run checks");
  }
  if (python && !HasPythonModule(options_.python_module_dir)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the fencelock Python module is not built in ", options_.python_module_dir,
        ": cmake --build build --target fencelock_python"));
  }
  if (workers_.count(name) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("worker ", name, " was already started"));
  }
  std::vector<std::string> args = {
      "--name=" + name,
      "--lockd=" + (lockd_address.empty() ? lockd_address_ : lockd_address),
      "--rail=" + rail_address_,
      "--store=" + DataPath("payouts.db"),
      "--session-ttl=" + absl::FormatDuration(options_.session_ttl),
      "--lock-ttl=" + absl::FormatDuration(options_.lock_ttl),
      absl::StrCat("--margin=", options_.margin)};
  if (options_.history) args.push_back("--history=" + HistoryPath(name));
  std::string binary = options_.worker_binary;
  std::vector<std::string> environment = options_.worker_environment;
  if (python) {
    binary = options_.python;
    args.insert(args.begin(), options_.python_worker);
    environment.push_back("PYTHONPATH=" + options_.python_module_dir);
  }
  if (const std::string& tls = options_.tls_dir; !tls.empty()) {
    args.insert(args.end(), {"--tls-ca=" + tls + "/ca.crt", "--tls-cert=" + tls + "/worker.crt",
                             "--tls-key=" + tls + "/worker.key"});
  }
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto child = process::Child::Spawn(binary, args,
                                     {.stdout_file = Path("logs/" + name + ".log"),
                                      .stderr_file = Path("logs/" + name + ".log"),
                                      .environment = environment});
  if (!child.ok()) return child.status();
  return &(workers_[name] = std::move(*child));
}

process::Child* Cluster::worker(const std::string& name) {
  auto it = workers_.find(name);
  return it == workers_.end() ? nullptr : &it->second;
}

std::vector<std::string> Cluster::worker_names() const {
  std::vector<std::string> names;
  for (const auto& [name, worker] : workers_) names.push_back(name);
  return names;
}

absl::StatusOr<double> Cluster::LockdMetric(const std::string& name) {
  const int serving = ServingReplica();
  if (serving < 0) return absl::UnavailableError("no lockd replica serves");
  return metrics::ScrapeSample("127.0.0.1", replicas_[serving].metrics_port, name);
}

absl::StatusOr<Reconciliation> Cluster::Reconcile() {
  Reconciliation r;
  if (replicated() && options_.history) {
    // Every replica that served counted its own; a killed one's /metrics is gone, its history
    // is not.
    r.lock_fenced_out = 0;
    for (const Replica& replica : replicas_) {
      if (!std::filesystem::exists(HistoryPath(replica.name))) continue;
      auto records = history::ReadFile(HistoryPath(replica.name));
      if (!records.ok()) return records.status();
      for (const history::Record& rec : *records) {
        if (rec.event == "lockd-fenced-out") ++r.lock_fenced_out;
      }
    }
  } else {
    // lockd copies its counters into /metrics every 250 ms: wait one period so that a stale
    // request answered just before the last worker exited is in the figure.
    absl::SleepFor(absl::Milliseconds(300));
    auto fenced = LockdMetric("lock_fenced_out_total");
    if (!fenced.ok()) return fenced.status();
    r.lock_fenced_out = *fenced;
  }
  for (Replica& replica : replicas_) replica.child.Stop();
  rail_.Stop();
  auto ledger = RailLedger::Open(DataPath("rail.db"));
  if (!ledger.ok()) return ledger.status();
  auto payments = (*ledger)->PaymentsPerPayout();
  if (!payments.ok()) return payments.status();
  auto stats = (*ledger)->Stats();
  if (!stats.ok()) return stats.status();
  if (absl::Status s = OpenStore(); !s.ok()) return s;
  auto summary = store_->Summary();
  if (!summary.ok()) return summary.status();
  r.payouts = summary->total;
  r.claims = summary->claims;
  r.abandoned = summary->abandoned;
  r.rail_duplicates = stats->duplicate_attempted;
  r.rail_fenced_out = stats->fenced_out;
  r.status_queries = stats->status_queries;
  auto unpaid = store_->Unpaid(std::numeric_limits<int64_t>::max());
  if (!unpaid.ok()) return unpaid.status();
  const std::set<int64_t> unpaid_ids(unpaid->begin(), unpaid->end());
  for (int64_t id = 1; id <= summary->total; ++id) {
    const auto it = payments->find(PayoutKey(id));
    const int64_t times = it == payments->end() ? 0 : it->second;
    if (times >= 2) ++r.paid_twice;
    if (times == 0 || unpaid_ids.count(id) > 0) ++r.left;
    if (times == 1 && unpaid_ids.count(id) == 0) ++r.paid_once;
  }
  return r;
}

}  // namespace fencelock::payout
