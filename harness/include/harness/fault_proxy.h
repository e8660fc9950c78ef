// A userspace TCP proxy that sits between a client and lockd and misbehaves on command: it can
// delay the bytes of one direction, hold (stall) them and let them go later, drop them, or cut
// every connection. The kernel here has no netem; this is how the tests and the harness inject
// network faults. Dropped bytes leave the TCP stream out of step, so a run that drops ends the
// episode with CutAll(), as a real connection that lost its packets would time out.
//
// Thread-safe: the proxy runs on its own thread; the controls may be called from any thread.
#ifndef FENCELOCK_HARNESS_FAULT_PROXY_H_
#define FENCELOCK_HARNESS_FAULT_PROXY_H_

#include <cstdint>
#include <memory>

#include "absl/time/time.h"

namespace fencelock::harness {

class FaultProxy {
 public:
  enum class Mode {
    kPass,  // forward at once
    kHold,  // keep the bytes until Release()
    kDrop,  // discard the bytes
  };
  enum class Direction { kToServer, kToClient };

  // Listens on a free loopback port and forwards each accepted connection to
  // 127.0.0.1:`target_port`.
  explicit FaultProxy(int target_port);
  ~FaultProxy();

  int port() const;
  void Set(Direction direction, Mode mode);
  // In kPass, forwards each chunk read in `direction` `delay` after it was read, in order: a
  // latency (reading goes on meanwhile), not a throttle. Zero: none.
  void SetDelay(Direction direction, absl::Duration delay);
  // Forwards everything held in `direction`, in order, and switches it back to kPass.
  void Release(Direction direction);
  // Closes every proxied connection (both sides see a reset or EOF).
  void CutAll();
  // Bytes read from either side so far, whatever happened to them.
  uint64_t bytes_read(Direction direction) const;
  // Bytes currently held in `direction`.
  uint64_t bytes_held(Direction direction) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fencelock::harness

#endif  // FENCELOCK_HARNESS_FAULT_PROXY_H_
