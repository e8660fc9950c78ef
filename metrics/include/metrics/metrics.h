// Counters, gauges and histograms for fencelock processes and the client library, and their
// Prometheus text exposition. Self-contained: a program that links the client library for its
// locks links nothing else for its metrics. Serving the metrics over HTTP is
// metrics/exposer.h (target metrics_http).
//
// Names follow Prometheus conventions (docs/metrics.md maps the seed's dotted names onto them).
// Every type here is thread-safe; metric objects live as long as their Registry.
#ifndef FENCELOCK_METRICS_METRICS_H_
#define FENCELOCK_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "api/export.h"
#include "clock/std_mutex.h"

namespace fencelock::metrics {

using Labels = std::map<std::string, std::string>;

class FENCELOCK_API Counter {
 public:
  void Increment(double by = 1.0) { value_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class FENCELOCK_API Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class FENCELOCK_API Histogram {
 public:
  // `bounds`: the buckets' upper bounds, ascending; a +Inf bucket is always added.
  explicit Histogram(std::vector<double> bounds);
  // Counts `v` in the first bucket whose bound is at least `v`.
  void Observe(double v);

  struct Snapshot {
    std::vector<std::pair<double, uint64_t>> cumulative;  // (bound, count <= bound), no +Inf
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable StdMutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // one per bound, then +Inf
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// A metric family as read at one moment, for an exposer.
struct FamilySnapshot {
  enum class Kind { kCounter, kGauge, kHistogram };
  std::string name, help;
  Kind kind = Kind::kCounter;
  struct Series {
    Labels labels;
    double value = 0;              // counter, gauge
    Histogram::Snapshot histogram;  // histogram
  };
  std::vector<Series> series;
};

class FENCELOCK_API Registry {
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

  // Every family and series, by name.
  std::vector<FamilySnapshot> Collect() const;
  // Everything in the Prometheus text exposition format.
  std::string TextExposition() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Seconds-scale latency buckets from 50 µs to 10 s.
FENCELOCK_API std::vector<double> LatencyBuckets();

}  // namespace fencelock::metrics

#endif  // FENCELOCK_METRICS_METRICS_H_
