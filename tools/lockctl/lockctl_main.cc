// lockctl: inspect a running lockd.
//
//   lockctl [--server=127.0.0.1:7420 | --server=unix:/path] [--json] status
//   lockctl ... sessions
//   lockctl ... locks [--prefix=P]
//   lockctl ... waiters [--prefix=P]
//   lockctl ... pool publish|claim|ack|set-demand|acquire|renew|activate|release|recover|
//               drain|status|stop|delete [--pool=P --profile=A --slot=S --owner=O --token=T ...]
//               (admission pools: lockctl_pool.cc, docs/admission.md)
//   [--tls-ca=PEM --tls-cert=PEM --tls-key=PEM [--tls-server-name=NAME]]: TLS to a lockd that
//   serves it (docs/security.md).
//   [--timeout=5s]: every step (connect, Hello, each request) gives up after this long, so a
//   frozen lockd never hangs lockctl.
//
// Human-readable tables by default; --json prints the server's answer as JSON for scripts.
// Exit status: 0 on success, 1 when lockd cannot be reached or refuses, 2 for bad usage.
#include <cstdio>
#include <functional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "fencelock/wire.pb.h"
#include "google/protobuf/util/json_util.h"
#include "lockctl_pool.h"
#include "logging/logging.h"
#include "net/blocking_connection.h"
#include "protocol/codes.h"
#include "process/flags.h"
#include "protocol/limits.h"
#include "protocol/requests.h"

ABSL_FLAG(std::string, server, "127.0.0.1:7420", "lockd address: host:port or unix:/path");
ABSL_FLAG(bool, json, false, "print JSON instead of tables");
ABSL_FLAG(std::string, prefix, "", "locks/waiters: only locks whose name starts with this");
ABSL_FLAG(std::string, tls_ca, "", "TLS: the CA certificate (PEM) lockd's certificate chains to");
ABSL_FLAG(std::string, tls_cert, "", "TLS: lockctl's certificate (PEM)");
ABSL_FLAG(std::string, tls_key, "", "TLS: the private key of --tls-cert (PEM)");
ABSL_FLAG(std::string, tls_server_name, "",
          "TLS: the name lockd's certificate must carry; default: the host of --server");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5),
          "give up when lockd does not connect or answer a request within this long");

