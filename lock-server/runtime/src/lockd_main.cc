// lockd: the fencelock lock server.
//
//   lockd init  --data-dir=DIR | --etcd=HOST:PORT,... --etcd-prefix=/fencelock/NAME
//   lockd destroy --data-dir=DIR | --etcd=HOST:PORT,... --etcd-prefix=/fencelock/NAME
//   lockd serve --data-dir=DIR [--listen=127.0.0.1] [--port=7420] [--unix-socket=PATH]
//               [--port-file=PATH] [--session-ttl=15s] [--lock-ttl=30s]
//               [--tls-ca=PEM --tls-cert=PEM --tls-key=PEM]
//
// `serve` restores the state in DIR before it listens and refuses (exit 1, naming the file and
// offset or reason) a missing, uninitialized, damaged or unsupported one. It then prints one
// line per listener ("lockd: listening on tcp 127.0.0.1:7420") and writes the bound TCP port to
// --port-file when given (tests bind port 0 and read it back). SIGINT or SIGTERM stops it
// cleanly. Flags accept dashes or underscores.
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "clock/clock.h"
#include "lock-server/destroy.h"
#include "lock-server/etcd_access.h"
#include "lock-server/env.h"
#include "lock-server/etcd_commit_log.h"
#include "lock-server/server.h"
#include "process/flags.h"
#include "process/process.h"
#include "protocol/defaults.h"
#include "lock-server/storage.h"
#include "logging/logging.h"

