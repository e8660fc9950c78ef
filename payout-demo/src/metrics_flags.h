// The --metrics-port and --metrics-port-file flags that payout-rail and payout-worker share, and
// starting their /metrics endpoint from them.
#ifndef FENCELOCK_PAYOUT_DEMO_METRICS_FLAGS_H_
#define FENCELOCK_PAYOUT_DEMO_METRICS_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/exposer.h"
#include "metrics/metrics.h"

namespace fencelock::payout {

// Serves `registry` on `host`:--metrics-port and writes the bound port to --metrics-port-file.
// nullptr when --metrics-port is negative (the default: no endpoint); an error names what failed.
absl::StatusOr<std::unique_ptr<metrics::Exposer>> ServeMetricsFromFlags(
    const std::string& host, std::shared_ptr<metrics::Registry> registry);

}  // namespace fencelock::payout

#endif  // FENCELOCK_PAYOUT_DEMO_METRICS_FLAGS_H_
