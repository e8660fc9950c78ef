// Cost of the local checkStillHeld (ADR-006 D3) and of beginIrreversibleStep's allowed path,
// on a real client holding a real lock (a lockd process is started for it).
//
//   check_still_held_bench --lockd=build/lock-server/lockd
//
// Reports ns per call and heap allocations per call (the counter "allocs/call"; the target
// is 0).
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <new>

#include "benchmark/benchmark.h"
#include "lock-client/client.h"
#include "logging/logging.h"
#include "testing/local_lockd.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
}  // namespace

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

std::unique_ptr<fencelock::Client> g_client;
fencelock::LockHandle g_lock;

void BM_CheckStillHeldLocal(benchmark::State& state) {
  g_allocations = 0;
  g_counting = true;
  for (auto _ : state) g_client->checkStillHeld(g_lock);
  g_counting = false;
  state.counters["allocs/call"] = benchmark::Counter(
      static_cast<double>(g_allocations.load()) / static_cast<double>(state.iterations()));
}
BENCHMARK(BM_CheckStillHeldLocal);

void BM_BeginIrreversibleStepAllowed(benchmark::State& state) {
  const fencelock::StepCost step = fencelock::StepCost::RailSubmit(absl::Seconds(1));
  g_allocations = 0;
  g_counting = true;
  for (auto _ : state) g_client->beginIrreversibleStep(g_lock, step);
  g_counting = false;
  state.counters["allocs/call"] = benchmark::Counter(
      static_cast<double>(g_allocations.load()) / static_cast<double>(state.iterations()));
}
BENCHMARK(BM_BeginIrreversibleStepAllowed);

void BM_CheckStillHeldConfirmWithServer(benchmark::State& state) {
  for (auto _ : state) g_client->checkStillHeld(g_lock, fencelock::Confirm::kWithServer);
}
BENCHMARK(BM_CheckStillHeldConfirmWithServer)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("check_still_held_bench");
  std::string lockd;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]).rfind("--lockd=", 0) == 0) {
      lockd = argv[i] + 8;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (lockd.empty()) {
    std::fprintf(stderr, "usage: check_still_held_bench --lockd=PATH [benchmark flags]\n");
    return 2;
  }
  const std::string work = std::filesystem::temp_directory_path() /
                           ("fencelock-csh-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(work);
  // lockd as a child process (stopped when it goes out of scope, killed if this one dies).
  auto server = fencelock::testing::LocalLockd::Start(
      {.binary = lockd, .dir = work, .init_args = {"--wal-segment-bytes=1048576"}});
  if (!server.ok()) {
    fencelock::logging::Program().Error(server.status().ToString());
    return 1;
  }
  fencelock::ClientOptions options;
  options.server = (*server)->address();
  auto client = fencelock::Client::Create(options);
  if (!client.ok()) return 1;
  g_client = std::move(*client);
  auto lock = g_client->acquire("bench", absl::Seconds(5));
  if (!lock.ok()) return 1;
  g_lock = *lock;

  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_lock = fencelock::LockHandle();
  g_client.reset();
  server->reset();
  std::filesystem::remove_all(work);
  return 0;
}
