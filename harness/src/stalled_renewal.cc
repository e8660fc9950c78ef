#include "harness/stalled_renewal.h"

#include <thread>

namespace fencelock::harness {

absl::StatusOr<StalledRenewal> RenewThroughStall(FaultProxy& proxy, Client& client,
                                                 const LockHandle& lock, absl::Duration stall) {
  using Dir = FaultProxy::Direction;
  proxy.Set(Dir::kToClient, FaultProxy::Mode::kHold);
  const uint64_t upstream = proxy.bytes_read(Dir::kToServer);
  absl::Status renewed;
  std::thread heartbeat([&] { renewed = client.renewNow(); });
  while (proxy.bytes_read(Dir::kToServer) == upstream) absl::SleepFor(absl::Microseconds(200));
  StalledRenewal r;
  r.seen_by_proxy = Clock::Real()->Now();
  while (proxy.bytes_held(Dir::kToClient) == 0) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(stall);
  proxy.Release(Dir::kToClient);
  heartbeat.join();
  if (!renewed.ok()) return renewed;
  r.reply_at = Clock::Real()->Now();
  r.deadline = r.reply_at + client.remaining(lock);
  return r;
}

}  // namespace fencelock::harness
