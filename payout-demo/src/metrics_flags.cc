#include "metrics_flags.h"

#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "process/process.h"

ABSL_FLAG(int, metrics_port, -1, "serve /metrics on this port; 0 picks one, -1 disables");
ABSL_FLAG(std::string, metrics_port_file, "", "write the bound metrics port to this file");

namespace fencelock::payout {

absl::StatusOr<std::unique_ptr<metrics::Exposer>> ServeMetricsFromFlags(
    const std::string& host, std::shared_ptr<metrics::Registry> registry) {
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port < 0) return std::unique_ptr<metrics::Exposer>();
  auto started = metrics::Exposer::Start(host, port, std::move(registry));
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        absl::StrCat("metrics: ", started.status().message()));
  }
  if (absl::Status s = process::WritePortFile(absl::GetFlag(FLAGS_metrics_port_file),
                                              (*started)->port());
      !s.ok()) {
    return s;
  }
  return std::move(*started);
}

}  // namespace fencelock::payout
