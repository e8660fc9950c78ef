#include "payout-demo/cluster.h"

#include <filesystem>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "metrics/http_get.h"
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
  {
    auto init = c->Spawn(c->options_.lockd_binary, {"init", "--data-dir=" + c->Path("lockd")},
                         "logs/lockd.log");
    if (!init.ok()) return init.status();
    if (int status = *init->Wait(); status != 0) {
      return absl::InternalError(absl::StrCat("lockd init ", process::DescribeStatus(status),
                                              "; see ", c->Path("logs/lockd.log")));
    }
  }
  if (absl::Status s = c->StartLockd(); !s.ok()) return s;
  if (absl::Status s = c->StartRail(); !s.ok()) return s;
  auto store = PayoutStore::Open(c->Path("payouts.db"));
  if (!store.ok()) return store.status();
  c->store_ = std::move(*store);
  return c;
}

Cluster::~Cluster() {
  for (auto& [name, worker] : workers_) worker.Stop();
  lockd_.Stop();
  rail_.Stop();
}

absl::StatusOr<process::Child> Cluster::Spawn(const std::string& binary,
                                              const std::vector<std::string>& args,
                                              const std::string& log) const {
  return process::Child::Spawn(binary, args, {.stdout_file = Path(log), .stderr_file = Path(log)});
}

absl::Status Cluster::StartLockd() {
  std::filesystem::remove(Path("lockd.port"));
  std::filesystem::remove(Path("lockd.metrics-port"));
  std::vector<std::string> args = {
      "serve", "--data-dir=" + Path("lockd"), absl::StrCat("--port=", lockd_port_),
      "--port-file=" + Path("lockd.port"), "--metrics-port=0",
      "--metrics-port-file=" + Path("lockd.metrics-port")};
  if (const std::string& tls = options_.tls_dir; !tls.empty()) {
    args.insert(args.end(), {"--tls-ca=" + tls + "/ca.crt", "--tls-cert=" + tls + "/lockd.crt",
                             "--tls-key=" + tls + "/lockd.key"});
  }
  auto lockd = Spawn(options_.lockd_binary, args, "logs/lockd.log");
  if (!lockd.ok()) return lockd.status();
  lockd_ = std::move(*lockd);
  auto port = process::AwaitPortFile(Path("lockd.port"), lockd_, absl::Seconds(20));
  if (!port.ok()) return port.status();
  auto metrics_port = process::AwaitPortFile(Path("lockd.metrics-port"), lockd_, absl::Seconds(20));
  if (!metrics_port.ok()) return metrics_port.status();
  lockd_port_ = *port;
  lockd_metrics_port_ = *metrics_port;
  lockd_address_ = absl::StrCat("127.0.0.1:", lockd_port_);
  return absl::OkStatus();
}

absl::Status Cluster::StartRail() {
  std::vector<std::string> args = {
      "--db=" + Path("rail.db"), "--port=0", "--port-file=" + Path("rail.port"),
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
  return store_->Load(count, amount_cents).status();
}

absl::StatusOr<process::Child*> Cluster::StartWorker(const std::string& name,
                                                     const std::vector<std::string>& extra_args,
                                                     const std::string& lockd_address) {
  if (workers_.count(name) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("worker ", name, " was already started"));
  }
  std::vector<std::string> args = {
      "--name=" + name,
      "--lockd=" + (lockd_address.empty() ? lockd_address_ : lockd_address),
      "--rail=" + rail_address_,
      "--store=" + Path("payouts.db"),
      "--session-ttl=" + absl::FormatDuration(options_.session_ttl),
      "--lock-ttl=" + absl::FormatDuration(options_.lock_ttl),
      absl::StrCat("--margin=", options_.margin)};
  if (options_.history) args.push_back("--history=" + HistoryPath(name));
  if (const std::string& tls = options_.tls_dir; !tls.empty()) {
    args.insert(args.end(), {"--tls-ca=" + tls + "/ca.crt", "--tls-cert=" + tls + "/worker.crt",
                             "--tls-key=" + tls + "/worker.key"});
  }
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto child = process::Child::Spawn(options_.worker_binary, args,
                                     {.stdout_file = Path("logs/" + name + ".log"),
                                      .stderr_file = Path("logs/" + name + ".log"),
                                      .environment = options_.worker_environment});
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

absl::StatusOr<double> Cluster::LockdMetric(const std::string& name) const {
  return metrics::ScrapeSample("127.0.0.1", lockd_metrics_port_, name);
}

absl::StatusOr<Reconciliation> Cluster::Reconcile() {
  Reconciliation r;
  // lockd copies its counters into /metrics every 250 ms: wait one period so that a stale
  // request answered just before the last worker exited is in the figure.
  absl::SleepFor(absl::Milliseconds(300));
  auto fenced = LockdMetric("lock_fenced_out_total");
  if (!fenced.ok()) return fenced.status();
  r.lock_fenced_out = *fenced;
  lockd_.Stop();
  rail_.Stop();
  auto ledger = RailLedger::Open(Path("rail.db"));
  if (!ledger.ok()) return ledger.status();
  auto payments = (*ledger)->PaymentsPerPayout();
  if (!payments.ok()) return payments.status();
  auto stats = (*ledger)->Stats();
  if (!stats.ok()) return stats.status();
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
