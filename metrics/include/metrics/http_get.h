// The one HTTP client of the project, on Boost.Beast: a GET over plain HTTP/1.1 to a host on
// this machine or the network, for reading /metrics pages (the demo's reconciliation, the
// tests) and Prometheus's API (tests). No TLS, no redirects, no keep-alive: what a scrape
// needs.
#ifndef FENCELOCK_METRICS_HTTP_GET_H_
#define FENCELOCK_METRICS_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fencelock::metrics {

struct HttpResponse {
  int status = 0;    // 200, 404, ...
  std::string body;  // exactly Content-Length bytes when the server sent one
};

// GETs `path` from `host`:`port` (a numeric IPv4 or IPv6 address, or "localhost"), all within
// `timeout` on the monotonic clock. Errors: kUnavailable when the server cannot be reached or
// closes early, kDeadlineExceeded at the timeout, kDataLoss for a reply that is not HTTP or is
// cut short of its Content-Length. Any status code the server sends is a response, not an
// error.
absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     absl::Duration timeout = absl::Seconds(5));

// The value of `series` in a Prometheus text exposition: a metric name, or a name with its
// labels exactly as exposed ("payouts_abandoned_total{reason=\"deadline_passed\"}"). Errors:
// kNotFound when the page has no such series, kDataLoss when its value is not a number.
absl::StatusOr<double> FindSample(const std::string& exposition, const std::string& series);

// HttpGet of http://host:port/metrics, then FindSample of `series`; a status other than 200 is
// kUnavailable naming it.
absl::StatusOr<double> ScrapeSample(const std::string& host, int port, const std::string& series,
                                    absl::Duration timeout = absl::Seconds(5));

}  // namespace fencelock::metrics

#endif  // FENCELOCK_METRICS_HTTP_GET_H_
