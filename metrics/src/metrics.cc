#include "metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace fencelock::metrics {

void Counter::Increment(double by) { c_->Increment(by); }
double Counter::value() const { return c_->Value(); }
void Gauge::Set(double v) { g_->Set(v); }
double Gauge::value() const { return g_->Value(); }
void Histogram::Observe(double v) { h_->Observe(v); }

struct Registry::Impl {
  absl::Mutex mu;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counter_families
      ABSL_GUARDED_BY(mu);
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauge_families ABSL_GUARDED_BY(mu);
  std::map<std::string, prometheus::Family<prometheus::Histogram>*> histogram_families
      ABSL_GUARDED_BY(mu);
  std::map<std::string, std::unique_ptr<Counter>> counters ABSL_GUARDED_BY(mu);
  std::map<std::string, std::unique_ptr<Gauge>> gauges ABSL_GUARDED_BY(mu);
  std::map<std::string, std::unique_ptr<Histogram>> histograms ABSL_GUARDED_BY(mu);
};

namespace {
std::string Key(const std::string& name, const Labels& labels) {
  return absl::StrCat(name, "{", absl::StrJoin(labels, ",", absl::PairFormatter("=")), "}");
}
}  // namespace

Registry::Registry()
    : registry_(std::make_shared<prometheus::Registry>()), impl_(std::make_unique<Impl>()) {}
Registry::~Registry() = default;

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  absl::MutexLock lock(&impl_->mu);
  auto& slot = impl_->counters[Key(name, labels)];
  if (slot == nullptr) {
    auto*& family = impl_->counter_families[name];
    if (family == nullptr) {
      family = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
    }
    slot = std::make_unique<Counter>(&family->Add(labels));
  }
  return *slot;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help,
                          const Labels& labels) {
  absl::MutexLock lock(&impl_->mu);
  auto& slot = impl_->gauges[Key(name, labels)];
  if (slot == nullptr) {
    auto*& family = impl_->gauge_families[name];
    if (family == nullptr) {
      family = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
    }
    slot = std::make_unique<Gauge>(&family->Add(labels));
  }
  return *slot;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<double>& bounds, const Labels& labels) {
  absl::MutexLock lock(&impl_->mu);
  auto& slot = impl_->histograms[Key(name, labels)];
  if (slot == nullptr) {
    auto*& family = impl_->histogram_families[name];
    if (family == nullptr) {
      family = &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
    }
    slot = std::make_unique<Histogram>(
        &family->Add(labels, prometheus::Histogram::BucketBoundaries(bounds)));
  }
  return *slot;
}

std::string Registry::TextExposition() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

namespace {
// Connects to `host:port` and hangs up at once. Reaching the listener is what wakes civetweb's
// accept loop; an unreachable one (already closed, or a host this cannot parse) is fine.
void Poke(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") {
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return;
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  close(fd);
}

class CivetExposer final : public Exposer {
 public:
  CivetExposer(std::unique_ptr<prometheus::Exposer> exposer, std::string host,
               std::shared_ptr<Registry> registry)
      : exposer_(std::move(exposer)), host_(std::move(host)), registry_(std::move(registry)) {
    exposer_->RegisterCollectable(registry_->prometheus_registry());
  }
  ~CivetExposer() override {
    // civetweb's accept loop checks its stop flag only between polls of 2 s, so a plain stop
    // takes up to 2 s. Stop it on a helper thread and, until that returns, connect to the
    // listener every few milliseconds: the first connection after the flag is set wakes the
    // loop, and the stop takes about 10 ms. The helper is joined, so no civetweb thread
    // outlives this object (an exiting process would otherwise leave one behind).
    const int port = this->port();
    std::atomic<bool> stopped{false};
    std::thread stopper([&] {
      exposer_.reset();
      stopped.store(true);
    });
    while (port > 0 && !stopped.load()) {
      Poke(host_, port);
      absl::SleepFor(absl::Milliseconds(5));
    }
    stopper.join();
  }
  int port() const override {
    auto ports = exposer_->GetListeningPorts();
    return ports.empty() ? 0 : ports.front();
  }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  const std::string host_;
  std::shared_ptr<Registry> registry_;  // keeps the collectable alive
};
}  // namespace

absl::StatusOr<std::unique_ptr<Exposer>> Exposer::Start(const std::string& host, int port,
                                                        std::shared_ptr<Registry> registry) {
  in_addr parsed{};
  if (inet_pton(AF_INET, host.c_str(), &parsed) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot serve metrics on \"", host, "\": the metrics endpoint needs an IPv4 address"));
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is not 0 to 65535"));
  }
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(absl::StrCat(host, ":", port));
    return std::unique_ptr<Exposer>(
        std::make_unique<CivetExposer>(std::move(exposer), host, std::move(registry)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", host, ":", port, ": ", e.what()));
  }
}

std::vector<double> LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,   0.05,   0.1,     0.25,   0.5,   1.0,    2.5,    5.0,  10.0};
}

}  // namespace fencelock::metrics