// lockd serve's flags bound to ServerOptions fields: X(type, flag, field, help). Each flag's
// default is its field's (server.h, lock-server/options.h), and ServerOptionsFromFlags() sets
// each field from its flag, so a new option is its field, a line here and its use;
// ServerOptions::Validate() checks them all. The flags below the list need more than a copy.
#define LOCKD_BOUND_FLAGS(X)                                                                   \
  X(std::string, data_dir, storage.data_dir, "state directory (created by lockd init)")        \
  X(std::string, etcd_prefix, storage.etcd_prefix,                                             \
    "with --etcd: the key prefix of this lockd's state")                                       \
  X(absl::Duration, etcd_owner_ttl, storage.etcd_owner_ttl,                                    \
    "with --etcd: TTL of lockd's lease on the prefix; a successor waits at most this long")    \
  X(bool, etcd_standby, storage.etcd_standby,                                                  \
    "with --etcd: while another lockd serves the prefix, stand by (not listening) and take "   \
    "over when its lease ends, instead of refusing")                                           \
  X(absl::Duration, etcd_request_timeout, storage.etcd_request_timeout,                        \
    "with --etcd: how long one etcd request may take before the next endpoint is tried; 0: a " \
    "third of the usable ownership (--etcd-owner-ttl x 0.7 / 3, at most 5s)")                  \
  X(uint64_t, etcd_snapshot_bytes, storage.etcd_snapshot_bytes,                                \
    "with --etcd: take a snapshot (and delete the log it covers) once the log since the last " \
    "one is this large")                                                                       \
  X(uint64_t, wal_segment_bytes, storage.wal_segment_bytes,                                    \
    "size of each preallocated WAL segment; a snapshot follows each new segment")              \
  X(std::string, history, history_file,                                                        \
    "append a record of every grant, renewal and confirmation, and of the etcd ownership, to " \
    "this history file (for the fault harness's checker)")                                     \
  X(std::string, history_name, history_process, "with --history: this lockd's name in it")     \
  X(std::string, permissions, permissions_file,                                                \
    "the permissions file: what each identity may acquire and list (see docs/security.md); "   \
    "reloaded on SIGHUP; default: none, everything allowed")                                   \
  X(bool, tcp, listen.tcp, "serve TCP; --tcp=false serves the Unix socket only (--unix-socket)") \
  X(std::string, listen, listen.tcp_host,                                                      \
    "TCP address to listen on: loopback only, unless TLS is on (plaintext TCP is never "       \
    "served to other machines)")                                                               \
  X(std::string, tls_ca, listen.tls.ca_file,                                                   \
    "TLS on TCP: the CA certificate (PEM) that client certificates must chain to")             \
  X(std::string, tls_cert, listen.tls.cert_file,                                               \
    "TLS on TCP: lockd's certificate (PEM, with any intermediates after it)")                  \
  X(std::string, tls_key, listen.tls.key_file, "TLS on TCP: the private key of --tls-cert (PEM)") \
  X(std::string, tls_crl, listen.tls.crl_file,                                                 \
    "TLS on TCP: certificate revocation lists (PEM) signed by the --tls-ca CA; a client "       \
    "certificate they list is refused. The TLS files are read again on SIGHUP")                \
  X(std::string, unix_socket, listen.unix_socket_path,                                         \
    "also listen on this Unix-domain socket path")                                             \
  X(std::string, admission_lock, admission_lock,                                               \
    "admission pools: the host's lock that the one lockd coordinating pools holds (ADR 0005); " \
    "every coordinator of a host must name the same file")                                     \
  X(uint64_t, max_connections, connections.max_connections,                                    \
    "open connections lockd serves at once")                                                   \
  X(uint64_t, max_connections_per_peer, connections.max_connections_per_peer,                  \
    "open connections of one peer (a user id, or a remote address) at once")                   \
  X(uint64_t, max_sessions_per_connection, connections.max_sessions_per_connection,            \
    "open sessions one connection may open")                                                   \
  X(uint64_t, max_frame_bytes, connections.max_frame_bytes, "largest frame accepted, in bytes") \
  X(uint64_t, max_requests_in_flight, connections.max_requests_in_flight,                      \
    "requests of one connection waiting for their commit before lockd stops reading it")       \
  X(absl::Duration, hello_timeout, connections.hello_timeout,                                  \
    "close a connection that sends no Hello within this long")                                 \
  X(absl::Duration, idle_timeout, connections.idle_timeout,                                    \
    "close a connection that sent nothing for this long and has no open session or queued "    \
    "acquire")                                                                                 \
  X(absl::Duration, slow_reader_timeout, connections.slow_reader_timeout,                      \
    "close a connection whose replies stay unread for this long")                              \
  X(absl::Duration, session_ttl, service.default_session_ttl,                                  \
    "lock.session.ttl: TTL of sessions that ask for none")                                     \
  X(absl::Duration, lock_ttl, service.default_lock_ttl,                                        \
    "lock.default.ttl: lease TTL of acquires that ask for none")                               \
  X(absl::Duration, min_ttl, service.min_ttl,                                                  \
    "the shortest session or lock TTL a client may ask for")                                   \
  X(absl::Duration, max_ttl, service.max_ttl,                                                  \
    "the longest session or lock TTL a client may ask for")                                    \
  X(absl::Duration, max_wait, service.max_wait,                                                \
    "the longest an acquire may ask to wait in a lock's queue")                                \
  X(uint64_t, max_locks_per_session, service.max_locks_per_session,                            \
    "locks one session may hold and wait for")                                                 \
  X(uint64_t, max_waiters_per_lock, service.max_waiters_per_lock, "waiters queued on one lock") \
  X(absl::Duration, lock_delay, service.default_lock_delay,                                    \
    "after a holder is lost (lease expired or session ended, not released), do not grant its " \
    "lock again for this long (a lost shared holder delays exclusive grants only), unless its " \
    "acquire asked for another delay; 0: none (ADR 0006)")                                     \
  X(absl::Duration, max_lock_delay, service.max_lock_delay,                                    \
    "the longest lock delay an acquire may ask for; one above is refused")                     \
  X(absl::Duration, pool_demand_ttl, service.pools.demand_ttl,                                 \
    "admission pools: how long positive demand stays current without a refresh (at least 3s: " \
    "managers refresh it every 1s and retry acquires every 2s)")                               \
  X(absl::Duration, pool_provisional_ttl, service.pools.default_provisional_ttl,               \
    "admission pools: TTL of provisional leases whose acquire asks for none")                  \
  X(absl::Duration, stall_threshold, stall_threshold,                                          \
    "when lockd itself did not run for longer than this, extend every lease by the time it "   \
    "lost; 0 disables")                                                                        \
  X(std::string, metrics_listen, metrics.host,                                                 \
    "IPv4 address of the metrics endpoint (it shows counts and figures, never lock names, "    \
    "session ids or tokens)")

