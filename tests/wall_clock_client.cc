// Holds one lock through the client library for a while and reports how often the client
// heart-beat: run under faketime by wall_clock_test, with the wall clock an hour off, to show that
// the client's waits do not depend on the wall clock.
//
//   wall_clock_client --server=127.0.0.1:PORT [--hold=6s] [--ttl=2s]
//
// Prints "held 6s heartbeats N failures M" and exits 0 if the lock was held throughout; exits 1
// (naming the reason) if checkStillHeld ever said it was lost.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lock-client/client.h"

ABSL_FLAG(std::string, server, "127.0.0.1:7420", "lockd address");
ABSL_FLAG(absl::Duration, hold, absl::Seconds(6), "how long to hold the lock");
ABSL_FLAG(absl::Duration, ttl, absl::Seconds(2), "session and lock TTL");

namespace {

// The value of the metric `name` (no labels) in a Prometheus text exposition, or -1.
double Metric(const std::string& exposition, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.substr(0, name.size() + 1) != name + " ") continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(name.size() + 1), &v)) return v;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  fencelock::ClientOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  options.session_ttl = absl::GetFlag(FLAGS_ttl);
  options.default_lock_ttl = absl::GetFlag(FLAGS_ttl);
  options.request_timeout = absl::Seconds(1);
  auto client = fencelock::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "wall_clock_client: %s\n", client.status().ToString().c_str());
    return 2;
  }
  auto lock = (*client)->acquire("wall-clock", absl::Seconds(5));
  if (!lock.ok()) {
    std::fprintf(stderr, "wall_clock_client: acquire: %s\n", lock.status().ToString().c_str());
    return 2;
  }
  const auto until = std::chrono::steady_clock::now() +
                     absl::ToChronoNanoseconds(absl::GetFlag(FLAGS_hold));
  while (std::chrono::steady_clock::now() < until) {
    try {
      (*client)->checkStillHeld(*lock);
    } catch (const fencelock::LockLostException& e) {
      std::printf("lost: %s\n", e.what());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string exposition = (*client)->metrics()->TextExposition();
  std::printf("held %s heartbeats %.0f failures %.0f\n",
              absl::FormatDuration(absl::GetFlag(FLAGS_hold)).c_str(),
              Metric(exposition, "lock_heartbeat_rtt_seconds_count"),
              Metric(exposition, "lock_heartbeat_failures_total"));
  (void)(*client)->release(*lock);
  return 0;
}
