// Serves a metrics::Registry to Prometheus over HTTP (GET /metrics) from one thread of its own,
// with a bounded budget: at most 64 connections open (a new one beyond that closes the oldest
// that has not sent its request, never one being answered), 2 s for a connection to send its
// request, 5 s to take the response, one request per connection. A flood of connections that send nothing cannot hold up a scrape. Target
// metrics_http; a program that never serves its metrics does not need it.
#ifndef FENCELOCK_METRICS_EXPOSER_H_
#define FENCELOCK_METRICS_EXPOSER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "api/export.h"
#include "metrics/metrics.h"

namespace fencelock::metrics {

// Destroying it closes the listener and its connections and ends its thread before returning.
class FENCELOCK_API Exposer {
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
