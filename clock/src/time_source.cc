#include "clock/time_source.h"

#include <cstdio>
#include <cstdlib>

namespace fencelock {

class ManualTimeSource::ManualTimer final : public Timer {
 public:
  explicit ManualTimer(ManualTimeSource* source) : source_(source) {}
  ~ManualTimer() override { Cancel(); }

  void ArmAt(MonoTime when, std::function<void()> fire) override {
    Cancel();
    armed_ = true;
    key_ = source_->Schedule(when, [this, fire = std::move(fire)] {
      armed_ = false;
      fire();
    });
  }
  void Cancel() override {
    if (!armed_) return;
    armed_ = false;
    source_->Unschedule(key_);
  }
  MonoTime armed_for() const override { return armed_ ? key_.first : MonoTime::Max(); }

 private:
  ManualTimeSource* const source_;
  bool armed_ = false;
  Key key_;
};

std::unique_ptr<Timer> ManualTimeSource::NewTimer() { return std::make_unique<ManualTimer>(this); }

void ManualTimeSource::Post(std::function<void()> task) { Schedule(now_, std::move(task)); }

ManualTimeSource::Key ManualTimeSource::Schedule(MonoTime when, std::function<void()> fn) {
  const Key key{when, next_seq_++};
  queue_.emplace(key, std::move(fn));
  return key;
}

void ManualTimeSource::Unschedule(const Key& key) { queue_.erase(key); }

MonoTime ManualTimeSource::NextEventAt() const {
  return queue_.empty() ? MonoTime::Max() : queue_.begin()->first.first;
}

void ManualTimeSource::RunDue() { AdvanceTo(now_); }

void ManualTimeSource::Freeze(absl::Duration d) {
  if (d < absl::ZeroDuration()) {
    std::fprintf(stderr, "ManualTimeSource::Freeze: negative step\n");
    std::abort();
  }
  now_ = now_ + d;
}

void ManualTimeSource::Busy(absl::Duration d) {
  Freeze(d);
  run_time_ += d;
}

int ManualTimeSource::AdvanceTo(MonoTime t) {
  if (t < now_) {
    std::fprintf(stderr, "ManualTimeSource::AdvanceTo: time would go backwards\n");
    std::abort();
  }
  int ran = 0;
  while (!queue_.empty() && queue_.begin()->first.first <= t) {
    auto node = queue_.extract(queue_.begin());
    if (node.key().first > now_) now_ = node.key().first;
    node.mapped()();
    ++ran;
  }
  now_ = t;
  return ran;
}

}  // namespace fencelock
