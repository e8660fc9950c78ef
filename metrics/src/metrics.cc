#include "metrics/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace fencelock::metrics {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                       bounds_.begin());
  StdMutexLock lock(&mu_);
  ++counts_[i];
  sum_ += v;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  StdMutexLock lock(&mu_);
  uint64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    running += counts_[i];
    s.cumulative.emplace_back(bounds_[i], running);
  }
  s.count = running + counts_.back();
  s.sum = sum_;
  return s;
}

namespace {

using Kind = FamilySnapshot::Kind;

struct Family {
  std::string help;
  Kind kind;
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

// A sample value as the text format writes it: the shortest form that reads back the same
// double, and NaN, +Inf and -Inf by name.
std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : absl::StrCat(v);
}

// A label value escaped for the text format: backslash, double quote and newline.
std::string Escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string LabelText(const Labels& labels, const std::string& extra_name = "",
                      const std::string& extra_value = "") {
  std::string out;
  for (const auto& [name, value] : labels) {
    absl::StrAppend(&out, out.empty() ? "" : ",", name, "=\"", Escape(value), "\"");
  }
  if (!extra_name.empty()) {
    absl::StrAppend(&out, out.empty() ? "" : ",", extra_name, "=\"", extra_value, "\"");
  }
  return out.empty() ? out : absl::StrCat("{", out, "}");
}

}  // namespace

struct Registry::Impl {
  mutable StdMutex mu;
  std::map<std::string, Family> families ABSL_GUARDED_BY(mu);  // by name

  Family& FamilyFor(const std::string& name, const std::string& help, Kind kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto [it, inserted] = families.try_emplace(name);
    if (inserted) {
      it->second.help = help;
      it->second.kind = kind;
    }
    return it->second;
  }
};

Registry::Registry() : impl_(std::make_unique<Impl>()) {}
Registry::~Registry() = default;

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  StdMutexLock lock(&impl_->mu);
  auto& slot = impl_->FamilyFor(name, help, Kind::kCounter).counters[labels];
  if (slot == nullptr) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help,
                          const Labels& labels) {
  StdMutexLock lock(&impl_->mu);
  auto& slot = impl_->FamilyFor(name, help, Kind::kGauge).gauges[labels];
  if (slot == nullptr) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<double>& bounds, const Labels& labels) {
  StdMutexLock lock(&impl_->mu);
  auto& slot = impl_->FamilyFor(name, help, Kind::kHistogram).histograms[labels];
  if (slot == nullptr) slot = std::make_unique<Histogram>(bounds);
  return *slot;
}

std::vector<FamilySnapshot> Registry::Collect() const {
  std::vector<FamilySnapshot> out;
  StdMutexLock lock(&impl_->mu);
  for (const auto& [name, family] : impl_->families) {
    FamilySnapshot f;
    f.name = name;
    f.help = family.help;
    f.kind = family.kind;
    // A name asked for as two kinds keeps the series of the kind it was first asked for.
    switch (family.kind) {
      case Kind::kCounter:
        for (const auto& [labels, c] : family.counters) f.series.push_back({labels, c->value(), {}});
        break;
      case Kind::kGauge:
        for (const auto& [labels, g] : family.gauges) f.series.push_back({labels, g->value(), {}});
        break;
      case Kind::kHistogram:
        for (const auto& [labels, h] : family.histograms) f.series.push_back({labels, 0, h->Read()});
        break;
    }
    out.push_back(std::move(f));
  }
  return out;
}

std::string Registry::TextExposition() const {
  std::string out;
  for (const FamilySnapshot& f : Collect()) {
    const char* type = f.kind == Kind::kCounter ? "counter"
                       : f.kind == Kind::kGauge ? "gauge"
                                                : "histogram";
    absl::StrAppend(&out, "# HELP ", f.name, " ", f.help, "\n# TYPE ", f.name, " ", type, "\n");
    for (const FamilySnapshot::Series& s : f.series) {
      if (f.kind != Kind::kHistogram) {
        absl::StrAppend(&out, f.name, LabelText(s.labels), " ", Number(s.value), "\n");
        continue;
      }
      absl::StrAppend(&out, f.name, "_count", LabelText(s.labels), " ", s.histogram.count, "\n");
      absl::StrAppend(&out, f.name, "_sum", LabelText(s.labels), " ", Number(s.histogram.sum), "\n");
      for (const auto& [bound, count] : s.histogram.cumulative) {
        absl::StrAppend(&out, f.name, "_bucket", LabelText(s.labels, "le", Number(bound)), " ",
                        count, "\n");
      }
      absl::StrAppend(&out, f.name, "_bucket", LabelText(s.labels, "le", "+Inf"), " ",
                      s.histogram.count, "\n");
    }
  }
  return out;
}

std::vector<double> LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,   0.05,   0.1,     0.25,   0.5,   1.0,    2.5,    5.0,  10.0};
}

}  // namespace fencelock::metrics
