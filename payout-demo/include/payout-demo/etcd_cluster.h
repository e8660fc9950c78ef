// A local etcd cluster for a replicated payout run (issue 16): members of Debian's etcd on free
// loopback ports, each with its own data directory, started together and stopped with the
// object. The harness kills members and finds the leader through it; health and leadership are
// read from each member's own plaintext HTTP endpoints (/health and /metrics on a metrics port
// of its own, --listen-metrics-urls), whichever way its clients connect.
//
// Not thread-safe: one owner drives it.
#ifndef FENCELOCK_PAYOUT_DEMO_ETCD_CLUSTER_H_
#define FENCELOCK_PAYOUT_DEMO_ETCD_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "process/process.h"

namespace fencelock::payout {

struct EtcdClusterOptions {
  // An existing directory; member i keeps its data in <dir>/etcd-<i> and logs to
  // <dir>/logs/etcd-<i>.log (the logs directory must exist).
  std::string dir;
  // Debian's etcd-server installs /usr/bin/etcd.
  std::string etcd_binary = "/usr/bin/etcd";
  // 1 to 7. Default: 3, which survives the loss of one member.
  int members = 3;
  // A directory made by scripts/make-certs.sh DIR etcd lockd: every member then serves its
  // clients TLS with etcd.{crt,key} and requires a client certificate signed by ca.crt
  // (--client-cert-auth), as production clusters do; lockd and etcdctl present lockd.{crt,key}.
  // Peers talk plaintext on loopback. Default: empty, plaintext for clients too.
  std::string tls_dir;
  // More of etcd's flags for every member, e.g. "--quota-backend-bytes=8388608".
  std::vector<std::string> extra_args;
};

class EtcdCluster {
 public:
  // Starts every member and waits (up to 60 s) until each reports itself healthy, which in
  // etcd means the cluster has a leader. kUnavailable naming the member's log otherwise.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(EtcdClusterOptions options);
  // Stops every member still running.
  ~EtcdCluster();

  int size() const { return static_cast<int>(members_.size()); }
  // "127.0.0.1:a,127.0.0.1:b,...": lockd's --etcd.
  std::string endpoints() const;
  int client_port(int member) const { return members_[member].client_port; }
  // lockd's flags for reaching the members (--etcd-tls-ca, --etcd-tls-cert, --etcd-tls-key),
  // empty for plaintext.
  std::vector<std::string> LockdFlags() const;
  // Runs etcdctl (beside the etcd binary) against every member with `args`, as an operator
  // would, reading standard input from `stdin_file` if not empty; what it printed on standard
  // output, or kUnavailable with the last line of its error output.
  absl::StatusOr<std::string> Ctl(const std::vector<std::string>& args,
                                  const std::string& stdin_file = "") const;
  process::Child& member(int i) { return members_[i].child; }

  // The member that is leader now (etcd_server_is_leader 1 on its /metrics), waiting up to
  // `timeout` for a running member to say so.
  absl::StatusOr<int> Leader(absl::Duration timeout);
  // Starts member `i` again on its data directory (after it was killed or stopped).
  absl::Status Restart(int i);
  // Waits up to `timeout` until every running member reports itself healthy.
  absl::Status AwaitHealthy(absl::Duration timeout);

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    int metrics_port = 0;  // plaintext /health and /metrics
    process::Child child;
  };
  explicit EtcdCluster(EtcdClusterOptions options) : options_(std::move(options)) {}
  absl::Status Spawn(int i, bool fresh);

  const EtcdClusterOptions options_;
  std::vector<Member> members_;
};

}  // namespace fencelock::payout

#endif  // FENCELOCK_PAYOUT_DEMO_ETCD_CLUSTER_H_
