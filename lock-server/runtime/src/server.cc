// The wiring of lockd: the parts, each in its own file, put together on one Asio event loop.
//
//   Listener (listener.cc)          binds, admits peers, makes AsioConnections
//   AsioConnection (asio_connection.cc)  one connection's framing and writes
//   ServerCore (server_core.cc)     dispatch, reply gate, expiry and stall timing
//   CommitLog (local_commit_log.cc, etcd_commit_log.cc)  where records become committed
//   Leadership (leadership.h, etcd_commit_log.cc)  whether this lockd serves, and until when
//   StandbyFront (standby_front.cc) NOT_LEADER on the listeners while a standby waits
//   MetricsExport (metrics_export.cc)    figures into Prometheus
//
// Time reaches all of them through one AsioTimeSource over the configured Clock.
#include "lock-server/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lock-server/etcd_commit_log.h"
#include "lock-server/local_commit_log.h"
#include "lock-server/server_core.h"
#include "lock-server/storage.h"
#include "listener.h"
#include "standby_front.h"
#include "metrics/exposer.h"
#include "metrics/metrics.h"
#include "metrics_export.h"
#include "net/asio.h"
#include "net/asio_time_source.h"
#include "process/history.h"

namespace fencelock::server {
namespace {

// A permissions file is a few lines per identity; a huge one is a mistake, refused before it
// is read into memory.
constexpr uint64_t kMaxPermissionsBytes = uint64_t{16} << 20;

absl::StatusOr<Permissions> LoadPermissions(Env* env, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      // /dev/zero would be read forever, a FIFO would block the reload until someone writes.
      return absl::InvalidArgumentError(
          absl::StrCat("the permissions file ", path, " is not a regular file"));
    }
    if (static_cast<uint64_t>(st.st_size) > kMaxPermissionsBytes) {
      return absl::InvalidArgumentError(absl::StrCat("the permissions file ", path, " is ",
                                                     st.st_size, " bytes; at most ",
                                                     kMaxPermissionsBytes, " are read"));
    }
  }
  auto text = env->ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the permissions file: ",
                                                   text.status().message()));
  }
  return Permissions::Parse(*text, path);
}

// ADR 0004: without a permissions file the operator of pools is the uid that owns lockd's
// state: its data directory's owner, or on etcd (no directory here) lockd's own.
std::string StateOwner(const ServerOptions& options) {
  struct stat st {};
  if (!options.storage.data_dir.empty() && ::stat(options.storage.data_dir.c_str(), &st) == 0) {
    return absl::StrCat("uid:", st.st_uid);
  }
  return absl::StrCat("uid:", ::geteuid());
}

std::string Describe(const Permissions& p) {
  return absl::StrCat("permissions from ", p.source(), ": ", p.rule_count(),
                      p.rule_count() == 1 ? " rule" : " rules");
}

class ServerImpl final : public Server {
 public:
  ServerImpl(const ServerOptions& options, std::shared_ptr<net::ReloadingTlsContext> tls)
      : options_(options), tls_(std::move(tls)), time_(io_, options.clock) {}

  ~ServerImpl() override {
    // The listener's connections and the exporter refer to the core; the core's log posts into
    // io_, which is destroyed last.
    listener_.reset();
    exporter_.reset();
    core_.reset();
  }

  // Restores the state (before anything listens: a directory we cannot trust is never served
  // from), then binds the listeners and the metrics endpoint.
  absl::Status Init();
  uint16_t tcp_port() const override { return listener_->tcp_port(); }
  int metrics_port() const override { return exposer_ ? exposer_->port() : 0; }
  std::vector<std::string> recovery_summary() const override { return summary_; }
  // A line for the startup log, before recovery's.
  void Note(std::string line) { summary_.push_back(std::move(line)); }
  absl::Status Run() override;
  void Shutdown() override {
    asio::post(io_, [this] { Stop(); });
  }
  absl::StatusOr<std::string> ReloadPermissions() override {
    if (options_.permissions_file.empty()) {
      return absl::FailedPreconditionError("no permissions file to reload (--permissions)");
    }
    auto loaded = LoadPermissions(options_.storage.env, options_.permissions_file);
    if (!loaded.ok()) return loaded.status();
    const std::string line = Describe(*loaded);
    asio::post(io_, [this, p = std::move(*loaded)]() mutable { core_->SetPermissions(std::move(p)); });
    return line;
  }

