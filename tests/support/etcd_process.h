// Starts a real one-member etcd (Debian's etcd-server) for a test on free loopback ports, in a
// fresh data directory, and stops it when the object goes away.
#ifndef FENCELOCK_TESTS_SUPPORT_ETCD_PROCESS_H_
#define FENCELOCK_TESTS_SUPPORT_ETCD_PROCESS_H_

#include <string>
#include <vector>

#include "lockd_process.h"
#include "process/process.h"

namespace fencelock::testing {

class EtcdProcess {
 public:
  // Starts etcd and waits until it answers (aborts the test binary if it cannot within 30 s).
  EtcdProcess();
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

 private:
  TempDir dir_;
  std::string endpoint_;
  process::Child child_;
};

}  // namespace fencelock::testing

#endif  // FENCELOCK_TESTS_SUPPORT_ETCD_PROCESS_H_
