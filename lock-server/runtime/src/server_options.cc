// ServerOptions::Validate(): every check on lockd's options, in one place, by the part that
// uses them. Each refusal names the `lockd` flag bound to the field (lockd_main.cc), since
// that is what an operator typed; a library caller finds the field by the same name.
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "lock-server/etcd_commit_log.h"
#include "lock-server/server.h"
#include "lock-server/storage.h"

namespace fencelock::server {
namespace {

absl::Status Refuse(std::string why) { return absl::InvalidArgumentError(std::move(why)); }

// `flag` within [lo, hi], for durations.
absl::Status InRange(const char* flag, absl::Duration value, absl::Duration lo, absl::Duration hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return Refuse(absl::StrCat("--", flag, " must be ", absl::FormatDuration(lo), " to ",
                             absl::FormatDuration(hi), ", got ", absl::FormatDuration(value)));
}

// `flag` within [lo, hi], for counts and sizes.
absl::Status InRange(const char* flag, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return Refuse(absl::StrCat("--", flag, " must be ", lo, " to ", hi, ", got ", value));
}

absl::Status ValidateStorage(const StorageOptions& o) {
  if (o.data_dir.empty() == o.etcd_endpoints.empty()) {
    return Refuse(
        "give either a state directory (--data-dir) or an etcd cluster (--etcd and "
        "--etcd-prefix), not both and not neither (create either with lockd init)");
  }
  if (!o.etcd_endpoints.empty() && o.etcd_prefix.empty()) {
    return Refuse("--etcd needs --etcd-prefix");
  }
  if (absl::Status s = InRange("etcd-owner-ttl", o.etcd_owner_ttl, absl::Seconds(2),
                               absl::Hours(1));
      !s.ok()) {
    return s;
  }
  if (const absl::Duration usable = o.etcd_owner_ttl * (1 - kEtcdOwnerMargin);
      o.etcd_request_timeout < absl::ZeroDuration() || o.etcd_request_timeout > usable) {
    return Refuse(absl::StrCat(
        "--etcd-request-timeout must be at most the usable ownership (",
        absl::FormatDuration(usable), " of --etcd-owner-ttl=",
        absl::FormatDuration(o.etcd_owner_ttl), ") and not negative (0: a third of it), got ",
        absl::FormatDuration(o.etcd_request_timeout)));
  }
  if (absl::Status s = InRange("etcd-campaign-hold-off (a library option)",
                               o.etcd_campaign_hold_off, absl::ZeroDuration(), absl::Hours(1));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckSegmentBytes(o.wal_segment_bytes); !s.ok()) return s;
  return InRange("reservation-block (a library option)", o.reservation_block, 1,
                 uint64_t{1} << 40);
}

absl::Status ValidateListen(const ListenOptions& o) {
  if (!o.tls.crl_file.empty() && !o.tls.enabled()) {
    return Refuse("--tls-crl was given without TLS (--tls-ca, --tls-cert, --tls-key)");
  }
  if (o.tls.enabled() && !o.tcp) {
    return Refuse("TLS certificates (--tls-*) were given but the TCP listener is off (--tcp=false)");
  }
  if (!o.tcp && o.unix_socket_path.empty()) {
    return Refuse("--tcp=false leaves nothing to listen on: give --unix-socket=PATH");
  }
  if (o.unix_socket_mode > 0777) {
    return Refuse(absl::StrCat("--unix-socket-mode=", absl::Dec(o.unix_socket_mode),
                               " (decimal) is not a permission mode (0 to 0777)"));
  }
  if (!o.allowed_uids.empty() && o.unix_socket_path.empty()) {
    return Refuse("--allowed-uids applies to the Unix socket; give --unix-socket too");
  }
  return absl::OkStatus();
}

absl::Status ValidateConnections(const ConnectionOptions& o) {
  for (auto [flag, value, hi] :
       {std::tuple{"max-connections", o.max_connections, uint64_t{1} << 20},
        std::tuple{"max-connections-per-peer", o.max_connections_per_peer, uint64_t{1} << 20},
        std::tuple{"max-sessions-per-connection", o.max_sessions_per_connection,
                   uint64_t{1} << 20},
        std::tuple{"max-requests-in-flight", o.max_requests_in_flight, uint64_t{1} << 16}}) {
    if (absl::Status s = InRange(flag, value, 1, hi); !s.ok()) return s;
  }
  if (absl::Status s = InRange("max-frame-bytes", o.max_frame_bytes, 64, uint64_t{64} << 20);
      !s.ok()) {
    return s;
  }
  for (auto [flag, value] : {std::pair{"hello-timeout", o.hello_timeout},
                             std::pair{"idle-timeout", o.idle_timeout},
                             std::pair{"slow-reader-timeout", o.slow_reader_timeout}}) {
    if (absl::Status s = InRange(flag, value, absl::Nanoseconds(1), absl::Hours(24)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePools(const PoolOptions& o) {
  if (o.demand_ttl < defaults::kMinPoolDemandTtl) {
    return Refuse(absl::StrCat(
        "--pool-demand-ttl must be at least ", absl::FormatDuration(defaults::kMinPoolDemandTtl),
        ", got ", absl::FormatDuration(o.demand_ttl), ": managers refresh their demand every ",
        absl::FormatDuration(defaults::kPoolDemandRefresh), " and retry a pending acquire every ",
        absl::FormatDuration(defaults::kPoolAcquireRetry),
        " (seed ADR-0006), and a shorter TTL would drop a live manager's demand between them"));
  }
  if (absl::Status s = InRange("pool-demand-ttl", o.demand_ttl, absl::Milliseconds(100),
                               absl::Hours(1));
      !s.ok()) {
    return s;
  }
  return InRange("pool-provisional-ttl", o.default_provisional_ttl, o.min_provisional_ttl,
                 o.max_provisional_ttl);
}

absl::Status ValidateService(const ServiceOptions& o) {
  // A lease is renewed well within its TTL; one of more than a day only keeps a dead
  // client's lock, and an unbounded one (--max-ttl=inf) would let a client's requested TTL
  // overflow lockd's deadlines.
  if (absl::Status s = InRange("max-ttl", o.max_ttl, absl::Milliseconds(1), absl::Hours(24));
      !s.ok()) {
    return s;
  }
  if (o.min_ttl <= absl::ZeroDuration() || o.min_ttl > o.max_ttl) {
    return Refuse(absl::StrCat("--min-ttl must be positive and at most --max-ttl (",
                               absl::FormatDuration(o.max_ttl), "), got ",
                               absl::FormatDuration(o.min_ttl)));
  }
  for (auto [flag, value] : {std::pair{"session-ttl", o.default_session_ttl},
                             std::pair{"lock-ttl", o.default_lock_ttl}}) {
    if (absl::Status s = InRange(flag, value, o.min_ttl, o.max_ttl); !s.ok()) return s;
  }
  if (absl::Status s = InRange("max-wait", o.max_wait, absl::ZeroDuration(), absl::Hours(24));
      !s.ok()) {
    return s;
  }
  for (auto [flag, value] : {std::pair{"max-locks-per-session", o.max_locks_per_session},
                             std::pair{"max-waiters-per-lock", o.max_waiters_per_lock}}) {
    if (absl::Status s = InRange(flag, value, 1, uint64_t{1} << 20); !s.ok()) return s;
  }
  if (absl::Status s = InRange("max-lock-delay", o.max_lock_delay, absl::ZeroDuration(),
                               absl::Hours(1));
      !s.ok()) {
    return s;
  }
  if (o.default_lock_delay < absl::ZeroDuration() || o.default_lock_delay > o.max_lock_delay) {
    return Refuse(absl::StrCat("--lock-delay must be 0 to --max-lock-delay (",
                               absl::FormatDuration(o.max_lock_delay), "), got ",
                               absl::FormatDuration(o.default_lock_delay)));
  }
  return ValidatePools(o.pools);
}

}  // namespace

absl::Status ServerOptions::Validate() const {
  if (absl::Status s = ValidateStorage(storage); !s.ok()) return s;
  if (absl::Status s = ValidateListen(listen); !s.ok()) return s;
  if (absl::Status s = ValidateConnections(connections); !s.ok()) return s;
  if (absl::Status s = ValidateService(service); !s.ok()) return s;
  // 0 turns the stall watch off; a negative value is a mistake, never a silent "off".
  if (stall_threshold < absl::ZeroDuration() || stall_threshold > absl::Hours(24)) {
    return Refuse(absl::StrCat("--stall-threshold must be 0 (off) to 24h, got ",
                               absl::FormatDuration(stall_threshold)));
  }
  if (admission_lock.empty() || admission_lock.front() != '/' || admission_lock.back() == '/') {
    return Refuse(absl::StrCat("--admission-lock must be an absolute path to a file, got \"",
                               admission_lock, "\""));
  }
  if (metrics.port < -1 || metrics.port > 65535) {
    return Refuse(absl::StrCat("--metrics-port=", metrics.port,
                               " is not a TCP port (0 to 65535, or -1 for none)"));
  }
  return absl::OkStatus();
}

}  // namespace fencelock::server