  absl::StatusOr<std::string> ReloadTls() override {
    if (tls_ == nullptr) return absl::FailedPreconditionError("lockd serves no TLS (--tls-*)");
    absl::StatusOr<std::string> loaded = tls_->Reload();
    if (!loaded.ok()) return loaded.status();
    // A listener made later (after a standby's takeover) asks tls_ for the context itself.
    asio::post(io_, [this, fresh = tls_->Current()]() mutable {
      if (listener_ != nullptr) listener_->SetTls(std::move(fresh));
    });
    return absl::StrCat("TLS: now ", *loaded, " for new connections");
  }

 private:
  absl::StatusOr<OpenedCommitLog> OpenCommitLog();
  void Stop();
  // The log cannot come back from `fault`: refuse nothing more than was refused, close the
  // listeners and connections (a moment later, so that the refusals reach their clients), and
  // make Run() return the fault.
  void EndService(const absl::Status& fault);
  void History(int64_t begin_ns, const char* event, const std::string& key, uint64_t token,
               const std::string& detail) {
    if (history_) history_->Append(begin_ns, event, key, token, detail);
  }

  const ServerOptions options_;
  // The certificates, reloaded by ReloadTls(); nullptr: plaintext TCP.
  const std::shared_ptr<net::ReloadingTlsContext> tls_;
  asio::io_context io_{1};
  AsioTimeSource time_;
  // Before the core: the log's writer reports sync times into it until the log is destroyed.
  std::shared_ptr<metrics::Registry> metrics_ = std::make_shared<metrics::Registry>();
  std::unique_ptr<ServerCore> core_;
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<MetricsExport> exporter_;
  std::unique_ptr<metrics::Exposer> exposer_;
  metrics::Gauge* serving_ = nullptr;  // lockd_serving, in metrics_
  std::vector<std::string> summary_;
  bool stopping_ = false;
  absl::Status ended_;  // why the service ended by itself; OK after Shutdown()
  asio::steady_timer end_timer_{io_};
  asio::steady_timer stop_timer_{io_};  // PoolStop: the stop, just after the reply
  std::unique_ptr<history::Writer> history_;  // null without options_.history_file
  // options_ with the TCP port a standby bound (the same port serves after the takeover).
  ServerOptions listen_options_;
  // --etcd-standby: answers NOT_LEADER on lockd's listeners while OpenCommitLog() waits for
  // the prefix; gone once it is ours.
  std::unique_ptr<StandbyFront> standby_;
  // The host's admission lock, once this lockd coordinates pools (ADR 0005). Taken by Init or
  // on the core's thread, before the first publish; let go of when the process exits.
  std::unique_ptr<FileLock> admission_lock_;

  // Takes the host's admission lock if this lockd does not hold it yet, and returns a line
  // saying so ("" if it held it); kFailedPrecondition naming the holder if another process
  // does.
  absl::StatusOr<std::string> HoldAdmissionNamespace() {
    if (admission_lock_ != nullptr) return std::string();
    char host[256] = "?";
    ::gethostname(host, sizeof(host) - 1);
    const std::string state = options_.storage.data_dir.empty()
                                  ? absl::StrCat("etcd prefix ", options_.storage.etcd_prefix)
                                  : absl::StrCat("state ", options_.storage.data_dir);
    auto held = LockHostFile(
        options_.admission_lock,
        absl::StrCat("lockd pid ", ::getpid(), " on host ", host, ", ", state),
        "one host has one admission namespace, and that lockd coordinates its pools (ADR 0005; "
        "--admission-lock names the lock)");
    if (!held.ok()) return held.status();
    admission_lock_ = std::move(*held);
    return absl::StrCat("coordinating admission pools: holding ", options_.admission_lock,
                        " (ADR 0005)");
  }
};

// How long an etcd leader election takes with etcd's default --election-timeout (1 s) and
// heartbeat (100 ms), measured: lockd's renewals failed for 1.7 to 2.4 s around each election
// (issue 37).
constexpr absl::Duration kEtcdElectionTime = absl::Milliseconds(2500);

