// EtcdCalls over a blocking EtcdClient (lock-server/etcd_store.h): threads that carry calls
// and nothing else. The etcd log's logic stays on its owner's thread; a worker only runs the
// blocking call and posts the task it returned back there.
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lock-server/etcd_store.h"

namespace fencelock::server {
namespace {

// At most this many calls run at once: the log has a transaction, a renewal, a read of its
// owner key, a member status and a compaction in flight at most.
constexpr size_t kMaxWorkers = 8;

// Whether answers may still be delivered: read and cleared on the owner's thread only.
struct Alive {
  bool alive = true;
};

class WatchThread final : public EtcdWatching {
 public:
  WatchThread(EtcdClient* client, TimeSource* owner, std::shared_ptr<Alive> alive,
              std::string key, int64_t from, EtcdCalls::WatchReport report)
      : owner_(owner), alive_(std::move(alive)), report_(std::move(report)) {
    thread_ = std::thread([this, client, key = std::move(key), from] { Run(client, key, from); });
  }
  ~WatchThread() override {
    // Reports already posted are dropped with this object: the owner checks `stopped`.
    *stopped_ = true;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (watch_ != nullptr) watch_->Cancel();
    }
    thread_.join();
  }

 private:
  void Run(EtcdClient* client, const std::string& key, int64_t from) {
    auto watch = client->Watch(key, from);
    if (!watch.ok()) {
      Report(watch.status());
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      watch_ = watch->get();
    }
    for (;;) {
      auto changes = (*watch)->Next();
      const bool ok = changes.ok();
      Report(std::move(changes));
      if (!ok) break;
    }
    absl::MutexLock lock(&mu_);
    watch_ = nullptr;
  }
  void Report(absl::StatusOr<EtcdWatch::Changes> changes) {
    owner_->Post([alive = alive_, stopped = stopped_, report = report_,
                  changes = std::move(changes)]() mutable {
      if (alive->alive && !*stopped) report(std::move(changes));
    });
  }

  TimeSource* const owner_;
  const std::shared_ptr<Alive> alive_;
  const EtcdCalls::WatchReport report_;
  // Set on the owner's thread when the watch is stopped; read there by posted reports.
  const std::shared_ptr<bool> stopped_ = std::make_shared<bool>(false);
  absl::Mutex mu_;
  EtcdWatch* watch_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class ThreadedEtcdCalls final : public EtcdCalls {
 public:
  ThreadedEtcdCalls(std::unique_ptr<EtcdClient> client, TimeSource* owner)
      : client_(std::move(client)), owner_(owner) {}
  ~ThreadedEtcdCalls() override {
    alive_->alive = false;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }

  void Submit(Call call) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back(std::move(call));
    if (idle_ == 0 && workers_.size() < kMaxWorkers) {
      workers_.emplace_back([this] { Work(); });
    }
  }

  std::unique_ptr<EtcdWatching> Watch(std::string key, int64_t start_revision,
                                      WatchReport report) override {
    return std::make_unique<WatchThread>(client_.get(), owner_, alive_, std::move(key),
                                         start_revision, std::move(report));
  }

  const std::vector<std::string>& endpoints() const override { return client_->endpoints(); }

 private:
  void Work() {
    for (;;) {
      Call call;
      {
        absl::MutexLock lock(&mu_);
        ++idle_;
        mu_.Await(absl::Condition(this, &ThreadedEtcdCalls::WorkOrStopLocked));
        --idle_;
        if (calls_.empty()) return;  // stopping, and every queued call has run
        call = std::move(calls_.front());
        calls_.pop_front();
      }
      std::function<void()> answer = call(*client_);
      owner_->Post([alive = alive_, answer = std::move(answer)] {
        if (alive->alive) answer();
      });
    }
  }

  bool WorkOrStopLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !calls_.empty();
  }

  const std::unique_ptr<EtcdClient> client_;
  TimeSource* const owner_;
  const std::shared_ptr<Alive> alive_ = std::make_shared<Alive>();
  absl::Mutex mu_;
  std::deque<Call> calls_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // the owner's thread only (Submit, the destructor)
};

}  // namespace

std::unique_ptr<EtcdCalls> CallOnThreads(std::unique_ptr<EtcdClient> client, TimeSource* owner) {
  return std::make_unique<ThreadedEtcdCalls>(std::move(client), owner);
}

}  // namespace fencelock::server