#define LOCKD_DEFINE_BOUND_FLAG(type, flag, field, help) \
  ABSL_FLAG(type, flag, fencelock::server::ServerOptions{}.field, help);
LOCKD_BOUND_FLAGS(LOCKD_DEFINE_BOUND_FLAG)
#undef LOCKD_DEFINE_BOUND_FLAG

// Flags that are parsed, resolved or checked on their way to a field, or that lockd's command
// line keeps for itself.
ABSL_FLAG(std::string, etcd, "",
          "instead of --data-dir: keep the state in this etcd cluster (client endpoints "
          "host:port,host:port,...), under --etcd-prefix");
ABSL_FLAG(std::string, etcd_tls_ca, "",
          "with --etcd: speak TLS to etcd, its certificates checked against this CA (PEM; as "
          "etcdctl's --cacert)");
ABSL_FLAG(std::string, etcd_tls_cert, "",
          "with --etcd-tls-ca: lockd's client certificate for etcd (PEM; as etcdctl's --cert)");
ABSL_FLAG(std::string, etcd_tls_key, "",
          "with --etcd-tls-cert: its private key (PEM; as etcdctl's --key)");
ABSL_FLAG(std::string, etcd_user, "",
          "with --etcd: the etcd user lockd authenticates as (etcd's auth enabled); the password "
          "is read from --etcd-password-file");
ABSL_FLAG(std::string, etcd_password_file, "",
          "with --etcd-user: a file holding the user's password (one line; readable by lockd's "
          "user only)");
ABSL_FLAG(bool, exit_on_depose, false,
          "with --etcd: once deposed (the ownership of the prefix lost), exit 3 for a "
          "supervisor to restart, instead of standing by again in this process");
ABSL_FLAG(int, port, fencelock::server::ServerOptions{}.listen.tcp_port,
          "TCP port to listen on; 0 picks a free port");
ABSL_FLAG(bool, allow_remote, false,
          "no longer accepted: plaintext TCP is served on loopback only; other machines connect "
          "over TLS (--tls-ca, --tls-cert, --tls-key)");
ABSL_FLAG(std::string, unix_socket_mode,
          absl::StrFormat("0%o", fencelock::server::ServerOptions{}.listen.unix_socket_mode),
          "permission bits of the Unix socket, in octal");
ABSL_FLAG(std::string, unix_socket_group, "",
          "group (name or id) of the Unix socket; default: lockd's own");
ABSL_FLAG(std::string, allowed_uids, "",
          "comma-separated user ids (or names) that may connect over the Unix socket, checked "
          "with the peer's credentials; default: anyone the socket's permissions let in");
ABSL_FLAG(std::string, port_file, "",
          "write the bound TCP port to this file once lockd serves (with --etcd: removed while "
          "it stands by again after a deposition)");
ABSL_FLAG(std::string, log_level, "info",
          "the least level of lockd's log lines: debug, info, warning or error (each line is "
          "timestamped in UTC; debug and info go to standard output, warnings and errors to "
          "standard error)");
// lockd serves metrics unless told not to; the library's default is none.
ABSL_FLAG(int, metrics_port, 9420,
          "serve Prometheus metrics at this port of --metrics-listen; 0 picks a free one, -1 "
          "disables");
ABSL_FLAG(std::string, metrics_port_file, "", "write the bound metrics port to this file");

