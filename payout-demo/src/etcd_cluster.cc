#include "payout-demo/etcd_cluster.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "clock/clock.h"
#include "metrics/http_get.h"

namespace fencelock::payout {
namespace {

constexpr char kHost[] = "127.0.0.1";

std::string Url(const char* scheme, int port) { return absl::StrCat(scheme, "://", kHost, ":", port); }

bool Healthy(int metrics_port) {
  auto r = metrics::HttpGet(kHost, metrics_port, "/health", absl::Milliseconds(500));
  return r.ok() && r->status == 200 && absl::StrContains(r->body, "\"health\":\"true\"");
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(EtcdClusterOptions options) {
  if (options.members < 1 || options.members > 7) {
    return absl::InvalidArgumentError(
        absl::StrCat("an etcd cluster of 1 to 7 members, not ", options.members));
  }
  std::unique_ptr<EtcdCluster> c(new EtcdCluster(std::move(options)));
  c->members_.resize(c->options_.members);
  for (int i = 0; i < c->size(); ++i) {
    Member& m = c->members_[i];
    m.name = absl::StrCat("etcd-", i);
    auto client = process::FreeLoopbackPort();
    if (!client.ok()) return client.status();
    auto peer = process::FreeLoopbackPort();
    if (!peer.ok()) return peer.status();
    auto metrics = process::FreeLoopbackPort();
    if (!metrics.ok()) return metrics.status();
    m.client_port = *client;
    m.peer_port = *peer;
    m.metrics_port = *metrics;
  }
  for (int i = 0; i < c->size(); ++i) {
    if (absl::Status s = c->Spawn(i, /*fresh=*/true); !s.ok()) return s;
  }
  if (absl::Status s = c->AwaitHealthy(absl::Seconds(60)); !s.ok()) return s;
  return c;
}

EtcdCluster::~EtcdCluster() {
  for (Member& m : members_) m.child.Stop();
}

std::string EtcdCluster::endpoints() const {
  std::vector<std::string> list;
  for (const Member& m : members_) list.push_back(absl::StrCat(kHost, ":", m.client_port));
  return absl::StrJoin(list, ",");
}

std::vector<std::string> EtcdCluster::LockdFlags() const {
  const std::string& tls = options_.tls_dir;
  if (tls.empty()) return {};
  return {"--etcd-tls-ca=" + tls + "/ca.crt", "--etcd-tls-cert=" + tls + "/lockd.crt",
          "--etcd-tls-key=" + tls + "/lockd.key"};
}

absl::StatusOr<std::string> EtcdCluster::Ctl(const std::vector<std::string>& args,
                                             const std::string& stdin_file) const {
  const std::string etcdctl =
      std::filesystem::path(options_.etcd_binary).parent_path().append("etcdctl").string();
  const std::string& tls = options_.tls_dir;
  std::vector<std::string> endpoints;
  for (const Member& m : members_) {
    endpoints.push_back(Url(tls.empty() ? "http" : "https", m.client_port));
  }
  std::vector<std::string> all = {"--endpoints=" + absl::StrJoin(endpoints, ","),
                                  "--command-timeout=10s"};
  if (!tls.empty()) {
    all.insert(all.end(), {"--cacert=" + tls + "/ca.crt", "--cert=" + tls + "/lockd.crt",
                           "--key=" + tls + "/lockd.key"});
  }
  all.insert(all.end(), args.begin(), args.end());
  const std::string out = options_.dir + "/logs/etcdctl.out";
  const std::string err = options_.dir + "/logs/etcdctl.err";
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  auto child = process::Child::Spawn(
      etcdctl, all, {.stdout_file = out, .stderr_file = err, .stdin_file = stdin_file});
  if (!child.ok()) return child.status();
  const std::optional<int> status = child->Wait(absl::Seconds(20));
  if (!status.has_value()) child->Stop();
  if (!status.has_value() || *status != 0) {
    std::ifstream errors(err);
    std::string line, last;
    while (std::getline(errors, line)) {
      if (!line.empty()) last = line;
    }
    return absl::UnavailableError(absl::StrCat(
        "etcdctl ", absl::StrJoin(args, " "), " ",
        status.has_value() ? process::DescribeStatus(*status) : "ran 20 s", ": ", last));
  }
  std::ifstream in(out, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::Status EtcdCluster::Spawn(int i, bool fresh) {
  Member& m = members_[i];
  std::vector<std::string> cluster;
  for (const Member& other : members_) {
    cluster.push_back(absl::StrCat(other.name, "=", Url("http", other.peer_port)));
  }
  const std::string& tls = options_.tls_dir;
  const std::string client_url = Url(tls.empty() ? "http" : "https", m.client_port);
  const std::string dir = absl::StrCat(options_.dir, "/", m.name);
  const std::string log = absl::StrCat(options_.dir, "/logs/", m.name, ".log");
  // etcd's defaults for the Raft timing (100 ms heartbeats, a 1 s election timeout); a
  // restarted member reads its cluster from its data directory and ignores the initial flags.
  std::vector<std::string> args = {
      "--name=" + m.name, "--data-dir=" + dir,
      "--listen-client-urls=" + client_url, "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + Url("http", m.peer_port),
      "--initial-advertise-peer-urls=" + Url("http", m.peer_port),
      "--listen-metrics-urls=" + Url("http", m.metrics_port),
      "--initial-cluster=" + absl::StrJoin(cluster, ","),
      std::string("--initial-cluster-state=") + (fresh ? "new" : "existing"),
      "--initial-cluster-token=fencelock-" + std::filesystem::path(options_.dir).filename().string(),
      "--log-level=warn"};
  if (!tls.empty()) {
    args.insert(args.end(), {"--cert-file=" + tls + "/etcd.crt", "--key-file=" + tls + "/etcd.key",
                             "--trusted-ca-file=" + tls + "/ca.crt", "--client-cert-auth"});
  }
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  auto child = process::Child::Spawn(options_.etcd_binary, args,
                                     {.stdout_file = log, .stderr_file = log});
  if (!child.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot start ", options_.etcd_binary, " (",
                                               child.status().message(),
                                               "); install the Debian package etcd-server"));
  }
  m.child = std::move(*child);
  return absl::OkStatus();
}

absl::Status EtcdCluster::Restart(int i) {
  if (members_[i].child.running()) {
    return absl::FailedPreconditionError(absl::StrCat(members_[i].name, " is still running"));
  }
  return Spawn(i, /*fresh=*/false);
}

absl::Status EtcdCluster::AwaitHealthy(absl::Duration timeout) {
  const MonoTime give_up = Clock::Real()->Now() + timeout;
  for (Member& m : members_) {
    if (!m.child.running()) continue;
    while (!Healthy(m.metrics_port)) {
      if (m.child.Wait(absl::ZeroDuration()).has_value()) {
        return absl::UnavailableError(absl::StrCat(
            m.name, " ", process::DescribeStatus(*m.child.status()), "; see ", options_.dir,
            "/logs/", m.name, ".log"));
      }
      if (Clock::Real()->Now() > give_up) {
        return absl::UnavailableError(absl::StrCat(
            m.name, " did not report itself healthy within ", absl::FormatDuration(timeout),
            "; see ", options_.dir, "/logs/", m.name, ".log"));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> EtcdCluster::Leader(absl::Duration timeout) {
  const MonoTime give_up = Clock::Real()->Now() + timeout;
  for (;;) {
    for (int i = 0; i < size(); ++i) {
      if (!members_[i].child.running()) continue;
      auto leader = metrics::ScrapeSample(kHost, members_[i].metrics_port, "etcd_server_is_leader",
                                          absl::Milliseconds(500));
      if (leader.ok() && *leader == 1) return i;
    }
    if (Clock::Real()->Now() > give_up) {
      return absl::UnavailableError(absl::StrCat("no etcd member said it is the leader within ",
                                                 absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

}  // namespace fencelock::payout