namespace fencelock {
namespace {

using net::BlockingConnection;
namespace req = protocol::request;

int UnknownCommand(const std::string& command) {
  logging::Program().Error(absl::StrFormat(
      "unknown command \"%s\"; use status, sessions, locks, waiters or pool", command.c_str()));
  return 2;
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

std::string Seconds(uint64_t ms) { return absl::StrCat(ms / 1000, ".", (ms % 1000) / 100, "s"); }

// One exit status per kind of answer (LockctlCodeOf): a refusal is not "lockd unreachable".
int Fail(const absl::Status& s) {
  const LockctlCode code = LockctlCodeOf(s);
  logging::Program().Error(absl::StrFormat("%s: %s", code.name, std::string(s.message()).c_str()));
  return code.exit;
}

// Every page of ListLocks, locks first (none with `sessions`, which lists only sessions), each
// handed to `page` as it arrives. Pages are cut by lockd's byte budget, so a state of any size
// is listed without ever needing a frame larger than lockd's maximum.
absl::Status ForEachPage(BlockingConnection& conn, bool sessions,
                         const std::function<void(const wire::ListReply&)>& page) {
  std::string after;
  uint64_t sessions_after = 0;
  for (bool locks_done = sessions;;) {
    const wire::Request r = req::ListLocks({.prefix = absl::GetFlag(FLAGS_prefix),
                                            .start_after = after,
                                            .limit = protocol::kMaxListLimit,
                                            .include_sessions = sessions,
                                            .skip_locks = locks_done,
                                            .sessions_after = sessions_after});
    auto reply = conn.Call(r);
    if (!reply.ok()) return reply.status();
    if (reply->code() != wire::OK) return protocol::StatusFromCode(reply->code(), reply->message());
    const wire::ListReply& list = reply->list();
    page(list);
    if (!list.locks().empty()) after = list.locks().rbegin()->lock();
    if (!list.sessions().empty()) sessions_after = list.sessions().rbegin()->session_id();
    if (list.more() && !list.locks().empty()) continue;
    locks_done = true;
    if (!sessions || !list.more_sessions() || list.sessions().empty()) return absl::OkStatus();
  }
}

// lockctl status: what lockd counts, its storage and, on etcd, its ownership and members.
int PrintStatus(BlockingConnection& conn, bool json) {
  const wire::Request r = req::GetStats();
  auto reply = conn.Call(r);
  if (!reply.ok()) return Fail(reply.status());
  if (reply->code() != wire::OK) {
    return Fail(protocol::StatusFromCode(reply->code(), reply->message()));
  }
  const wire::StatsReply& s = reply->stats();
  if (json) {
    std::printf("%s", Json(s).c_str());
    return 0;
  }
  std::printf("lockd at %s\n", absl::GetFlag(FLAGS_server).c_str());
  std::printf("  health            %s\n", s.disk_fault().empty() ? "ok" : ("DISK FAULT: " + s.disk_fault()).c_str());
  std::printf("  sessions          %lu\n", static_cast<unsigned long>(s.sessions()));
  std::printf("  locks held        %lu\n", static_cast<unsigned long>(s.locks_held()));
  std::printf("  waiters           %lu\n", static_cast<unsigned long>(s.waiters()));
  std::printf("  last token        %lu\n", static_cast<unsigned long>(s.last_token()));
  // Every counter lockd keeps, by its Prometheus name (docs/metrics.md); a lockd from before
  // the list sends only the named fields.
  std::printf("  counters\n");
  wire::StatsReply named;
  if (s.counters().empty()) {
    for (const auto& [name, value] :
         {std::pair{"lockd_grants_total", s.grants_total()},
          std::pair{"lock_fenced_out_total", s.fenced_out_total()},
          std::pair{"lockd_permission_denied_total", s.permission_denied_total()},
          std::pair{"lockd_session_expiries_total", s.session_expiries_total()},
          std::pair{"lockd_lock_expiries_total", s.lock_expiries_total()}}) {
      wire::CounterValue* c = named.add_counters();
      c->set_name(name);
      c->set_value(value);
    }
  }
  for (const wire::CounterValue& c : s.counters().empty() ? named.counters() : s.counters()) {
    const char* note = "";
    if (c.value() > 0 && c.name() == "lock_fenced_out_total") {
      note = "   (must be zero: investigate)";
    } else if (c.value() > 0 && c.name() == "lockd_permission_denied_total") {
      note = "   (requests for sessions not their own, or wrong secrets)";
    }
    std::printf("    %-42s %lu%s\n", c.name().c_str(), static_cast<unsigned long>(c.value()),
                note);
  }
  std::printf("  storage           %s\n", s.storage().c_str());
  if (s.storage().rfind("etcd", 0) == 0) {
    // Only the replica that serves the prefix answers; standbys do not listen.
    std::printf("  role              serving the prefix (leader), term %lu\n",
                static_cast<unsigned long>(s.term()));
    std::printf("  ownership         %s left (renewed every third of its TTL)\n",
                absl::FormatDuration(absl::Milliseconds(s.ownership_left_ms())).c_str());
    std::printf("  depositions       %lu%s%s\n", static_cast<unsigned long>(s.depositions_total()),
                s.depositions_total() > 0 ? " in this process, last: " : "",
                s.last_deposition().c_str());
    std::printf("  commits           lsn %lu, %lu transactions, %lu snapshots, %lu retried\n",
                static_cast<unsigned long>(s.last_lsn()),
                static_cast<unsigned long>(s.log_syncs_total()),
                static_cast<unsigned long>(s.snapshots_total()),
                static_cast<unsigned long>(s.commit_retries_total()));
    for (const wire::StoreMemberInfo& m : s.store_members()) {
      if (m.reachable()) {
        std::printf("  etcd member       %s: ok%s, raft index %lu, db %ld bytes%s%s\n",
                    m.endpoint().c_str(), m.leader() ? ", leader" : "",
                    static_cast<unsigned long>(m.raft_index()), static_cast<long>(m.db_bytes()),
                    m.error().empty() ? "" : "; ", m.error().c_str());
      } else {
        std::printf("  etcd member       %s: UNREACHABLE (%s)\n", m.endpoint().c_str(),
                    m.error().c_str());
      }
    }
  } else {
    std::printf("  WAL               lsn %lu, segment %lu, %lu syncs, %lu snapshots\n",
                static_cast<unsigned long>(s.last_lsn()),
                static_cast<unsigned long>(s.wal_segment()),
                static_cast<unsigned long>(s.log_syncs_total()),
                static_cast<unsigned long>(s.snapshots_total()));
  }
  return 0;
}

// lockctl sessions, locks and waiters: every page of the listing, as a table or one JSON
// document.
int PrintList(BlockingConnection& conn, const std::string& command, bool json) {
  const bool sessions = command == "sessions";
  // JSON is one document: gather the pages. The tables print each page as it arrives.
  wire::ListReply all;
  bool header = false;
  absl::Status listed = ForEachPage(conn, sessions, [&](const wire::ListReply& list) {
    if (json) {
      for (const auto& l : list.locks()) {
        if (command != "waiters" || l.waiters() > 0) *all.add_locks() = l;
      }
      for (const auto& s : list.sessions()) *all.add_sessions() = s;
      return;
    }
    if (!header) {
      header = true;
      if (sessions) {
        std::printf("%-22s %-10s %-12s %s\n", "SESSION", "TTL", "EXPIRES IN", "LOCKS");
      } else {
        std::printf("%-32s %-10s %-12s %-22s %-12s %-10s %s\n", "LOCK", "MODE", "TOKEN",
                    "HOLDER SESSION", "EXPIRES IN", "WAITERS", "DELAY");
      }
    }
    for (const auto& s : list.sessions()) {
      std::printf("%-22lu %-10s %-12s %u\n", static_cast<unsigned long>(s.session_id()),
                  Seconds(s.ttl_ms()).c_str(), Seconds(s.expires_in_ms()).c_str(),
                  s.locks_held());
    }
    for (const auto& l : list.locks()) {
      if (command == "waiters" && l.waiters() == 0) continue;
      // ADR 0006: a lost holder's delay, "-" when none; "all" blocks every grant, "writers"
      // exclusive grants only.
      const std::string delay =
          l.delay_left_ms() == 0
              ? "-"
              : absl::StrCat(Seconds(l.delay_left_ms()),
                             l.delay_blocks_shared() ? " (all)" : " (writers)");
      const std::string waiters =
          l.exclusive_waiters() > 0 && l.exclusive_waiters() < l.waiters()
              ? absl::StrCat(l.waiters(), " (", l.exclusive_waiters(), " excl)")
              : absl::StrCat(l.waiters());
      const char* mode = l.holders().empty()        ? "free"
                         : l.mode() == wire::SHARED ? "shared"
                                                    : "exclusive";
      // Without lockd's "inspect" right the holders and tokens are not shown to us: "-".
      auto shown = [&](uint64_t v) {
        return list.redacted() ? std::string("-") : std::to_string(v);
      };
      if (l.holders().empty()) {
        std::printf("%-32s %-10s %-12s %-22s %-12s %-10s %s\n", l.lock().c_str(), mode, "-",
                    "-", "-", waiters.c_str(), delay.c_str());
      }
      // Each holder on a line of its own; the lock's own columns on the first.
      for (int i = 0; i < l.holders_size(); ++i) {
        const wire::HolderInfo& h = l.holders(i);
        std::printf("%-32s %-10s %-12s %-22s %-12s %-10s %s\n", i == 0 ? l.lock().c_str() : "",
                    i == 0 ? mode : "", shown(h.token()).c_str(), shown(h.session_id()).c_str(),
                    Seconds(h.expires_in_ms()).c_str(), i == 0 ? waiters.c_str() : "",
                    i == 0 ? delay.c_str() : "");
      }
      if (l.holder_count() > static_cast<uint32_t>(l.holders_size())) {
        std::printf("%-32s %-10s (%u more holders not listed)\n", "", "",
                    l.holder_count() - static_cast<uint32_t>(l.holders_size()));
      }
    }
  });
  if (!listed.ok()) return Fail(listed);
  if (json) std::printf("%s", Json(all).c_str());
  return 0;
}

int Main(const std::string& command) {
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  if (timeout <= absl::ZeroDuration() || timeout > absl::Hours(1)) {
    logging::Program().Error(absl::StrFormat(
        "--timeout=%s must be positive and at most 1h", absl::FormatDuration(timeout).c_str()));
    return 2;
  }
  std::shared_ptr<net::TlsContext> tls;
  const net::TlsFiles tls_files{.ca_file = absl::GetFlag(FLAGS_tls_ca),
                                .cert_file = absl::GetFlag(FLAGS_tls_cert),
                                .key_file = absl::GetFlag(FLAGS_tls_key)};
  if (tls_files.enabled()) {
    auto loaded = net::TlsContext::Create(tls_files, net::TlsRole::kClient, "--tls-");
    if (!loaded.ok()) {
      logging::Program().Error(std::string(loaded.status().message()));
      return 2;
    }
    tls = std::move(*loaded);
  }
  auto connected = BlockingConnection::Connect({.server = absl::GetFlag(FLAGS_server),
                                                .timeout = timeout,
                                                .client_name = "lockctl",
                                                .tls = tls,
                                                .tls_server_name =
                                                    absl::GetFlag(FLAGS_tls_server_name)});
  const bool json = absl::GetFlag(FLAGS_json);
  if (auto leader = connected.status().GetPayload(net::kStandbyLeaderPayload);
      leader.has_value() && command == "status") {
    // A standby replica answers only that it stands by, and who serves.
    const std::string serving(leader->Flatten());
    // Its answer says who serves, and whether this replica served and was deposed before.
    const std::string answer(connected.status().message());
    if (json) {
      std::printf("{\n  \"answer\": %s,\n  \"leader\": %s,\n  \"role\": \"standby\"\n}\n",
                  fencelock::JsonString(answer).c_str(), fencelock::JsonString(serving).c_str());
    } else {
      std::printf("lockd at %s\n", absl::GetFlag(FLAGS_server).c_str());
      std::printf("  role              standby (--etcd-standby): takes over when the serving "
                  "replica's lease ends\n");
      std::printf("  leader            %s\n", serving.empty() ? "unknown (none serves just now?)"
                                                          : serving.c_str());
      std::printf("  answer            %s\n", answer.c_str());
    }
    return 0;
  }
  if (!connected.ok()) return Fail(connected.status());
  BlockingConnection& conn = **connected;
  if (command == "status") return PrintStatus(conn, json);
  if (command == "sessions" || command == "locks" || command == "waiters") {
    return PrintList(conn, command, json);
  }
  return UnknownCommand(command);
}

}  // namespace
}  // namespace fencelock

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("lockctl");
  absl::SetProgramUsageMessage(
      "inspect a running lockd, and drive its admission pools\n"
      "  lockctl [--server=ADDR] [--json] status|sessions|locks|waiters [--prefix=P]\n"
      "  lockctl [--server=ADDR] [--json] pool publish --pool=P --generation=N --budget=N "
      "--profiles=id[:cost=N][:reserve=N][:lendable][:borrow],...\n"
      "  lockctl ... pool claim --pool=P --profile=A --generation=N      (prints the owner)\n"
      "  lockctl ... pool ack --pool=P --profile=A --owner=O --generation=N\n"
      "  lockctl ... pool set-demand --pool=P --profile=A --owner=O --slots=N\n"
      "  lockctl ... pool acquire --pool=P --profile=A --slot=S --owner=O [--ttl=D]  (prints the "
      "token; exit 3: no units now)\n"
      "  lockctl ... pool renew|activate|release --pool=P --profile=A --slot=S --token=T --owner=O\n"
      "  lockctl ... pool recover --pool=P --profile=A --slot=S --token=T --evidence=TEXT\n"
      "  lockctl ... pool drain --pool=P [--off] | pool status --pool=P | pool stop\n"
      "  lockctl ... pool delete --pool=P   (a drained pool that holds no lease)\n"
      "  lockctl ... pool run --pool=P --profile=A --slot=S --owner=O [--ttl=D] -- CMD [ARGS]\n"
      "      (acquires, retrying every 2s, activates, runs CMD, releases; exits with CMD's status)\n"
      "  --owner defaults to $FENCELOCK_POOL_OWNER; pools are served on lockd's Unix socket\n"
      "  (--server=unix:PATH) unless its permissions file opens them to network identities\n"
      "  TLS: --tls-ca=PEM --tls-cert=PEM --tls-key=PEM [--tls-server-name=NAME]");
  const std::vector<std::string> args = fencelock::process::ParseFlags(argc, argv);
  if (args.size() >= 2 && args[1] == "pool") {
    if (args.size() > 3 && args[2] != "run") {
      fencelock::logging::Program().Error(absl::StrFormat(
          "unexpected argument \"%s\" after pool %s; a pool command takes only flags (lockctl "
          "--help lists them), and only pool run a command after --",
          args[3].c_str(), args[2].c_str()));
      return 2;
    }
    if (args.size() < 3) {
      std::fprintf(stderr, "usage: lockctl [--server=ADDR] [--json] pool <command> [flags]; "
                           "lockctl --help lists them\n");
      return 2;
    }
    const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
    if (timeout <= absl::ZeroDuration() || timeout > absl::Hours(1)) {
      fencelock::logging::Program().Error(absl::StrFormat(
          "--timeout=%s must be positive and at most 1h", absl::FormatDuration(timeout).c_str()));
      return 2;
    }
    return fencelock::PoolMain(args[2],
                               {.server = absl::GetFlag(FLAGS_server),
                                .timeout = timeout,
                                .client_name = "lockctl",
                                .tls_ca_file = absl::GetFlag(FLAGS_tls_ca),
                                .tls_cert_file = absl::GetFlag(FLAGS_tls_cert),
                                .tls_key_file = absl::GetFlag(FLAGS_tls_key),
                                .tls_server_name = absl::GetFlag(FLAGS_tls_server_name)},
                               absl::GetFlag(FLAGS_json),
                               std::vector<std::string>(args.begin() + 3, args.end()));
  }
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: lockctl [--server=ADDR] [--json] status|sessions|locks|waiters|pool\n");
    return 2;
  }
  const std::string command = args[1];
  if (command != "status" && command != "sessions" && command != "locks" && command != "waiters") {
    return fencelock::UnknownCommand(command);
  }
  return fencelock::Main(command);
}