namespace {

using fencelock::Clock;
using fencelock::MonoTime;

const fencelock::logging::Logger& Log() { return fencelock::logging::Lockd(); }

// "1000" or "alice" to a user id; "staff" or "50" to a group id.
std::optional<uint32_t> ResolveId(const std::string& text, bool group) {
  uint32_t id = 0;
  if (absl::SimpleAtoi(text, &id)) return id;
  if (group) {
    if (const struct group* g = getgrnam(text.c_str())) return g->gr_gid;
  } else if (const struct passwd* p = getpwnam(text.c_str())) {
    return p->pw_uid;
  }
  return std::nullopt;
}

// A lockd deposed because its ownership lapsed (an etcd election, a freeze: kUnavailable,
// kFailedPrecondition) stands by again at once: that cannot come round faster than its lease.
// One whose ownership was taken away (P/owner deleted or overwritten: an operator moving the
// service) stands by at once too, on its port, but campaigns only after its owner TTL, so that
// the replicas already standing by take over first; campaigning at once, it re-took the prefix
// itself before they looked again (etcd_test, stop 54). One that etcd refused a commit
// (anything else) soon after it began to serve, within its owner TTL, waits kFirstPause,
// doubling up to kLongestPause, before it stands by, so that a request etcd always refuses
// never makes it spin through takeovers and restores. (A pause after every early deposition
// left no replica standing by after a dozen elections.)
constexpr absl::Duration kFirstPause = absl::Seconds(1);
constexpr absl::Duration kLongestPause = absl::Seconds(30);

// Server::Create restores the state before it listens, and a standby waits there until it
// takes over: a stop signal meanwhile (or during `pause`, first) ends lockd at once, with
// status 0 (it serves nothing yet).
absl::StatusOr<std::unique_ptr<fencelock::server::Server>> CreateUnlessStopped(
    const fencelock::server::ServerOptions& options, const sigset_t& stop_signals,
    absl::Duration pause) {
  std::atomic<bool> starting{true};
  std::thread startup_signals([&] {
    const timespec tick{0, 100'000'000};
    while (starting) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        Log().Info(absl::StrCat("signal ", sig, " before serving, exiting"));
        std::_Exit(0);
      }
    }
  });
  // The pause on the boot-time clock, so that a wall-clock step does not stretch it.
  const MonoTime until = Clock::Real()->Now() + pause;
  while (Clock::Real()->Now() < until) {
    absl::SleepFor(std::min(absl::Milliseconds(100), until - Clock::Real()->Now()));
  }
  auto server = fencelock::server::Server::Create(options);
  starting = false;
  startup_signals.join();
  return server;
}

// Ends the signal thread once Run() returned; blocked with the stop signals, ignored unless
// lockd sends it to that thread.
constexpr int kEndSignalThread = SIGUSR2;

struct RunOutcome {
  absl::Status ended;     // what Run() returned
  bool stopped = false;   // a stop signal came (SIGINT or SIGTERM)
};

// Runs `server` until a stop signal (SIGHUP reloads the permissions and the TLS files) or until
// it ends by itself.
RunOutcome RunUntilStopped(fencelock::server::Server& server, const sigset_t& signals) {
  std::atomic<bool> ending{false};
  std::atomic<bool> stopped{false};
  std::thread signal_thread([&] {
    for (;;) {
      int sig = 0;
      sigwait(&signals, &sig);
      if (sig == kEndSignalThread) {
        if (ending) return;
        continue;
      }
      if (sig == SIGHUP) {
        // A bad file changes nothing: the permissions in force stay.
        auto reloaded = server.ReloadPermissions();
        if (reloaded.ok()) {
          Log().Info(absl::StrCat("SIGHUP: ", *reloaded));
        } else {
          // Beside the successful reloads, on standard output: one stream tells the outcomes.
          Log().Info(absl::StrCat("SIGHUP: ", reloaded.status().message(),
                                  "; the permissions in force are unchanged"));
        }
        // Certificate rotation: likewise, files that do not load leave those in force.
        auto tls = server.ReloadTls();
        if (tls.ok()) {
          Log().Info(absl::StrCat("SIGHUP: ", *tls));
        } else if (!absl::IsFailedPrecondition(tls.status())) {
          Log().Warning(absl::StrCat("SIGHUP: TLS: ", tls.status().message(),
                                     "; the certificates in force are unchanged"));
        }
        continue;
      }
      Log().Info(absl::StrCat("signal ", sig, ", shutting down"));
      stopped = true;
      server.Shutdown();
      return;
    }
  });
  RunOutcome outcome{.ended = server.Run()};
  // Run() returned because of a signal, or something made it stop: the signal thread ends
  // either way.
  ending = true;
  pthread_kill(signal_thread.native_handle(), kEndSignalThread);
  signal_thread.join();
  outcome.stopped = stopped;
  return outcome;
}

