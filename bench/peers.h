// The peers fencelock-bench measures beside lockd, each started here on loopback from Debian's
// package, with its data under the run's folder (the disk lockd's state is on), and stopped
// with its object. Each is driven with its own protocol: Redis with hiredis, etcd with its v3
// gRPC API (lockd's own etcd client).
#ifndef FENCELOCK_BENCH_PEERS_H_
#define FENCELOCK_BENCH_PEERS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common.h"
#include "process/process.h"

namespace fencelock::payout {
class EtcdCluster;
}

namespace fencelock::bench {

// Redis 7. A cycle is SET key value NX PX 30000, then a compare-and-delete script (EVALSHA)
// that deletes the key only if it still holds that value. With `token`, the cycle first takes
// a fencing token from INCR on a counter key and uses it as the value.
class RedisPeer {
 public:
  enum class Persistence {
    kAppendFsyncAlways,  // appendonly yes, appendfsync always: every write fsynced before it
                         // is answered
    kNone,               // appendonly no, save "": nothing reaches the disk
  };
  static absl::StatusOr<std::unique_ptr<RedisPeer>> Start(const std::string& binary,
                                                          const std::string& dir,
                                                          Persistence persistence);
  ~RedisPeer();

  CyclerFactory Cyclers(bool token) const;
  // The same cycle (without the INCR token) on the one-thread driver.
  StreamCyclerFactory StreamCyclers(bool pipelined) const;
  const std::string& version() const { return version_; }

 private:
  RedisPeer() = default;
  process::Child child_;
  int port_ = 0;
  std::string version_;
};

// etcd 3.4, one member. A cycle is etcd's concurrency recipe for a mutex: the client's session
// is a lease (granted once per client, 30 s), the lock is a transaction that creates the key
// with that lease if it does not exist (create_revision == 0), whose revision is the fencing
// token, and the release deletes the key.
class EtcdPeer {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdPeer>> Start(const std::string& binary,
                                                         const std::string& dir);
  ~EtcdPeer();

  CyclerFactory Cyclers() const;
  const std::string& version() const { return version_; }
  // The client endpoint, host:port.
  const std::string& endpoint() const { return endpoint_; }

 private:
  EtcdPeer() = default;
  std::unique_ptr<payout::EtcdCluster> cluster_;
  std::string endpoint_;
  std::string version_;
};

}  // namespace fencelock::bench

#endif  // FENCELOCK_BENCH_PEERS_H_