// ServerOptions::etcd_request_timeout when left at zero: a third of the usable ownership, so
// that one member that swallows requests costs at most that before the next is tried.
absl::Duration EtcdRequestTimeout(const ServerOptions& o) {
  if (o.storage.etcd_request_timeout > absl::ZeroDuration()) return o.storage.etcd_request_timeout;
  return std::min(absl::Seconds(5), o.storage.etcd_owner_ttl * (1 - kEtcdOwnerMargin) / 3);
}

// The one place a storage backend is chosen.
absl::StatusOr<OpenedCommitLog> ServerImpl::OpenCommitLog() {
  metrics::Histogram& sync_latency = metrics_->GetHistogram(
      "lockd_log_sync_seconds", "Duration of one WAL batch write + fdatasync",
      metrics::LatencyBuckets());
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  const std::string owner =
      options_.listen.tcp ? absl::StrCat("lockd pid ", ::getpid(), " on host ", host, " (tcp ",
                                  options_.listen.tcp_host, ":", listen_options_.listen.tcp_port, ")")
                   : absl::StrCat("lockd pid ", ::getpid(), " on host ", host, " (unix socket only)");
  if (!options_.storage.etcd_endpoints.empty()) {
    metrics::Histogram& commit_latency = metrics_->GetHistogram(
        "lockd_etcd_commit_seconds", "Duration of one etcd transaction of the commit log",
        metrics::LatencyBuckets());
    EtcdCommitLogOptions etcd{.endpoints = options_.storage.etcd_endpoints,
                              .access = options_.storage.etcd_access,
                              .prefix = options_.storage.etcd_prefix,
                              .reservation_block = options_.storage.reservation_block,
                              .request_timeout = EtcdRequestTimeout(options_),
                              .owner_ttl = options_.storage.etcd_owner_ttl,
                              .owner_margin = kEtcdOwnerMargin,
                              .owner_wait = options_.storage.etcd_standby
                                                ? absl::InfiniteDuration()
                                                : options_.storage.etcd_owner_ttl + absl::Seconds(2),
                              .campaign_hold_off = options_.storage.etcd_campaign_hold_off,
                              .snapshot_min_bytes = options_.storage.etcd_snapshot_bytes,
                              .owner = owner};
    etcd.on_commit = [&commit_latency](int64_t ns) { commit_latency.Observe(ns / 1e9); };
    if (standby_) {
      etcd.on_standby = [front = standby_.get()](const std::string& owner) {
        front->SetOwner(owner);
      };
    }
    etcd.on_owned = [this](MonoTime sent, MonoTime until) {
      History(sent.nanos(), "lockd-owned", "-", 0, absl::StrCat(until.nanos()));
    };
    // The log works on lockd's event loop from the start: run it until the prefix is ours and
    // restored (a standby: as long as it waits), before anything else is on it.
    std::optional<absl::StatusOr<OpenedCommitLog>> opened;
    auto work = asio::make_work_guard(io_);
    auto opening = OpenEtcdCommitLog(etcd, &time_, [&](absl::StatusOr<OpenedCommitLog> o) {
      opened = std::move(o);
    });
    while (!opened.has_value()) io_.run_one();
    return std::move(*opened);
  }
  LocalCommitLogOptions log_options{
      .env = options_.storage.env,
      .dir = options_.storage.data_dir,
      .segment_bytes = options_.storage.wal_segment_bytes,
      .reservation_block = options_.storage.reservation_block,
      .owner = owner};
  log_options.on_sync = [&sync_latency](int64_t ns) { sync_latency.Observe(ns / 1e9); };
  log_options.now = [this] { return time_.Now(); };
  log_options.time = &time_;
  return OpenLocalCommitLog(log_options, time_.Now(),
                            [this](std::function<void()> f) { asio::post(io_, std::move(f)); });
}

// The longest etcd leader election the ownership rides out whenever it starts: a renewal fails
// from the election's start, and the deadline of the last one answered is TTL x (1 - margin)
// after its send, which came up to a third of the TTL before.
absl::Duration ElectionTolerance(absl::Duration ttl) {
  return ttl * (1 - kEtcdOwnerMargin) - ttl / 3;
}

