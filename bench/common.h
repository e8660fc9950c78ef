// What fencelock-bench's workloads share: the clock, percentiles and their JSON, and
// the closed-loop driver that every lock-cycle system (fencelock, Redis, etcd) runs under.
#ifndef FENCELOCK_BENCH_COMMON_H_
#define FENCELOCK_BENCH_COMMON_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clock/clock.h"
#include "nlohmann/json.hpp"

namespace fencelock::bench {

// results.json: members in the order the workloads add them.
using Json = nlohmann::ordered_json;

inline MonoTime Now() { return Clock::Real()->Now(); }
inline int64_t NanosSince(MonoTime start) { return (Now() - start) / absl::Nanoseconds(1); }

struct Percentiles {
  size_t samples = 0;
  double p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;  // milliseconds
};

Percentiles Summarize(std::vector<int64_t> ns);
// The median of `values` (0 if there are none).
double Median(std::vector<double> values);
Json ToJson(const Percentiles& p);
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

// The CPU time (user + system) this process has used so far.
double ProcessCpuSeconds();

struct CycleResult {
  double cycles_per_second = 0;
  std::vector<int64_t> acquire_ns;  // every cycle's acquire
  double process_cpu_seconds = 0;   // the whole process's CPU while the cycles were counted
  size_t errors = 0;
  std::string first_error;
};

// `clients` threads in a closed loop, each cycling as fast as its system answers, for
// `seconds` after all of them are set up. Progress (and the result) go to stderr under `label`.
CycleResult RunCycles(const CyclerFactory& make, int clients, double seconds,
                      const std::string& label);

// One connection of the one-thread lock-cycle driver: a state machine over a non-blocking
// socket that the driver reads and writes for it. One thread drives every connection of a run,
// as redis-benchmark does, so the figure is what the server takes, not what a thread per client
// costs the client side of a 2-core machine.
class StreamCycler {
 public:
  virtual ~StreamCycler() = default;
  // The connected socket (the cycler owns it); the driver makes it non-blocking.
  virtual int fd() const = 0;
  // Appends to `out` the first cycle's first request.
  virtual void Begin(std::string* out) = 0;
  // Takes bytes read from the socket and appends to `out` what to send next. Each cycle whose
  // lock was granted adds its acquire time (nanoseconds) to `acquire_ns`. Once `stop` is set it
  // starts no further cycle, gives back what it holds, and returns true when nothing of its is
  // in flight any more. An error ends the connection's run and is counted.
  virtual absl::StatusOr<bool> Feed(std::string_view in, bool stop, std::string* out,
                                    std::vector<int64_t>* acquire_ns) = 0;
};
using StreamCyclerFactory = std::function<absl::StatusOr<std::unique_ptr<StreamCycler>>(int client)>;

// `clients` connections in a closed loop, each cycling as fast as its system answers, all
// driven by the calling thread through one epoll set, for `seconds`; reported as RunCycles does.
CycleResult RunStreamCycles(const StreamCyclerFactory& make, int clients, double seconds,
                            const std::string& label);

// A line on stderr that a terminal sees rewritten in place and a log sees once every 5 s.
void Progress(const std::string& line, double elapsed_seconds);
void EndProgress();

}  // namespace fencelock::bench

#endif  // FENCELOCK_BENCH_COMMON_H_