// --etcd-tls-* and --etcd-user with its password file; kInvalidArgument naming the flag.
absl::StatusOr<fencelock::server::EtcdAccess> EtcdAccessFromFlags() {
  fencelock::server::EtcdAccess access{.ca_file = absl::GetFlag(FLAGS_etcd_tls_ca),
                                       .cert_file = absl::GetFlag(FLAGS_etcd_tls_cert),
                                       .key_file = absl::GetFlag(FLAGS_etcd_tls_key),
                                       .user = absl::GetFlag(FLAGS_etcd_user)};
  const std::string file = absl::GetFlag(FLAGS_etcd_password_file);
  if (access.user.empty() != file.empty()) {
    return absl::InvalidArgumentError(
        "--etcd-user and --etcd-password-file go together: give both or neither");
  }
  if (file.empty()) return access;
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-password-file=", file, " is not a readable regular file of at most 4096 bytes"));
  }
  std::ifstream in(file, std::ios::binary);
  std::string password((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read --etcd-password-file=", file));
  }
  // One line: a trailing newline (echo's, an editor's) is not part of the password.
  while (!password.empty() && (password.back() == '\n' || password.back() == '\r')) {
    password.pop_back();
  }
  if (password.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--etcd-password-file=", file, " is empty"));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    Log().Warning(absl::StrCat("--etcd-password-file=", file,
                               " is readable by others than its owner; chmod 600 it"));
  }
  access.password = std::move(password);
  return access;
}

// lockd serve's flags, as the server's options; kInvalidArgument naming the flag for one that
// cannot be served.
absl::StatusOr<fencelock::server::ServerOptions> ServerOptionsFromFlags() {
  using fencelock::server::ServerOptions;
  const int port = absl::GetFlag(FLAGS_port);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port=", port, " is not a TCP port (0 to 65535)"));
  }
  if (absl::GetFlag(FLAGS_allow_remote)) {
    return absl::InvalidArgumentError(
        "--allow-remote is no longer accepted: anyone on the network could read and forge "
        "plaintext TCP, so lockd serves it on loopback only; to serve other machines, give "
        "--tls-ca, --tls-cert and --tls-key (docs/security.md)");
  }
  ServerOptions options;
#define LOCKD_SET_BOUND_FLAG(type, flag, field, help) options.field = absl::GetFlag(FLAGS_##flag);
  LOCKD_BOUND_FLAGS(LOCKD_SET_BOUND_FLAG)
#undef LOCKD_SET_BOUND_FLAG
  options.listen.tcp_port = static_cast<uint16_t>(port);
  if (const std::string etcd = absl::GetFlag(FLAGS_etcd); !etcd.empty()) {
    auto endpoints = fencelock::server::ParseEtcdEndpoints(etcd);
    if (!endpoints.ok()) return endpoints.status();
    options.storage.etcd_endpoints = *endpoints;
  }
  {
    auto access = EtcdAccessFromFlags();
    if (!access.ok()) return access.status();
    options.storage.etcd_access = std::move(*access);
  }
  options.metrics.port = absl::GetFlag(FLAGS_metrics_port);
  {
    const std::string mode = absl::GetFlag(FLAGS_unix_socket_mode);
    char* end = nullptr;
    const unsigned long bits = std::strtoul(mode.c_str(), &end, 8);
    if (mode.empty() || *end != '\0' || bits > 0777) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--unix-socket-mode=", mode, " is not an octal permission mode (0 to 0777)"));
    }
    options.listen.unix_socket_mode = static_cast<uint32_t>(bits);
  }
  if (const std::string group = absl::GetFlag(FLAGS_unix_socket_group); !group.empty()) {
    auto gid = ResolveId(group, /*group=*/true);
    if (!gid) {
      return absl::InvalidArgumentError(
          absl::StrCat("--unix-socket-group=", group, " names no group"));
    }
    options.listen.unix_socket_gid = *gid;
  }
  for (absl::string_view user : absl::StrSplit(absl::GetFlag(FLAGS_allowed_uids), ',', absl::SkipEmpty())) {
    auto uid = ResolveId(std::string(user), /*group=*/false);
    if (!uid) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--allowed-uids: \"", user, "\" is neither a user id nor a user name"));
    }
    options.listen.allowed_uids.push_back(*uid);
  }
  // The rest is checked where every caller of the library is: ServerOptions::Validate().
  return options;
}

