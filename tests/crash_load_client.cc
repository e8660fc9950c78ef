// A load client for the crash test: a separate process that acquires and releases locks on a
// lockd until lockd goes away, writing every acknowledged event to a log file as it happens:
//
//   G <lock> <token>     a grant the client saw
//   S <lock> <token>     a release about to be sent (its outcome may be lost in a crash)
//   R <lock> <token>     a release lockd acknowledged
//
// Some locks are kept (never released), so that a crash always leaves acknowledged holders.
//
//   crash_load_client --server=127.0.0.1:PORT --log=FILE --prefix=c7-client2 --seed=N
#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "lock-client/client.h"

ABSL_FLAG(std::string, server, "", "lockd address");
ABSL_FLAG(std::string, log, "", "event log to append to");
ABSL_FLAG(std::string, prefix, "", "lock name prefix for kept locks");
ABSL_FLAG(std::string, shared_prefix, "", "lock name prefix for contended locks");
ABSL_FLAG(uint32_t, seed, 1, "random seed");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  FILE* log = std::fopen(absl::GetFlag(FLAGS_log).c_str(), "a");
  if (log == nullptr) return 2;
  auto event = [&](char kind, const fencelock::LockHandle& h) {
    std::fprintf(log, "%c %s %lu\n", kind, h.lock().c_str(), static_cast<unsigned long>(h.token()));
    std::fflush(log);
  };
  fencelock::ClientOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  options.session_ttl = absl::Seconds(60);
  options.default_lock_ttl = absl::Seconds(60);
  options.request_timeout = absl::Seconds(2);
  options.connect_timeout = absl::Seconds(2);
  auto client = fencelock::Client::Create(options);
  if (!client.ok()) return 0;  // lockd already gone
  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  for (int i = 0;; ++i) {
    const bool keep = rng() % 3 == 0;
    const std::string name = keep ? absl::StrCat(absl::GetFlag(FLAGS_prefix), "-keep-", i)
                                  : absl::StrCat(absl::GetFlag(FLAGS_shared_prefix), "-", rng() % 4);
    auto h = (*client)->acquire(name, absl::Seconds(2));
    if (!h.ok()) {
      if (h.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
      break;  // lockd is gone
    }
    event('G', *h);
    if (keep) continue;
    event('S', *h);
    absl::Status released = (*client)->release(*h);
    if (!released.ok()) break;
    event('R', *h);
  }
  std::fclose(log);
  return 0;
}