absl::Status ServerImpl::Init() {
  if (!options_.storage.etcd_endpoints.empty() &&
      ElectionTolerance(options_.storage.etcd_owner_ttl) < kEtcdElectionTime) {
    const absl::Duration ttl = options_.storage.etcd_owner_ttl;
    Note(absl::StrCat(
        "warning: --etcd-owner-ttl=", absl::FormatDuration(ttl), " rides out an etcd leader ",
        "election of ", absl::FormatDuration(absl::Trunc(ElectionTolerance(ttl), absl::Milliseconds(10))),
        " at worst (", absl::FormatDuration(absl::Trunc(ttl * (1 - kEtcdOwnerMargin), absl::Milliseconds(10))),
        " at best); with etcd's default --election-timeout (1s) an election takes up to about ",
        absl::FormatDuration(kEtcdElectionTime), ", and one that outlasts the ownership deposes ",
        "the serving replica (it stands by again, clients wait for another to serve): ",
        absl::FormatDuration(absl::Seconds(std::ceil(
            absl::FDivDuration(kEtcdElectionTime, ElectionTolerance(absl::Seconds(1)))))),
        " or more rides elections out (docs/high-availability.md, choosing the owner TTL)"));
  }
  if (!options_.history_file.empty()) {
    auto writer = history::Writer::Open(options_.history_file, options_.history_process);
    if (!writer.ok()) return writer.status();
    history_ = std::move(*writer);
  }
  listen_options_ = options_;
  // The metrics endpoint first: a standby (and a lockd still restoring) shows that it does not
  // serve yet, and how often this process was deposed.
  serving_ = &metrics_->GetGauge(
      "lockd_serving", "1 while this lockd serves its state; 0 while it restores or stands by");
  serving_->Set(0);
  metrics_->GetCounter("lockd_depositions_total",
                       "With etcd: times this lockd process lost the prefix and stood by again "
                       "(a re-campaign; --exit-on-depose exits instead)")
      .Increment(static_cast<double>(options_.depositions));
  if (options_.metrics.port >= 0) {
    auto exposer = metrics::Exposer::Start(options_.metrics.host, options_.metrics.port, metrics_);
    if (!exposer.ok()) return exposer.status();
    exposer_ = std::move(*exposer);
  }
  if (!options_.storage.etcd_endpoints.empty() && options_.storage.etcd_standby) {
    auto front = StandbyFront::Start(listen_options_, tls_ ? tls_->Current() : nullptr);
    if (!front.ok()) return front.status();
    standby_ = std::move(*front);
    if (options_.listen.tcp) listen_options_.listen.tcp_port = standby_->tcp_port();
    Note(absl::StrCat("stood by on tcp ", listen_options_.listen.tcp_host, ":", listen_options_.listen.tcp_port,
                      ", answering NOT_LEADER"));
  }
  auto opened = OpenCommitLog();
  standby_.reset();
  if (!opened.ok()) return opened.status();
  summary_.insert(summary_.end(), opened->summary.begin(), opened->summary.end());
  // A state that holds a pool is an admission namespace: a second one on the host does not
  // start (ADR 0005).
  if (!opened->state.pools().empty()) {
    auto held = HoldAdmissionNamespace();
    if (!held.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this state holds ", opened->state.pools().size(), " admission pool",
          opened->state.pools().size() == 1 ? "" : "s", ", and ", held.status().message()));
    }
    Note(*held);
  }
  Permissions permissions = Permissions::WithoutFile(StateOwner(options_));
  if (!options_.permissions_file.empty()) {
    auto loaded = LoadPermissions(options_.storage.env, options_.permissions_file);
    if (!loaded.ok()) return loaded.status();
    permissions = std::move(*loaded);
    Note(Describe(permissions));
  } else {
    Note(absl::StrCat("no permissions file: every peer may acquire and list locks; pools are "
                      "served on the Unix socket only, and their operator is ",
                      permissions.state_owner(), ", the owner of lockd's state (ADR 0004)"));
  }
  CoreOptions core_options{.service = options_.service,
                           .connections = options_.connections,
                           .stall_threshold = options_.stall_threshold,
                           .permissions = std::move(permissions)};
  core_options.depositions = options_.depositions;
  core_options.last_deposition = options_.last_deposition;
  core_options.on_ending_fault = [this](const absl::Status& fault) { EndService(fault); };
  core_options.hold_admission_namespace = [this] { return HoldAdmissionNamespace(); };
  core_options.let_go_of_admission_namespace = [this] { admission_lock_.reset(); };
  core_options.on_stop_requested = [this] {
    Note("stopping: an operator asked (lockctl pool stop), and no pool holds a lease");
    // A moment for the reply to leave before the connections close.
    stop_timer_.expires_after(std::chrono::milliseconds(200));
    stop_timer_.async_wait([this](boost::system::error_code) { Stop(); });
  };
  if (history_) {
    core_options.on_act = [this](const Act& act) {
      static constexpr const char* kEvents[] = {"lockd-grant", "lockd-renew", "lockd-validate",
                                                "lockd-fenced-out"};
      History(act.at.nanos(), kEvents[act.kind], act.key, act.token,
              act.owned_until == MonoTime::Max() ? std::string("inf")
                                                 : absl::StrCat(act.owned_until.nanos()));
    };
  }
  core_ = std::make_unique<ServerCore>(core_options, &time_, std::move(*opened));
  listener_ = std::make_unique<Listener>(io_, core_.get(), &time_, listen_options_,
                                         tls_ ? tls_->Current() : nullptr);
  if (absl::Status s = listener_->Bind(); !s.ok()) return s;
  exporter_ = std::make_unique<MetricsExport>(core_.get(), &time_, metrics_.get(), tls_);
  if (exposer_) exporter_->ExportNow();
  return absl::OkStatus();
}

