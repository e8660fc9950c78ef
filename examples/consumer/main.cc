// A worker's lock cycle through the installed fencelock package: connect, lock for a scope,
// check the lease, have a step the lease cannot cover refused, fence the resource with the
// token, and let the scope release the lock.
//
//   consumer HOST:PORT
#include <cstdio>

#include "fence/fence.h"
#include "lock-client/client.h"

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
  return 0;
}
