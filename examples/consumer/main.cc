// A worker's lock cycle through the installed fencelock package: connect, lock for a scope,
// check the lease, have a step the lease cannot cover refused, fence the resource with the
// token, and let the scope release the lock. It serves the client's counters on /metrics, as a
// service would for Prometheus (fencelock::metrics_http), and reads the page once itself.
//
//   consumer HOST:PORT
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "fence/fence.h"
#include "lock-client/client.h"
#include "metrics/exposer.h"

namespace {

// GET /metrics from 127.0.0.1:`port`, the whole answer (headers and page); empty on a failure.
std::string FetchMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char buffer[4096];
    for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) answer.append(buffer, n);
  }
  close(fd);
  return answer;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer HOST:PORT (lockd's address)\n");
    return 2;
  }
  auto client = fencelock::Client::Create({.server = argv[1], .client_name = "consumer"});
  if (!client.ok()) {
    std::fprintf(stderr, "consumer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  // The client's counters on /metrics, on a port the kernel picks (a service would pick its own).
  auto exposer = fencelock::metrics::Exposer::Start("127.0.0.1", 0, (*client)->metrics());
  if (!exposer.ok()) {
    std::fprintf(stderr, "consumer: metrics: %s\n", exposer.status().ToString().c_str());
    return 1;
  }
  auto fence = fencelock::fence::TokenFence::InMemory();
  uint64_t token = 0;
  {
    auto lock = (*client)->acquireScoped("consumer-example", absl::Seconds(5));
    if (!lock.ok()) {
      std::fprintf(stderr, "consumer: acquire: %s\n", lock.status().ToString().c_str());
      return 1;
    }
    lock->checkStillHeld();  // throws fencelock::LockLostException if the lease may be gone
    token = lock->token();
    // D4 across the library boundary: a step costlier than the lease left is refused with an
    // exception the consumer catches by its type.
    try {
      lock->beginIrreversibleStep(fencelock::StepCost{"a_day_long_step", absl::Hours(24)});
      std::fprintf(stderr, "consumer: a step longer than the lease was allowed\n");
      return 1;
    } catch (const fencelock::StepRefusedException& e) {
      std::printf("consumer: refused as it should be: %s\n", e.what());
    }
    if (absl::Status admitted = fence->Admit("the-resource", token); !admitted.ok()) {
      std::fprintf(stderr, "consumer: fence: %s\n", admitted.ToString().c_str());
      return 1;
    }
    std::printf("consumer: held %s with token %llu, %s of lease left\n", lock->lock().c_str(),
                static_cast<unsigned long long>(token), absl::FormatDuration(lock->remaining()).c_str());
  }  // the ScopedLock releases the lock here
  // A stale token (here: one below the highest admitted) is refused by the fence.
  if (fence->Admit("the-resource", token - 1).ok()) {
    std::fprintf(stderr, "consumer: the fence admitted a stale token\n");
    return 1;
  }
  std::printf("consumer: released; the fence refuses token %llu\n",
              static_cast<unsigned long long>(token - 1));
  // The step refused above is counted, and Prometheus would read it from this page.
  const std::string page = FetchMetrics((*exposer)->port());
  if (page.find("lock_steps_abandoned_total") == std::string::npos) {
    std::fprintf(stderr, "consumer: /metrics does not show the client's counters:\n%s\n",
                 page.c_str());
    return 1;
  }
  std::printf("consumer: /metrics on port %d shows the client's counters\n", (*exposer)->port());
  return 0;
}
