#include <cinttypes>
#include <cstdio>

#include "lock-client/client.h"

int main(int argc, char** argv) {
  auto client = fencelock::Client::Create({.server = argc > 1 ? argv[1] : "127.0.0.1:7420"});
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  auto lock = (*client)->acquire("payout/42", absl::Seconds(5));  // waits up to 5 s
  if (!lock.ok()) return std::fprintf(stderr, "%s\n", lock.status().ToString().c_str()), 1;
  try {
    (*client)->checkStillHeld(*lock);  // local: throws LockLostException once it may be gone
    (*client)->beginIrreversibleStep(*lock, {"pay", absl::Seconds(2)});  // or StepRefusedException
    std::printf("paying payout/42 with token %" PRIu64 "\n", lock->token());  // the payee checks it
  } catch (const fencelock::LockLostException& lost) {
    std::fprintf(stderr, "not paid: %s\n", lost.what());
  }
  return (*client)->release(*lock).ok() ? 0 : 1;
}
