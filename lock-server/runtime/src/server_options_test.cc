// ServerOptions::Validate(): the defaults with a state directory are served; each option out of
// its range is refused naming the lockd flag bound to it, before anything is opened.
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-server/server.h"

namespace fencelock::server {
namespace {

using ::testing::HasSubstr;

ServerOptions WithStateDir() {
  ServerOptions o;
  o.storage.data_dir = "/nonexistent/state";
  return o;
}

TEST(ServerOptionsTest, TheDefaultsWithAStateDirectoryAreValid) {
  EXPECT_TRUE(WithStateDir().Validate().ok()) << WithStateDir().Validate();
  ServerOptions etcd;
  etcd.storage.etcd_endpoints = {"127.0.0.1:2379"};
  etcd.storage.etcd_prefix = "/fencelock/a";
  EXPECT_TRUE(etcd.Validate().ok()) << etcd.Validate();
}

TEST(ServerOptionsTest, EachOptionOutOfItsRangeIsRefusedNamingItsFlag) {
  struct Case {
    const char* flag;  // what the refusal must name
    std::function<void(ServerOptions&)> set;
  };
  const std::vector<Case> cases = {
      {"--data-dir", [](ServerOptions& o) { o.storage.data_dir.clear(); }},
      {"--etcd-prefix", [](ServerOptions& o) {
         o.storage.data_dir.clear();
         o.storage.etcd_endpoints = {"127.0.0.1:2379"};
       }},
      {"--etcd-owner-ttl", [](ServerOptions& o) { o.storage.etcd_owner_ttl = absl::Seconds(1); }},
      {"--etcd-request-timeout",
       [](ServerOptions& o) { o.storage.etcd_request_timeout = absl::Seconds(8); }},
      {"--etcd-campaign-hold-off",
       [](ServerOptions& o) { o.storage.etcd_campaign_hold_off = -absl::Seconds(1); }},
      {"--etcd-campaign-hold-off",
       [](ServerOptions& o) { o.storage.etcd_campaign_hold_off = absl::InfiniteDuration(); }},
      {"--wal-segment-bytes", [](ServerOptions& o) { o.storage.wal_segment_bytes = 1; }},
      {"--tcp=false", [](ServerOptions& o) { o.listen.tcp = false; }},
      {"--allowed-uids", [](ServerOptions& o) { o.listen.allowed_uids = {0}; }},
      {"--max-connections", [](ServerOptions& o) { o.connections.max_connections = 0; }},
      {"--max-connections", [](ServerOptions& o) { o.connections.max_connections = 1u << 21; }},
      {"--max-connections-per-peer",
       [](ServerOptions& o) { o.connections.max_connections_per_peer = 0; }},
      {"--max-sessions-per-connection",
       [](ServerOptions& o) { o.connections.max_sessions_per_connection = 0; }},
      {"--max-requests-in-flight",
       [](ServerOptions& o) { o.connections.max_requests_in_flight = 0; }},
      {"--max-frame-bytes", [](ServerOptions& o) { o.connections.max_frame_bytes = 63; }},
      {"--hello-timeout", [](ServerOptions& o) { o.connections.hello_timeout = absl::ZeroDuration(); }},
      {"--idle-timeout", [](ServerOptions& o) { o.connections.idle_timeout = -absl::Seconds(1); }},
      {"--slow-reader-timeout",
       [](ServerOptions& o) { o.connections.slow_reader_timeout = absl::Hours(25); }},
      {"--min-ttl", [](ServerOptions& o) { o.service.min_ttl = absl::ZeroDuration(); }},
      {"--max-ttl", [](ServerOptions& o) { o.service.max_ttl = absl::InfiniteDuration(); }},
      {"--max-ttl", [](ServerOptions& o) { o.service.max_ttl = absl::Hours(25); }},
      {"--max-wait", [](ServerOptions& o) { o.service.max_wait = absl::InfiniteDuration(); }},
      {"--session-ttl", [](ServerOptions& o) { o.service.default_session_ttl = absl::Hours(2); }},
      {"--lock-ttl", [](ServerOptions& o) { o.service.default_lock_ttl = absl::Milliseconds(1); }},
      {"--max-wait", [](ServerOptions& o) { o.service.max_wait = -absl::Seconds(1); }},
      {"--max-locks-per-session", [](ServerOptions& o) { o.service.max_locks_per_session = 0; }},
      {"--max-waiters-per-lock", [](ServerOptions& o) { o.service.max_waiters_per_lock = 0; }},
      {"--max-lock-delay", [](ServerOptions& o) { o.service.max_lock_delay = absl::Hours(2); }},
      {"--lock-delay", [](ServerOptions& o) { o.service.default_lock_delay = absl::Minutes(2); }},
      {"--pool-demand-ttl", [](ServerOptions& o) { o.service.pools.demand_ttl = absl::Seconds(2); }},
      {"--pool-demand-ttl", [](ServerOptions& o) { o.service.pools.demand_ttl = absl::Hours(2); }},
      {"--pool-provisional-ttl",
       [](ServerOptions& o) { o.service.pools.default_provisional_ttl = absl::Milliseconds(1); }},
      {"--stall-threshold", [](ServerOptions& o) { o.stall_threshold = -absl::Seconds(1); }},
      {"--admission-lock", [](ServerOptions& o) { o.admission_lock = "relative.lock"; }},
      {"--metrics-port", [](ServerOptions& o) { o.metrics.port = 70000; }},
  };
  for (const Case& c : cases) {
    ServerOptions o = WithStateDir();
    c.set(o);
    const absl::Status s = o.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.flag << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.flag)) << s;
  }
}

}  // namespace
}  // namespace fencelock::server
