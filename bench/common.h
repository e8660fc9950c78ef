// What fencelock-bench's workloads share: the clock, percentiles, a JSON fragment for them, and
// the closed-loop driver that every lock-cycle system (fencelock, Redis, etcd) runs under.
#ifndef FENCELOCK_BENCH_COMMON_H_
#define FENCELOCK_BENCH_COMMON_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clock/clock.h"

namespace fencelock::bench {

inline MonoTime Now() { return Clock::Real()->Now(); }
inline int64_t NanosSince(MonoTime start) { return (Now() - start) / absl::Nanoseconds(1); }

struct Percentiles {
  size_t samples = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;  // milliseconds
};

Percentiles Summarize(std::vector<int64_t> ns);
std::string Json(const Percentiles& p);
// "%.3f" of a figure in milliseconds.
std::string Ms(double ms);

// One client of a lock-cycle system: Cycle() takes the lock, gives it back, and says how long
// the taking took (nanoseconds). An error ends that client's run and is counted.
class Cycler {
 public:
  virtual ~Cycler() = default;
  virtual absl::StatusOr<int64_t> Cycle() = 0;
};
// Makes client number `client` (0-based): connects, opens a session, whatever the system needs
// before its first cycle. Not timed.
using CyclerFactory = std::function<absl::StatusOr<std::unique_ptr<Cycler>>(int client)>;

struct CycleResult {
  double cycles_per_second = 0;
  std::vector<int64_t> acquire_ns;  // every cycle's acquire
  size_t errors = 0;
  std::string first_error;
};

// `clients` threads in a closed loop, each cycling as fast as its system answers, for
// `seconds` after all of them are set up. Progress (and the result) go to stderr under `label`.
CycleResult RunCycles(const CyclerFactory& make, int clients, double seconds,
                      const std::string& label);

// A line on stderr that a terminal sees rewritten in place and a log sees once every 5 s.
void Progress(const std::string& line, double elapsed_seconds);
void EndProgress();

}  // namespace fencelock::bench

#endif  // FENCELOCK_BENCH_COMMON_H_
