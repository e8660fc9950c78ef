// lockd, the lock server, as a library: listeners, connections and the lock service behind
// them. The `lockd` binary is a thin command line around this; tests can also run it
// in-process.
//
// The server speaks the fencelock wire protocol (docs/contracts.md) on TCP and, when asked, on
// a Unix socket. All protocol handling and all state live on one I/O thread: the thread that
// calls Run(). Inside, it is lockd's ServerCore (lock-server/server_core.h) on Asio, with the
// local commit log; docs/architecture.md shows the parts.
#ifndef FENCELOCK_LOCK_SERVER_SERVER_H_
#define FENCELOCK_LOCK_SERVER_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clock/clock.h"
#include "lock-server/env.h"
#include "lock-server/etcd_access.h"
#include "lock-server/options.h"
#include "net/tls.h"
#include "protocol/defaults.h"

namespace fencelock::server {

// Where a host's admission lock is by default (ADR 0005): the system's directory for lock files.
inline constexpr char kDefaultAdmissionLock[] = "/run/lock/fencelock-admission.lock";

// Where lockd's state lives: a local state directory, or a prefix in an etcd cluster.
struct StorageOptions {
  // State directory created by `lockd init`. Create() restores from it before it listens, and
  // refuses a missing, uninitialized, damaged or unsupported one. Exactly one of data_dir and
  // etcd_endpoints is required.
  std::string data_dir;
  // Or: the state in an etcd cluster (lock-server/etcd_commit_log.h), at these client endpoints
  // (host:port) under etcd_prefix, created by `lockd init --etcd`.
  std::vector<std::string> etcd_endpoints;
  std::string etcd_prefix;
  // TLS and auth to etcd. Default: plaintext, no user.
  EtcdAccess etcd_access;
  // The TTL of lockd's lease on the prefix's ownership key; a lockd that dies leaves the prefix
  // to a successor after at most this long. 2 s to 1 h. Default: 10 s.
  absl::Duration etcd_owner_ttl = absl::Seconds(10);
  // With etcd: while another lockd serves the prefix, wait (without listening) until its lease
  // ends and take over, instead of refusing after the TTL. Create() blocks until then.
  // Default: false.
  bool etcd_standby = false;
  // With etcd_standby: no try to take the prefix sooner than this after Create() begins. lockd
  // stands by again with its owner TTL here after its ownership was taken away (P/owner deleted
  // or overwritten), so that the replicas already standing by take over first. Default: zero.
  absl::Duration etcd_campaign_hold_off = absl::ZeroDuration();
  // With etcd: a snapshot once the log since the last one is this large. Default: 1 MiB.
  uint64_t etcd_snapshot_bytes = uint64_t{1} << 20;
  // With etcd: the longest one etcd request may take before the next endpoint is tried.
  // Default: zero, a third of the usable ownership (TTL x 0.7 / 3, at most 5 s), so that an
  // unreachable member costs less than the ownership.
  absl::Duration etcd_request_timeout = absl::ZeroDuration();
  // Size of each preallocated WAL segment; a snapshot follows each move to a new one.
  // Default: 64 MiB.
  uint64_t wal_segment_bytes = uint64_t{64} << 20;
  // Tokens and session ids reserved per durable SEQUENCES write. Default: 10000.
  uint64_t reservation_block = 10000;
  // File system access. Default: nullptr, the real file system (Env::Posix()).
  Env* env = nullptr;
};

// Where lockd listens, and who may connect.
struct ListenOptions {
  // Whether to listen on TCP at all; false leaves only the Unix socket (which must then be
  // given). Default: true.
  bool tcp = true;
  // Address the TCP listener binds. Without `tls`, loopback only (127.0.0.0/8, ::1): plaintext
  // TCP is never served to other machines, and Create() refuses any other address. With `tls`,
  // any address. Default: 127.0.0.1.
  std::string tcp_host = "127.0.0.1";
  // TCP port; 0 picks a free one, reported by Server::tcp_port(). Default: 7420.
  uint16_t tcp_port = 7420;
  // TLS on the TCP listener: when given, every TCP connection must complete a TLS 1.3
  // handshake with a client certificate from `tls.ca_file` (within the Hello timeout) before
  // anything else, and is known by its certificate's name (net::PeerIdentity: "cn:<name>").
  // Create() refuses files that do not load (naming the file and the reason) and a certificate
  // that has expired. The Unix socket stays plaintext (its peers are known by uid). Default:
  // none, plaintext TCP on loopback.
  net::TlsFiles tls;
  // Path of a Unix-domain socket to listen on as well. Default: empty (none).
  std::string unix_socket_path;
  // Permission bits of the socket file; it is created with them (never more open, not even
  // for a moment). Default: 0600, the owner only.
  uint32_t unix_socket_mode = 0600;
  // Group id given to the socket file; -1 keeps lockd's own. Default: -1.
  int64_t unix_socket_gid = -1;
  // User ids that may connect over the Unix socket, checked with the peer's credentials
  // (SO_PEERCRED). Another user gets PERMISSION_DENIED and is logged. Empty: anyone the file
  // permissions let in. Default: empty.
  std::vector<uint32_t> allowed_uids;
};

// lockd's Prometheus endpoint (GET /metrics). It shows counts and figures, never lock names,
// session ids or tokens.
struct MetricsOptions {
  // Serve on this port; 0 picks a free one, reported by Server::metrics_port(). Default: -1,
  // no endpoint (lockd's --metrics-port turns it on).
  int port = -1;
  // Address of the endpoint (any address: Prometheus may scrape from elsewhere).
  // Default: 127.0.0.1.
  std::string host = "127.0.0.1";
};

// Everything lockd is configured with, each in the part that uses it; the `lockd` binary binds
// a flag to most of these fields (lockd_main.cc), with the field's default as the flag's.
struct ServerOptions {
  StorageOptions storage;
  ListenOptions listen;
  ConnectionOptions connections;
  // The rules: default TTLs, limits, the lock delay, the admission pools' timings.
  ServiceOptions service;
  // lockd's own stalls (CoreOptions::stall_threshold). Measured on `clock`. Default: 1 s.
  absl::Duration stall_threshold = absl::Seconds(1);
  // The permissions file (lock-server/permissions.h): what each identity may acquire and
  // list. Create() refuses a file it cannot read or parse, naming the line. Default: empty,
  // no file: every identity may acquire every lock and list.
  std::string permissions_file;
  // Admission pools: the host's admission lock (ADR 0005), which a lockd that coordinates
  // pools holds (from its start if its state holds a pool, else from its first publish); a
  // second coordinator on the host is refused, naming the first.
  std::string admission_lock = kDefaultAdmissionLock;
  MetricsOptions metrics;
  // A history file (process/history.h) that lockd appends a record to for every act (a lock
  // granted, a session renewed, a token confirmed: event lockd-grant, lockd-renew,
  // lockd-validate, the ownership deadline as detail), every renewal of its etcd ownership
  // (lockd-owned), the start of its service (lockd-serving) and its end (lockd-deposed),
  // under the process name `history_process`. The harness's HA checker reads it. Default:
  // empty, none.
  std::string history_file;
  std::string history_process = "lockd";
  // With etcd: times this process was deposed before this server, and why the last time (lockd
  // stands by again after a deposition, with a server of its own); reported by GetStats, the
  // metrics (lockd_depositions_total) and a standby's NOT_LEADER. Default: none.
  uint64_t depositions = 0;
  std::string last_deposition;
  // Source of the server's time: leases, expiry, the stall watch. Timers wait on Asio's steady
  // clock for the time left until a deadline on this clock. Default: nullptr, the real
  // boot-time clock.
  Clock* clock = nullptr;