int Serve() {
  using fencelock::server::Server;
  using fencelock::server::ServerOptions;
  absl::StatusOr<ServerOptions> from_flags = ServerOptionsFromFlags();
  if (!from_flags.ok()) {
    Log().Error(std::string(from_flags.status().message()));
    return 1;
  }
  ServerOptions& options = *from_flags;

  // Signals are taken by a dedicated thread, so no handler runs inside the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);  // reloads the permissions and the TLS files
  sigaddset(&stop_signals, kEndSignalThread);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const bool exit_on_depose = absl::GetFlag(FLAGS_exit_on_depose);
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  const std::string metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  // Deposed in quick succession (a store that faults every commit), lockd stands by again
  // only after a pause that doubles each time, so that it never spins through takeovers.
  absl::Duration pause = absl::ZeroDuration();
  for (;;) {
    auto server = CreateUnlessStopped(options, stop_signals, pause);
    if (!server.ok() && absl::IsAborted(server.status()) && options.storage.etcd_standby) {
      // A standby took the prefix and lost it again before it served (an etcd election while
      // it restored): it stands by again, as after a deposition by time.
      pause = absl::ZeroDuration();
      options.storage.etcd_campaign_hold_off = absl::ZeroDuration();
      Log().Warning(absl::StrCat(server.status().message(), "; standing by again"));
      continue;
    }
    if (!server.ok()) {
      Log().Error(server.status().ToString());
      return 1;
    }
    for (const std::string& line : (*server)->recovery_summary()) {
      // What recovery dropped or ignored is a warning: --log-level=warning must not hide it.
      if (absl::StartsWith(line, "warning: ")) {
        Log().Warning(line.substr(sizeof("warning: ") - 1));
      } else {
        Log().Info(line);
      }
    }
    const uint16_t bound = (*server)->tcp_port();
    // The metrics port first: a waiter on the TCP port file can then read both.
    for (const auto& [file, port] : {std::pair{metrics_port_file, (*server)->metrics_port()},
                                      std::pair{port_file, static_cast<int>(bound)}}) {
      if (absl::Status s = fencelock::process::WritePortFile(file, port); !s.ok()) {
        Log().Error(s.ToString());
        return 1;
      }
    }
    if (options.listen.tcp) {
      Log().Info(absl::StrCat("listening on ", options.listen.tls.enabled() ? "tls " : "tcp ",
                              options.listen.tcp_host, ":", bound));
    }
    if (!options.listen.unix_socket_path.empty()) {
      Log().Info(absl::StrCat("listening on unix ", options.listen.unix_socket_path));
    }
    if ((*server)->metrics_port() > 0) {
      Log().Info(absl::StrCat("serving metrics on http://", options.metrics.host, ":",
                              (*server)->metrics_port(), "/metrics"));
    }
    const MonoTime serving_since = Clock::Real()->Now();
    const RunOutcome outcome = RunUntilStopped(**server, stop_signals);
    const absl::Status& ended = outcome.ended;
    if (ended.ok()) return 0;
    // The etcd backend after a fault: this lockd may no longer own the prefix.
    if (exit_on_depose || outcome.stopped || options.storage.etcd_endpoints.empty()) {
      server->reset();  // gives the lease back, so that a standby takes over now
      Log().Error(absl::StrCat("stopped serving: ", ended.message(),
                               "; exiting so that another replica takes over"));
      return 3;
    }
    // Stand by again, in this process: the port files go until it serves again (they say it
    // serves), the same ports are bound, and the ownership is campaigned for on a new lease.
    for (const std::string& file : {port_file, metrics_port_file}) {
      if (!file.empty()) ::unlink(file.c_str());
    }
    ++options.depositions;
    options.last_deposition = std::string(ended.message());
    options.storage.etcd_standby = true;
    options.listen.tcp_port = bound;
    if ((*server)->metrics_port() > 0) options.metrics.port = (*server)->metrics_port();
    const absl::Duration served = Clock::Real()->Now() - serving_since;
    const bool lost_by_time = absl::IsUnavailable(ended) || absl::IsFailedPrecondition(ended);
    options.storage.etcd_campaign_hold_off = fencelock::server::OwnershipTakenAway(ended)
                                                 ? options.storage.etcd_owner_ttl
                                                 : absl::ZeroDuration();
    pause = lost_by_time || served >= options.storage.etcd_owner_ttl
                ? absl::ZeroDuration()
                : std::clamp(pause * 2, kFirstPause, kLongestPause);
    server->reset();
    Log().Warning(absl::StrCat(
        "deposed (", options.depositions, options.depositions == 1 ? " time" : " times",
        " in this process) after serving ", absl::FormatDuration(absl::Trunc(served, absl::Milliseconds(1))),
        ": ", ended.message(), "; gave up the lease, and standing by again",
        pause > absl::ZeroDuration()
            ? absl::StrCat(" in ", absl::FormatDuration(pause),
                           " (etcd refused a commit soon after it began to serve)")
            : std::string(),
        " (--exit-on-depose exits 3 instead)"));
  }
}

