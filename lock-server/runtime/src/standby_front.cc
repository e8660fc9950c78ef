#include "standby_front.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "lock-server/etcd_commit_log.h"
#include "lock-server/leadership.h"
#include "lock-server/server_core.h"
#include "listener.h"
#include "net/asio.h"
#include "net/asio_time_source.h"

namespace fencelock::server {
namespace {

class Front final : public StandbyFront {
 public:
  Front(const ServerOptions& options, std::shared_ptr<net::TlsContext> tls)
      : options_(options), tls_(std::move(tls)), time_(io_, options.clock) {}

  ~Front() override {
    if (thread_.joinable()) {
      asio::post(io_, [this] {
        listener_->Stop();
        core_->Stop();
        io_.stop();
      });
      thread_.join();
    }
    // The listener's connections refer to the core.
    listener_.reset();
    core_.reset();
  }

  absl::Status Start() {
    CoreOptions core_options{.connections = options_.connections,
                             .stall_threshold = absl::ZeroDuration()};
    OpenedCommitLog nothing;
    nothing.log = StandbyCommitLog(options_.storage.etcd_prefix);
    auto standing_by = std::make_unique<StandingBy>(
        options_.depositions == 0
            ? std::string()
            : absl::StrCat("this replica served and was deposed ", options_.depositions,
                           options_.depositions == 1 ? " time" : " times",
                           " in this process, last: ", options_.last_deposition));
    standing_by_ = standing_by.get();
    nothing.leadership = std::move(standing_by);
    core_ = std::make_unique<ServerCore>(core_options, &time_, std::move(nothing));
    listener_ = std::make_unique<Listener>(io_, core_.get(), &time_, options_, tls_);
    if (absl::Status s = listener_->Bind(); !s.ok()) return s;
    core_->Start();
    listener_->Start();
    thread_ = std::thread([this] { io_.run(); });
    return absl::OkStatus();
  }

  uint16_t tcp_port() const override { return listener_->tcp_port(); }
  void SetOwner(const std::string& owner) override {
    standing_by_->SetLeader(LeaderOfOwner(owner));
  }

 private:
  const ServerOptions options_;
  std::shared_ptr<net::TlsContext> tls_;
  asio::io_context io_{1};
  AsioTimeSource time_;
  StandingBy* standing_by_ = nullptr;  // the core's leadership
  std::unique_ptr<ServerCore> core_;
  std::unique_ptr<Listener> listener_;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StandbyFront>> StandbyFront::Start(
    const ServerOptions& options, std::shared_ptr<net::TlsContext> tls) {
  auto front = std::make_unique<Front>(options, std::move(tls));
  if (absl::Status s = front->Start(); !s.ok()) return s;
  return front;
}

}  // namespace fencelock::server
