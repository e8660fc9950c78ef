// The keys of lockd's state under an etcd prefix (lock-server/etcd_commit_log.h lists them),
// and the request pieces the etcd log and its ownership build transactions from.
#ifndef FENCELOCK_LOCK_SERVER_ETCD_KEYS_H_
#define FENCELOCK_LOCK_SERVER_ETCD_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "etcd/etcd_kv.pb.h"

namespace fencelock::server::etcd_keys {

inline std::string Lsn(uint64_t lsn) { return absl::StrFormat("%020u", lsn); }

// The key just past every key that starts with `prefix` (not empty).
inline std::string PrefixEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

struct Keys {
  explicit Keys(const std::string& p) : prefix(p) {}
  std::string format() const { return prefix + "/format"; }
  std::string sequences() const { return prefix + "/sequences"; }
  std::string owner() const { return prefix + "/owner"; }
  std::string owner_lease() const { return prefix + "/owner-lease"; }
  std::string term() const { return prefix + "/term"; }
  std::string head() const { return prefix + "/snapshot-head"; }
  std::string log_dir() const { return prefix + "/log/"; }
  std::string log(uint64_t last_lsn) const { return log_dir() + Lsn(last_lsn); }
  std::string snapshots() const { return prefix + "/snapshot/"; }
  std::string chunk_dir(uint64_t lsn) const { return snapshots() + Lsn(lsn) + "/"; }
  std::string chunk(uint64_t lsn, uint64_t i) const {
    return chunk_dir(lsn) + absl::StrFormat("%06u", i);
  }
  std::string prefix;
};

inline etcdserverpb::RequestOp Put(const std::string& key, std::string value, int64_t lease = 0) {
  etcdserverpb::RequestOp op;
  auto* put = op.mutable_request_put();
  put->set_key(key);
  put->set_value(std::move(value));
  put->set_lease(lease);
  return op;
}

inline etcdserverpb::RequestOp DeleteRange(const std::string& key, const std::string& end) {
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  op.mutable_request_delete_range()->set_range_end(end);
  return op;
}

inline etcdserverpb::Compare NotPresent(const std::string& key) {
  etcdserverpb::Compare c;
  c.set_key(key);
  c.set_target(etcdserverpb::Compare::VERSION);
  c.set_result(etcdserverpb::Compare::EQUAL);
  c.set_version(0);
  return c;
}

// `key` still has the creation revision `revision`: it was not deleted (and made again) since.
inline etcdserverpb::Compare CreatedAt(const std::string& key, int64_t revision) {
  etcdserverpb::Compare c;
  c.set_key(key);
  c.set_target(etcdserverpb::Compare::CREATE);
  c.set_result(etcdserverpb::Compare::EQUAL);
  c.set_create_revision(revision);
  return c;
}

}  // namespace fencelock::server::etcd_keys

#endif  // FENCELOCK_LOCK_SERVER_ETCD_KEYS_H_