int Init() {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  const std::string etcd = absl::GetFlag(FLAGS_etcd);
  if (dir.empty() == etcd.empty()) {
    Log().Error("init needs --data-dir, or --etcd and --etcd-prefix");
    return 1;
  }
  if (!etcd.empty()) {
    auto endpoints = fencelock::server::ParseEtcdEndpoints(etcd);
    auto access = EtcdAccessFromFlags();
    absl::Status s = endpoints.ok() ? access.status() : endpoints.status();
    const std::string prefix = absl::GetFlag(FLAGS_etcd_prefix);
    if (s.ok()) {
      s = fencelock::server::InitEtcdPrefix(
          {.endpoints = *endpoints, .access = *access, .prefix = prefix});
    }
    if (!s.ok()) {
      Log().Error(absl::StrCat("init: ", s.ToString()));
      return 1;
    }
    Log().Info(absl::StrCat("initialized etcd prefix ", prefix, " on ", etcd));
    return 0;
  }
  absl::Status s = fencelock::server::InitDataDir(fencelock::server::Env::Posix(), dir,
                                                  absl::GetFlag(FLAGS_wal_segment_bytes));
  if (!s.ok()) {
    Log().Error(absl::StrCat("init: ", s.ToString()));
    return 1;
  }
  Log().Info(absl::StrCat("initialized state directory ", dir));
  return 0;
}

// Names what the state still holds, on standard error: lockd destroy's exit 4.
int StillHeld(const std::string& where, const std::vector<std::string>& held) {
  Log().Error(absl::StrCat("destroy: ", where, " still holds ", held.size(),
                           held.size() == 1 ? " lock or lease" : " locks and leases",
                           "; nothing removed (release or drain them first):"));
  for (const std::string& line : held) std::fprintf(stderr, "  %s\n", line.c_str());
  return 4;
}

// `lockd destroy --etcd=... --etcd-prefix=P`: every key lockd wrote under P/, once it holds
// nothing.
int DestroyEtcd(const std::string& etcd) {
  auto endpoints = fencelock::server::ParseEtcdEndpoints(etcd);
  if (!endpoints.ok()) {
    Log().Error(absl::StrCat("destroy: ", endpoints.status().ToString()));
    return 1;
  }
  auto access = EtcdAccessFromFlags();
  if (!access.ok()) {
    Log().Error(absl::StrCat("destroy: ", access.status().message()));
    return 1;
  }
  const std::string prefix = absl::GetFlag(FLAGS_etcd_prefix);
  const absl::Duration ttl = absl::GetFlag(FLAGS_etcd_owner_ttl);
  auto out = fencelock::server::DestroyEtcdPrefix(
      {.endpoints = *endpoints,
       .access = *access,
       .prefix = prefix,
       .owner_ttl = ttl,
       .owner_wait = ttl + absl::Seconds(2),  // a lockd that crashed leaves its key that long
       .owner = absl::StrCat("lockd destroy pid ", ::getpid())},
      fencelock::server::HeldInState);
  if (!out.ok()) {
    Log().Error(absl::StrCat("destroy: ", out.status().ToString(), "; nothing removed"));
    return 1;
  }
  if (!out->held.empty()) return StillHeld("etcd prefix " + prefix, out->held);
  Log().Info(absl::StrCat("destroyed the state under etcd prefix ", prefix, ": deleted ",
                          out->deleted, " keys lockd wrote under ", prefix, "/"));
  if (!out->left.empty()) {
    const size_t shown = std::min<size_t>(out->left.size(), 20);
    Log().Warning(absl::StrCat("left ", out->left.size(), " keys under ", prefix,
                               "/ that lockd did not write: ",
                               absl::StrJoin(out->left.begin(), out->left.begin() + shown, ", "),
                               out->left.size() > shown ? ", ..." : ""));
  }
  return 0;
}

