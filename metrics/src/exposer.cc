#include "metrics/exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"

namespace fencelock::metrics {

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

// The registry as prometheus-cpp's serializer wants it, read at each scrape.
class Collectable final : public prometheus::Collectable {
 public:
  explicit Collectable(std::shared_ptr<Registry> registry) : registry_(std::move(registry)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    for (const FamilySnapshot& f : registry_->Collect()) {
      prometheus::MetricFamily family;
      family.name = f.name;
      family.help = f.help;
      family.type = f.kind == FamilySnapshot::Kind::kCounter ? prometheus::MetricType::Counter
                    : f.kind == FamilySnapshot::Kind::kGauge ? prometheus::MetricType::Gauge
                                                             : prometheus::MetricType::Histogram;
      for (const FamilySnapshot::Series& s : f.series) {
        prometheus::ClientMetric metric;
        for (const auto& [name, value] : s.labels) metric.label.push_back({name, value});
        switch (f.kind) {
          case FamilySnapshot::Kind::kCounter:
            metric.counter.value = s.value;
            break;
          case FamilySnapshot::Kind::kGauge:
            metric.gauge.value = s.value;
            break;
          case FamilySnapshot::Kind::kHistogram:
            metric.histogram.sample_count = s.histogram.count;
            metric.histogram.sample_sum = s.histogram.sum;
            for (const auto& [bound, count] : s.histogram.cumulative) {
              metric.histogram.bucket.push_back({count, bound});
            }
            metric.histogram.bucket.push_back(
                {s.histogram.count, std::numeric_limits<double>::infinity()});
            break;
        }
        family.metric.push_back(std::move(metric));
      }
      out.push_back(std::move(family));
    }
    return out;
  }

 private:
  const std::shared_ptr<Registry> registry_;
};

class CivetExposer final : public Exposer {
 public:
  CivetExposer(std::unique_ptr<prometheus::Exposer> exposer, std::string host,
               std::shared_ptr<Registry> registry)
      : exposer_(std::move(exposer)), host_(std::move(host)), registry_(std::move(registry)) {
    exposer_->RegisterCollectable(collectable_);
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
  std::shared_ptr<Registry> registry_;
  // The exposer holds it weakly; it lives as long as this object.
  std::shared_ptr<Collectable> collectable_ = std::make_shared<Collectable>(registry_);
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

}  // namespace fencelock::metrics
