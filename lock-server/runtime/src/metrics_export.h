// Copies lockd's figures (the core's counters, the commit log's, gauges of the current state)
// into the Prometheus registry, every 250 ms on the core's TimeSource and once more at stop.
// Counters only ever grow by what the core counted since the last export. On the server's I/O
// thread only.
#ifndef FENCELOCK_LOCK_SERVER_METRICS_EXPORT_H_
#define FENCELOCK_LOCK_SERVER_METRICS_EXPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"

#include "clock/time_source.h"
#include "lock-server/server_core.h"
#include "metrics/metrics.h"
#include "net/tls.h"

namespace fencelock::server {

class MetricsExport {
 public:
  // `tls`: lockd's TLS context, or null without TLS; with a CRL, its next update is a gauge,
  // and a warning in the log (hourly) from a day before it is due.
  MetricsExport(const ServerCore* core, TimeSource* time, metrics::Registry* registry,
                std::shared_ptr<net::ReloadingTlsContext> tls = nullptr)
      : core_(core), timer_(time->NewTimer()), time_(time), registry_(registry),
        tls_(std::move(tls)) {}
  // Exports now and then every 250 ms.
  void Start();
  void Stop() { timer_->Cancel(); }
  void ExportNow();

 private:
  void Arm();
  // Gauges of every pool and profile (labels pool, profile).
  void ExportPools();
  // The CRL's next update, as a gauge and (when due within a day) a warning.
  void ExportCrl();

  const ServerCore* const core_;
  std::unique_ptr<Timer> timer_;
  TimeSource* const time_;
  metrics::Registry* const registry_;
  // The totals already added to the counters, by metric name.
  absl::flat_hash_map<std::string, uint64_t> exported_;
  uint64_t exported_commits_ = 0;
  uint64_t exported_commit_retries_ = 0;
  const std::shared_ptr<net::ReloadingTlsContext> tls_;
  MonoTime crl_warned_ = MonoTime::Min();  // the last warning of a CRL due soon
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_METRICS_EXPORT_H_
