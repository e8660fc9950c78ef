// Starts a real one-member etcd (Debian's etcd-server) for a test on free loopback ports, in a
// fresh data directory, and stops it when the object goes away.
#ifndef FENCELOCK_TESTS_SUPPORT_ETCD_PROCESS_H_
#define FENCELOCK_TESTS_SUPPORT_ETCD_PROCESS_H_

#include <string>
#include <utility>
#include <vector>

#include "lockd_process.h"
#include "process/process.h"

namespace fencelock::testing {

// The owner TTL the etcd tests give lockd, and its flag. A renewal has TTL x (1 - 0.30) -
// TTL / 3 to come back before lockd stops trusting its ownership: 0.73 s at 2 s, which a
// sanitizer build beside the test command's background compile once missed while starting
// (CI of stop 71: "ended before this lockd began to serve it"). 4 s there gives 1.47 s.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr int kOwnerTtlSeconds = 4;
#else
inline constexpr int kOwnerTtlSeconds = 2;
#endif
inline std::string OwnerTtlFlag() {
  return "--etcd-owner-ttl=" + std::to_string(kOwnerTtlSeconds) + "s";
}

class EtcdProcess {
 public:
  struct Options {
    // A directory of scripts/make-certs.sh DIR etcd root ...: etcd then speaks TLS on its
    // client port with DIR/etcd.{crt,key} and requires client certificates from DIR/ca.crt;
    // etcdctl here uses DIR/root.{crt,key} (etcd's root user, once its auth is enabled).
    // Empty: plaintext.
    std::string certs;
    // More of etcd's flags, e.g. "--quota-backend-bytes=4194304".
    std::vector<std::string> extra_args;
  };
  // Starts etcd and waits until it answers (aborts the test binary if it cannot within 30 s).
  explicit EtcdProcess(Options options = {});
  ~EtcdProcess();

  // The client endpoint, host:port.
  const std::string& endpoint() const { return endpoint_; }
  // Every key under `prefix`, in order (through etcdctl).
  std::vector<std::string> Keys(const std::string& prefix) const;
  // The value of `key` ("" if absent), through etcdctl.
  std::string Get(const std::string& key) const;
  // Every key and value under `prefix`, as etcdctl prints them: what a local user with
  // etcdctl reads.
  std::string Dump(const std::string& prefix) const;
  // Sets `key` to `value` (any bytes), through etcdctl; false if it failed.
  bool Put(const std::string& key, const std::string& value) const;
  // Deletes `key`, through etcdctl, as an operator (or an attacker) would; false if it failed.
  bool Delete(const std::string& key) const;
  // etcd's database size in bytes, as its status reports it.
  int64_t DbSize() const;
  // Runs etcdctl with `args` (a shell word list); whether it exited 0, and what it printed.
  std::pair<bool, std::string> Etcdctl(const std::string& args) const;

 private:
  Options options_;
  TempDir dir_;
  std::string endpoint_;
  process::Child child_;
};

}  // namespace fencelock::testing

#endif  // FENCELOCK_TESTS_SUPPORT_ETCD_PROCESS_H_