// `lockd destroy`: exit 0 removed, 4 the state still holds locks or pool leases (listed,
// nothing removed), 1 anything else (nothing removed).
int Destroy() {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  const std::string etcd = absl::GetFlag(FLAGS_etcd);
  if (dir.empty() == etcd.empty()) {
    Log().Error("destroy needs --data-dir, or --etcd and --etcd-prefix");
    return 1;
  }
  if (!etcd.empty()) return DestroyEtcd(etcd);
  auto out = fencelock::server::DestroyStateDir(fencelock::server::Env::Posix(), dir,
                                                absl::StrCat("lockd destroy pid ", ::getpid()));
  if (!out.ok()) {  // the message says what was removed
    Log().Error(absl::StrCat("destroy: ", out.status().ToString()));
    return 1;
  }
  if (!out->held.empty()) return StillHeld(dir, out->held);
  Log().Info(absl::StrCat("destroyed the state in ", dir, ": removed ",
                          out->removed.empty() ? "no file" : absl::StrJoin(out->removed, ", ")));
  if (out->removed_dir) {
    Log().Info(absl::StrCat("removed ", dir));
  } else {
    Log().Warning(absl::StrCat("left ", dir, ": it holds files lockd did not write: ",
                               absl::StrJoin(out->kept, ", ")));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built with its debug-mode deadlock detection on: every Mutex::Lock then
  // updates a process-wide lock graph under one global lock. A release build has it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "the fencelock lock server\n"
      "  lockd init  --data-dir=DIR | --etcd=HOST:PORT,... --etcd-prefix=/fencelock/NAME\n"
      "  lockd destroy --data-dir=DIR | --etcd=... --etcd-prefix=P   (removes that state once "
      "no lock and no pool lease remains; exit 4: some remain, listed)\n"
      "  lockd serve --data-dir=DIR | --etcd=... --etcd-prefix=P [--listen=ADDR] [--port=N] [--unix-socket=PATH] [--tcp=false]\n"
      "              [--port-file=PATH] [--session-ttl=D] [--lock-ttl=D]\n"
      "              [--metrics-port=N] [--metrics-listen=ADDR] [--permissions=FILE]\n"
      "              [--tls-ca=PEM --tls-cert=PEM --tls-key=PEM]\n"
      "              [--unix-socket-mode=0600] [--unix-socket-group=G] [--allowed-uids=U,...]\n"
      "              [--max-connections=N] [--max-connections-per-peer=N]\n"
      "              [--idle-timeout=D] [--slow-reader-timeout=D] [--max-sessions-per-connection=N]\n"
      "              [--max-locks-per-session=N] [--max-waiters-per-lock=N]\n"
      "              [--max-frame-bytes=N] [--hello-timeout=D]\n"
      "              [--pool-demand-ttl=D] [--pool-provisional-ttl=D] [--admission-lock=PATH]");
  const std::vector<std::string> args = fencelock::process::ParseFlags(argc, argv);
  auto level = fencelock::logging::ParseLevel(absl::GetFlag(FLAGS_log_level));
  if (!level.ok()) {
    Log().Error(absl::StrCat("--log-level: ", level.status().message()));
    return 1;
  }
  fencelock::logging::SetLockdThreshold(*level);
  const std::string command = args.size() == 2 ? args[1] : "";
  if (command == "init") return Init();
  if (command == "serve") return Serve();
  if (command == "destroy") return Destroy();
  std::fprintf(stderr, "usage: lockd init|serve|destroy --data-dir=DIR [flags]; lockd --help lists the flags\n");
  return 1;
}