absl::Status ServerImpl::Run() {
  History(history::NowNanos(), "lockd-serving", "-", 0, core_->log().Describe());
  core_->Start();
  serving_->Set(1);
  listener_->Start();
  if (exposer_) exporter_->Start();
  io_.run();
  if (!options_.listen.unix_socket_path.empty()) ::unlink(options_.listen.unix_socket_path.c_str());
  return ended_;
}

void ServerImpl::EndService(const absl::Status& fault) {
  if (stopping_ || !ended_.ok()) return;
  ended_ = fault;
  History(history::NowNanos(), "lockd-deposed", "-", 0, std::string(fault.message()));
  serving_->Set(0);
  listener_->StopAccepting();
  end_timer_.expires_after(std::chrono::milliseconds(200));
  end_timer_.async_wait([this](boost::system::error_code) { Stop(); });
}

void ServerImpl::Stop() {
  if (stopping_) return;
  stopping_ = true;
  listener_->Stop();
  core_->Stop();
  exporter_->Stop();
  exporter_->ExportNow();
  io_.stop();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::shared_ptr<net::ReloadingTlsContext> tls;
  if (options.listen.tls.enabled()) {
    if (!options.listen.tcp) {
      return absl::InvalidArgumentError(
          "TLS certificates (--tls-*) were given but the TCP listener is off (--tcp=false)");
    }
    auto loaded =
        net::ReloadingTlsContext::Create(options.listen.tls, net::TlsRole::kServer, "--tls-");
    if (!loaded.ok()) return loaded.status();
    tls = std::move(*loaded);
  }
  // Last, once every option is known to be good: this changes the process's limit.
  std::string raised;
  if (absl::Status s = EnsureDescriptorBudget(options.connections.max_connections, &raised); !s.ok()) return s;
  ServerOptions resolved = options;
  if (resolved.storage.env == nullptr) resolved.storage.env = Env::Posix();
  if (resolved.clock == nullptr) resolved.clock = Clock::Real();
  auto server = std::make_unique<ServerImpl>(resolved, tls);
  if (!raised.empty()) server->Note(raised);
  if (tls) {
    server->Note(absl::StrCat("TLS 1.3 on tcp as ", tls->Current()->summary(),
                              "; clients need a certificate from ", options.listen.tls.ca_file));
  }
  if (absl::Status s = server->Init(); !s.ok()) return s;
  return server;
}

}  // namespace fencelock::server
