// Counters, gauges and histograms for fencelock processes, and the HTTP endpoint that serves
// them to Prometheus. This is the only module that includes prometheus-cpp; everything else
// uses these small wrappers.
//
// Names follow Prometheus conventions (docs/metrics.md maps the seed's dotted names onto them).
// Every type here is thread-safe; metric objects live as long as their Registry.
#ifndef FENCELOCK_METRICS_METRICS_H_
#define FENCELOCK_METRICS_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace fencelock::metrics {

using Labels = std::map<std::string, std::string>;

class Counter {
 public:
  explicit Counter(prometheus::Counter* c) : c_(c) {}
  void Increment(double by = 1.0);
  double value() const;

 private:
  prometheus::Counter* c_;
};

class Gauge {
 public:
  explicit Gauge(prometheus::Gauge* g) : g_(g) {}
  void Set(double v);
  double value() const;

 private:
  prometheus::Gauge* g_;
};

class Histogram {
 public:
  explicit Histogram(prometheus::Histogram* h) : h_(h) {}
  void Observe(double v);

 private:
  prometheus::Histogram* h_;
};

class Registry {
 public:
  Registry();
  ~Registry();

  // The series `name{labels}`, created on first use. The same name must always come with the
  // same help text and kind. The returned reference lives as long as the registry.
  Counter& GetCounter(const std::string& name, const std::string& help,
                      const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  // `bounds` are the upper bounds of the buckets, ascending.
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels = {});

  // Everything in the Prometheus text exposition format.
  std::string TextExposition() const;

  std::shared_ptr<prometheus::Registry> prometheus_registry() const { return registry_; }

 private:
  struct Impl;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Impl> impl_;
};

// Serves GET /metrics for a registry over HTTP. Destroying it closes the listener and ends its
// threads before returning (about 10 ms).
class Exposer {
 public:
  // Listens on `host:port`, `host` an IPv4 address (port 0 picks a free one).
  // kInvalidArgument for another host or port, kUnavailable if it cannot bind.
  static absl::StatusOr<std::unique_ptr<Exposer>> Start(const std::string& host, int port,
                                                        std::shared_ptr<Registry> registry);
  virtual ~Exposer() = default;
  virtual int port() const = 0;
};

// Seconds-scale latency buckets from 50 µs to 10 s.
std::vector<double> LatencyBuckets();

}  // namespace fencelock::metrics

#endif  // FENCELOCK_METRICS_METRICS_H_
