// The keys of lockd's state under an etcd prefix (lock-server/etcd_commit_log.h lists them),
// and the request pieces the etcd log and its ownership build transactions from.
#ifndef FENCELOCK_LOCK_SERVER_ETCD_KEYS_H_
#define FENCELOCK_LOCK_SERVER_ETCD_KEYS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
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
  // Whether `key` is one lockd writes under this prefix. Everything else under P/ is someone
  // else's: a nested prefix's state (init and serve refuse those) or keys put there by hand.
  bool IsOwn(const std::string& key) const {
    for (const std::string& k : {format(), sequences(), owner(), owner_lease(), term(), head()}) {
      if (key == k) return true;
    }
    return key.starts_with(log_dir()) || key.starts_with(snapshots());
  }
  std::string prefix;
};

// The prefixes that contain `prefix`, shortest first: "/a" and "/a/b" for "/a/b/c". Their
// ranges hold `prefix`'s keys, so none of them may hold a lockd state beside it.
inline std::vector<std::string> Ancestors(const std::string& prefix) {
  std::vector<std::string> out;
  for (size_t i = 1; i < prefix.size(); ++i) {
    if (prefix[i] == '/') out.push_back(prefix.substr(0, i));
  }
  return out;
}

// Whether `key`, a key under `prefix`/, is the format key of a lockd state nested inside it
// ("/a/b/format" under "/a"). None of lockd's own keys ends in "/format" but P/format.
inline bool IsNestedFormat(const std::string& prefix, const std::string& key) {
  static constexpr std::string_view kFormat = "/format";
  return key.size() > prefix.size() + 1 + kFormat.size() && key.starts_with(prefix + "/") &&
         key.ends_with(kFormat);
}
// The prefix whose format key `key` is.
inline std::string StateOf(const std::string& format_key) {
  return format_key.substr(0, format_key.size() - std::string_view("/format").size());
}

// Why `outer` and `inner` (inside it) cannot both hold a lockd state.
inline std::string Nested(const std::string& outer, const std::string& inner) {
  return absl::StrCat("etcd prefix ", inner, " lies inside etcd prefix ", outer,
                      " and both would hold a lockd state: ", outer,
                      "'s keys include every key of ", inner,
                      ", so destroying one would delete the other's; use prefixes that do not "
                      "nest");
}

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

// No key in [key, end) exists (etcd compares every key of a range; an empty range compares as
// one absent key).
inline etcdserverpb::Compare NothingIn(const std::string& key, const std::string& end) {
  etcdserverpb::Compare c = NotPresent(key);
  c.set_range_end(end);
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
