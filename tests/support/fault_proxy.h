// A userspace TCP proxy that sits between a client and lockd and misbehaves on command: it can
// hold (stall) the bytes of one direction and let them go later, drop them, or cut every
// connection. The kernel here has no netem; this is how tests inject network faults.
//
// Thread-safe: the proxy runs on its own thread; the controls may be called from any thread.
#ifndef FENCELOCK_TESTS_SUPPORT_FAULT_PROXY_H_
#define FENCELOCK_TESTS_SUPPORT_FAULT_PROXY_H_

#include <cstdint>
#include <memory>

namespace fencelock::testing {

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

}  // namespace fencelock::testing

#endif  // FENCELOCK_TESTS_SUPPORT_FAULT_PROXY_H_