  // Whether lockd can serve with these options: kInvalidArgument naming the flag of the first
  // that it cannot (server_options.cc). Create() calls it first. It reads no file.
  absl::Status Validate() const;
};

// Thread safety: Run() is called from one thread; Shutdown() and tcp_port() from any.
class Server {
 public:
  // Restores the state in options.data_dir, then binds the listeners. Returns kInvalidArgument
  // for bad options, the recovery error (kNotFound, kDataLoss or kFailedPrecondition, naming
  // the file and offset or reason) for a state directory it will not serve from, kUnavailable
  // when an address cannot be bound. Does not serve until Run().
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options);

  virtual ~Server() = default;

  // The bound TCP port (the real one when options asked for 0).
  virtual uint16_t tcp_port() const = 0;

  // The bound metrics port, or 0 when metrics are not served.
  virtual int metrics_port() const = 0;

  // What Create() did before serving, one line per fact, for lockd's startup log: the limit on
  // open files if it raised it, then what recovery restored.
  virtual std::vector<std::string> recovery_summary() const = 0;

  // Serves on the calling thread until Shutdown(), then returns OK. With a log that cannot
  // come back from a fault (etcd: the ownership of the prefix may be gone), a commit fault ends
  // the service too: every held reply is refused, the listeners and connections are closed,
  // and Run() returns the fault (a deposition). Destroying the server then gives the ownership
  // up, so that a standby takes over; lockd then stands by again with a new server (or exits,
  // with --exit-on-depose). Removes the Unix socket file on return.
  virtual absl::Status Run() = 0;

  // Stops serving: closes listeners and connections, makes Run() return. Non-blocking.
  virtual void Shutdown() = 0;

  // Reads options.permissions_file again and, if it parses, judges every request from then on
  // by it; sessions and held locks are left as they are. A file that cannot be read or parsed
  // changes nothing: the error names the line and the reason. Returns a line for the log.
  // Thread-safe (lockd calls it on SIGHUP).
  virtual absl::StatusOr<std::string> ReloadPermissions() = 0;

  // Certificate rotation: reads the TLS files (options.listen.tls: CA, certificate, key and
  // CRL) again and, if they load, makes every TLS connection accepted from then on handshake
  // with them; open connections and their sessions are left as they are. Files that do not
  // load change nothing: the error names the file and the reason. kFailedPrecondition when
  // lockd serves no TLS. A standby's NOT_LEADER front keeps the files it started with; the
  // listener it hands over to at a takeover takes the newest. Returns a line for the log.
  // Thread-safe (lockd calls it on SIGHUP).
  virtual absl::StatusOr<std::string> ReloadTls() = 0;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_SERVER_H_
