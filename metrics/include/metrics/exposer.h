// Serves a metrics::Registry to Prometheus over HTTP (GET /metrics), with prometheus-cpp's
// civetweb server. Target metrics_http: the one place that links prometheus-cpp; a program
// that never serves its metrics does not need it.
#ifndef FENCELOCK_METRICS_EXPOSER_H_
#define FENCELOCK_METRICS_EXPOSER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/metrics.h"

namespace fencelock::metrics {

// Destroying it closes the listener and ends its threads before returning (about 10 ms).
class Exposer {
 public:
  // Listens on `host:port`, `host` an IPv4 address (port 0 picks a free one).
  // kInvalidArgument for another host or port, kUnavailable if it cannot bind.
  static absl::StatusOr<std::unique_ptr<Exposer>> Start(const std::string& host, int port,
                                                        std::shared_ptr<Registry> registry);
  virtual ~Exposer() = default;
  virtual int port() const = 0;
};

}  // namespace fencelock::metrics

#endif  // FENCELOCK_METRICS_EXPOSER_H_
