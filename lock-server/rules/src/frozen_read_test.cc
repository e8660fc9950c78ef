// Reading the state as of one moment in slices (StateMachine::Freeze, the snapshot off the
// request path): whatever the rules apply between two slices, the reading visits exactly the
// sessions, holders and delays there were at the moment, each once, in order.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lock-server/lock_service.h"

namespace fencelock::server {
namespace {

MonoTime At(int64_t ms) { return MonoTime::FromNanos(ms * 1'000'000); }

std::string Delay(const char* kind, const std::optional<LockDelay>& d) {
  return d.has_value() ? absl::StrCat(" ", kind, ":", absl::FormatDuration(d->length)) : "";
}

// What a reading visits, one line each, in visiting order.
class Visits {
 public:
  StateMachine::FrozenSessionVisitor sessions() {
    return [this](SessionId id, const SessionState& s) {
      lines.push_back(absl::StrCat("s", id, " ", absl::FormatDuration(s.ttl), " ", s.owner));
    };
  }
  StateMachine::FrozenLockVisitor locks() {
    return [this](std::string_view lock, std::span<const HolderState> holders,
                  const std::optional<LockDelay>& all, const std::optional<LockDelay>& writers) {
      std::string line(lock);
      for (const HolderState& h : holders) {
        absl::StrAppend(&line, " ", h.token, "@s", h.session,
                        h.mode == LockMode::kShared ? "/shared" : "", "/",
                        absl::FormatDuration(h.ttl));
      }
      lines.push_back(line + Delay("all", all) + Delay("writers", writers));
    };
  }
  std::vector<std::string> lines;
};

// The whole of `state` read at once.
std::vector<std::string> ReadAll(const StateMachine& state) {
  Visits v;
  state.Freeze();
  EXPECT_TRUE(state.ReadFrozen(SIZE_MAX, v.sessions(), v.locks()));
  return v.lines;
}

// Random work on the rules: sessions open, close and expire, locks are taken (shared or not,
// some with a delay), released and lost, delays run out.
class Workload {
 public:
  explicit Workload(uint64_t seed)
      : rng_(seed),
        service_(ServiceOptions{.default_lock_delay = absl::ZeroDuration(),
                                .max_lock_delay = absl::Seconds(10)}) {}

  void Step() {
    now_ += Pick(0, 40);
    service_.Advance(At(now_));
    (void)service_.TakeWaiterOutcomes();
    const int what = Pick(0, 9);
    if (what <= 1 || sessions_.empty()) {
      auto s = service_.OpenSession(absl::Milliseconds(Pick(200, 2'000)), At(now_));
      if (s.ok()) sessions_.push_back(s->first);
      return;
    }
    const SessionId session = sessions_[Pick(0, sessions_.size() - 1)];
    if (service_.state().FindSession(session) == nullptr) return;
    if (what == 2) {
      (void)service_.CloseSession(session, At(now_));
      return;
    }
    const std::string lock = absl::StrCat("lock-", Pick(0, 24));
    if (what <= 6) {
      const AcquireMode how{Pick(0, 2) == 0 ? LockMode::kShared : LockMode::kExclusive,
                            Pick(0, 3) == 0 ? std::optional(absl::Milliseconds(Pick(1, 300)))
                                            : std::nullopt};
      (void)service_.Acquire(session, lock, absl::Milliseconds(Pick(50, 1'000)),
                             absl::ZeroDuration(), 0, At(now_), how);
      return;
    }
    if (const LockState* held = service_.state().FindLock(lock); held != nullptr) {
      if (const HolderState* h = held->FindSession(session); h != nullptr) {
        (void)service_.Release(session, lock, h->token, At(now_));
      }
    }
  }
  const StateMachine& state() const { return service_.state(); }

 private:
  int64_t Pick(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  std::mt19937_64 rng_;
  LockService service_;
  std::vector<SessionId> sessions_;
  int64_t now_ = 0;
};

TEST(FrozenReadTest, ASlicedReadingSeesTheMomentWhateverHappensBetweenSlices) {
  constexpr uint64_t kSeeds = 300;
  size_t copies = 0, lines = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    Workload work(seed);
    std::mt19937_64 rng(seed * 7919);
    for (int i = 0; i < 300; ++i) work.Step();
    const StateMachine moment = work.state();
    const std::vector<std::string> expected = ReadAll(moment);
    Visits read;
    work.state().Freeze();
    bool done = false;
    while (!done) {
      done = work.state().ReadFrozen(std::uniform_int_distribution<size_t>(1, 3)(rng),
                                     read.sessions(), read.locks());
      copies = std::max(copies, work.state().frozen_copies());
      for (int i = std::uniform_int_distribution<int>(0, 6)(rng); i > 0; --i) work.Step();
    }
    EXPECT_FALSE(work.state().frozen());
    ASSERT_EQ(read.lines, expected) << "seed " << seed;
    lines += expected.size();
  }
  // The run did what it is for: states of some size, and changes ahead of the reading.
  std::printf("frozen reads: %lu seeds, %zu lines read, at most %zu copies kept at once\n",
              static_cast<unsigned long>(kSeeds), lines, copies);
  EXPECT_GT(lines, kSeeds * 10);
  EXPECT_GT(copies, 5u);
}

TEST(FrozenReadTest, AReadingEndsWithNothingKeptAndANewOneReplacesAnOld) {
  Workload work(42);
  for (int i = 0; i < 200; ++i) work.Step();
  work.state().Freeze();
  Visits first;
  ASSERT_FALSE(work.state().ReadFrozen(1, first.sessions(), first.locks()));
  for (int i = 0; i < 50; ++i) work.Step();
  EXPECT_GT(work.state().frozen_copies(), 0u);
  const StateMachine moment = work.state();
  const std::vector<std::string> expected = ReadAll(moment);
  work.state().Freeze();  // replaces the one in progress
  EXPECT_EQ(work.state().frozen_copies(), 0u);
  Visits second;
  while (!work.state().ReadFrozen(2, second.sessions(), second.locks())) work.Step();
  EXPECT_EQ(second.lines, expected);
  EXPECT_EQ(work.state().frozen_copies(), 0u);
  work.state().Freeze();
  work.state().Thaw();
  EXPECT_FALSE(work.state().frozen());
  for (int i = 0; i < 50; ++i) work.Step();
  EXPECT_EQ(work.state().frozen_copies(), 0u);
}

}  // namespace
}  // namespace fencelock::server
