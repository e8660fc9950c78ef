#include "sim/sim_etcd.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"

namespace fencelock::sim {

using etcdserverpb::Compare;
using etcdserverpb::Event;
using etcdserverpb::KeyValue;
using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;
using etcdserverpb::RequestOp;
using etcdserverpb::ResponseOp;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;

namespace {

constexpr uint64_t kMemberId = 1;

// Whether `key` is in the range etcd's (key, range_end) names: one key for an empty end, every
// key from `from` on for "\0", else [from, end).
bool InRange(const std::string& key, const std::string& from, const std::string& end) {
  if (end.empty()) return key == from;
  if (end == std::string(1, '\0')) return key >= from;
  return key >= from && key < end;
}

}  // namespace

struct SimEtcd::Core {
  explicit Core(Clock* c) : clock(c) {}

  struct Lease {
    int64_t ttl_seconds = 0;
    MonoTime expires_at;
    std::set<std::string> keys;
  };

  Clock* const clock;
  mutable std::mutex mu;
  std::condition_variable changed;  // every revision, every fault
  std::map<std::string, KeyValue> kvs;
  std::vector<Event> history;       // every change since `compacted`, in revision order
  int64_t revision = 1;             // etcd's first revision
  int64_t compacted = 0;
  std::map<int64_t, Lease> leases;
  int64_t next_lease = 0x1000;
  bool unavailable = false;
  std::set<std::string> partitioned;  // clients cut off
  uint64_t outage = 0;              // bumped at each fault, so that open watches break
  int lose_replies = 0;
  bool no_space = false;
  std::function<void(const Event*)> observer;

  // Every change and fault: blocked watches wake, and the observer hears of it.
  void NotifyLocked(const Event* e) {
    changed.notify_all();
    if (observer) observer(e);
  }

  absl::Status Available(const std::string& client) const {
    if (unavailable) return absl::UnavailableError("sim etcd: no leader (etcdserver: request timed out)");
    if (partitioned.contains(client)) {
      return absl::UnavailableError(absl::StrCat("sim etcd: ", client, " is cut off from etcd"));
    }
    return absl::OkStatus();
  }

  void Header(etcdserverpb::ResponseHeader* h) const {
    h->set_cluster_id(1);
    h->set_member_id(kMemberId);
    h->set_revision(revision);
    h->set_raft_term(1);
  }

  // Deletes `key` at revision `rev` (already counted).
  void DeleteKeyLocked(const std::string& key, int64_t rev) {
    auto it = kvs.find(key);
    if (it == kvs.end()) return;
    if (it->second.lease() != 0) {
      auto l = leases.find(it->second.lease());
      if (l != leases.end()) l->second.keys.erase(key);
    }
    Event e;
    e.set_type(Event::DELETE);
    e.mutable_kv()->set_key(key);
    e.mutable_kv()->set_mod_revision(rev);
    history.push_back(std::move(e));
    kvs.erase(it);
    if (observer) observer(&history.back());
  }

  void PutKeyLocked(const std::string& key, const std::string& value, int64_t lease, int64_t rev) {
    KeyValue& kv = kvs[key];
    if (kv.create_revision() == 0) {
      kv.set_key(key);
      kv.set_create_revision(rev);
    }
    if (kv.lease() != 0 && kv.lease() != lease) {
      auto l = leases.find(kv.lease());
      if (l != leases.end()) l->second.keys.erase(key);
    }
    kv.set_mod_revision(rev);
    kv.set_version(kv.version() + 1);
    kv.set_value(value);
    kv.set_lease(lease);
    if (lease != 0) leases[lease].keys.insert(key);
    Event e;
    e.set_type(Event::PUT);
    *e.mutable_kv() = kv;
    history.push_back(std::move(e));
    if (observer) observer(&history.back());
  }

  // Drops the leases the clock says have expired, and their keys (one revision per lease).
  void ExpireLocked() {
    const MonoTime now = clock->Now();
    for (auto it = leases.begin(); it != leases.end();) {
      if (it->second.expires_at > now) {
        ++it;
        continue;
      }
      RevokeLocked(it->second.keys);
      it = leases.erase(it);
    }
  }

  void RevokeLocked(const std::set<std::string>& keys) {
    if (keys.empty()) return;
    const int64_t rev = ++revision;
    const std::set<std::string> doomed = keys;
    for (const std::string& k : doomed) DeleteKeyLocked(k, rev);
    NotifyLocked(nullptr);
  }

  // As etcd: a compare on a range holds if it holds for every key in it; an empty range
  // compares as one absent key (and never by value).
  bool Matches(const Compare& c) const {
    if (c.range_end().empty()) {
      auto it = kvs.find(c.key());
      return MatchesKv(c, it == kvs.end() ? KeyValue() : it->second);
    }
    bool any = false;
    for (auto it = kvs.lower_bound(c.key());
         it != kvs.end() && InRange(it->first, c.key(), c.range_end()); ++it) {
      any = true;
      if (!MatchesKv(c, it->second)) return false;
    }
    if (any) return true;
    return c.target() != Compare::VALUE && MatchesKv(c, KeyValue());
  }

  static bool MatchesKv(const Compare& c, const KeyValue& kv) {
    int cmp = 0;
    auto order = [](auto a, auto b) { return a < b ? -1 : a > b ? 1 : 0; };
    switch (c.target()) {
      case Compare::VERSION: cmp = order(kv.version(), c.version()); break;
      case Compare::CREATE: cmp = order(kv.create_revision(), c.create_revision()); break;
      case Compare::MOD: cmp = order(kv.mod_revision(), c.mod_revision()); break;
      case Compare::VALUE: cmp = order(kv.value(), c.value()); break;
      case Compare::LEASE: cmp = order(kv.lease(), c.lease()); break;
      default: return false;
    }
    switch (c.result()) {
      case Compare::EQUAL: return cmp == 0;
      case Compare::GREATER: return cmp > 0;
      case Compare::LESS: return cmp < 0;
      case Compare::NOT_EQUAL: return cmp != 0;
      default: return false;
    }
  }

  absl::StatusOr<RangeResponse> RangeLocked(const RangeRequest& r) const {
    if (r.revision() != 0 && r.revision() != revision) {
      if (r.revision() < compacted) {
        return absl::OutOfRangeError("etcdserver: mvcc: required revision has been compacted");
      }
      return absl::UnimplementedError("sim etcd keeps no history for reads at a past revision");
    }
    if (r.sort_order() == RangeRequest::DESCEND || r.sort_target() != RangeRequest::KEY) {
      return absl::UnimplementedError("sim etcd sorts by key, ascending, only");
    }
    RangeResponse out;
    Header(out.mutable_header());
    int64_t count = 0;
    for (auto it = kvs.lower_bound(r.key()); it != kvs.end(); ++it) {
      if (!InRange(it->first, r.key(), r.range_end())) {
        if (r.range_end().empty() || it->first >= r.range_end()) break;
        continue;
      }
      ++count;
      if (r.count_only()) continue;
      if (r.limit() > 0 && out.kvs_size() >= r.limit()) {
        out.set_more(true);
        continue;
      }
      KeyValue* kv = out.add_kvs();
      *kv = it->second;
      if (r.keys_only()) kv->clear_value();
    }
    out.set_count(count);
    return out;
  }
};

namespace {

class SimWatch final : public server::EtcdWatch {
 public:
  SimWatch(std::shared_ptr<SimEtcd::Core> core, std::string client, std::string key,
           int64_t start, uint64_t outage)
      : core_(std::move(core)),
        client_(std::move(client)),
        key_(std::move(key)),
        next_(start),
        outage_(outage) {}

  absl::StatusOr<Changes> Next() override {
    std::unique_lock<std::mutex> lock(core_->mu);
    for (;;) {
      auto changes = PollLocked();
      if (!changes.ok()) return changes.status();
      if (changes->has_value()) return std::move(**changes);
      core_->changed.wait(lock);
    }
  }

  absl::StatusOr<std::optional<Changes>> Poll() override {
    std::lock_guard<std::mutex> lock(core_->mu);
    return PollLocked();
  }

  void Cancel() override {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      cancelled_ = true;
    }
    core_->changed.notify_all();
  }

 private:
  absl::StatusOr<std::optional<Changes>> PollLocked() {
    if (cancelled_) return absl::CancelledError("watch cancelled");
    if (core_->outage != outage_ || !core_->Available(client_).ok()) {
      return absl::UnavailableError("sim etcd: the watch stream broke (no leader)");
    }
    if (next_ < core_->compacted) {
      return absl::OutOfRangeError("etcdserver: mvcc: required revision has been compacted");
    }
    Changes c;
    for (const Event& e : core_->history) {
      if (e.kv().mod_revision() >= next_ && e.kv().key() == key_) c.events.push_back(e);
    }
    if (c.events.empty()) return std::nullopt;
    next_ = c.events.back().kv().mod_revision() + 1;
    c.revision = core_->revision;
    return c;
  }

  std::shared_ptr<SimEtcd::Core> core_;
  const std::string client_;
  const std::string key_;
  int64_t next_;
  const uint64_t outage_;
  bool cancelled_ = false;  // guarded by core_->mu
};

class SimClient final : public server::EtcdClient {
 public:
  SimClient(std::shared_ptr<SimEtcd::Core> core, std::string name,
            std::vector<std::string> members)
      : core_(std::move(core)), name_(std::move(name)), members_(std::move(members)) {}

  absl::StatusOr<RangeResponse> Range(const RangeRequest& request) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (absl::Status s = core_->Available(name_); !s.ok()) return s;
    core_->ExpireLocked();
    return core_->RangeLocked(request);
  }

  absl::StatusOr<TxnResponse> Txn(const TxnRequest& request) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (absl::Status s = core_->Available(name_); !s.ok()) return s;
    core_->ExpireLocked();
    bool ok = true;
    for (const Compare& c : request.compare()) {
      ok = ok && core_->Matches(c);
    }
    const auto& ops = ok ? request.success() : request.failure();
    // Validated whole before anything applies, as etcd does.
    bool writes = false;
    for (const RequestOp& op : ops) {
      if (op.has_request_put()) {
        writes = true;
        const int64_t lease = op.request_put().lease();
        if (lease != 0 && !core_->leases.contains(lease)) {
          return absl::NotFoundError("etcdserver: requested lease not found");
        }
      } else if (op.has_request_delete_range()) {
        writes = true;
      } else if (!op.has_request_range()) {
        return absl::UnimplementedError("sim etcd: nested transactions");
      }
    }
    if (writes && core_->no_space) {
      return absl::ResourceExhaustedError("etcdserver: mvcc: database space exceeded");
    }
    TxnResponse out;
    out.set_succeeded(ok);
    const int64_t rev = writes ? core_->revision + 1 : core_->revision;
    bool changed = false;
    for (const RequestOp& op : ops) {
      ResponseOp* reply = out.add_responses();
      if (op.has_request_range()) {
        auto r = core_->RangeLocked(op.request_range());
        if (!r.ok()) return r.status();
        *reply->mutable_response_range() = std::move(*r);
      } else if (op.has_request_put()) {
        const auto& put = op.request_put();
        core_->revision = rev;
        core_->PutKeyLocked(put.key(), put.value(), put.lease(), rev);
        changed = true;
        reply->mutable_response_put();
      } else {
        const auto& del = op.request_delete_range();
        std::vector<std::string> doomed;
        for (const auto& [key, kv] : core_->kvs) {
          if (InRange(key, del.key(), del.range_end())) doomed.push_back(key);
        }
        if (!doomed.empty()) {
          core_->revision = rev;
          changed = true;
        }
        for (const std::string& k : doomed) core_->DeleteKeyLocked(k, rev);
        reply->mutable_response_delete_range()->set_deleted(static_cast<int64_t>(doomed.size()));
      }
    }
    core_->Header(out.mutable_header());
    for (ResponseOp& r : *out.mutable_responses()) {
      if (r.has_response_range()) r.mutable_response_range()->mutable_header()->set_revision(core_->revision);
    }
    if (changed) {
      core_->changed.notify_all();
      if (core_->lose_replies > 0) {
        --core_->lose_replies;
        return absl::UnavailableError("sim etcd: the reply was lost after the commit");
      }
    }
    return out;
  }

  absl::Status Compact(int64_t revision) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (absl::Status s = core_->Available(name_); !s.ok()) return s;
    if (revision <= core_->compacted) {
      return absl::OutOfRangeError("etcdserver: mvcc: required revision has been compacted");
    }
    if (revision > core_->revision) {
      return absl::OutOfRangeError("etcdserver: mvcc: required revision is a future revision");
    }
    core_->compacted = revision;
    auto& h = core_->history;
    h.erase(std::remove_if(h.begin(), h.end(),
                           [&](const Event& e) { return e.kv().mod_revision() < revision; }),
            h.end());
    core_->NotifyLocked(nullptr);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (absl::Status s = core_->Available(name_); !s.ok()) return s;
    core_->ExpireLocked();
    const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
    const int64_t id = ++core_->next_lease;
    SimEtcd::Core::Lease& l = core_->leases[id];
    l.ttl_seconds = seconds;
    l.expires_at = core_->clock->Now() + absl::Seconds(seconds);
    return id;
  }

  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t id) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (absl::Status s = core_->Available(name_); !s.ok()) return s;
    core_->ExpireLocked();
    auto it = core_->leases.find(id);
    if (it == core_->leases.end()) return absl::NotFoundError("etcdserver: requested lease not found");
    it->second.expires_at = core_->clock->Now() + absl::Seconds(it->second.ttl_seconds);
    return absl::Seconds(it->second.ttl_seconds);
  }

  absl::Status LeaseRevoke(int64_t id) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (absl::Status s = core_->Available(name_); !s.ok()) return s;
    core_->ExpireLocked();
    auto it = core_->leases.find(id);
    if (it == core_->leases.end()) return absl::NotFoundError("etcdserver: requested lease not found");
    const std::set<std::string> keys = it->second.keys;
    core_->leases.erase(it);
    core_->RevokeLocked(keys);
    return absl::OkStatus();
  }

  absl::StatusOr<LeaseLife> LeaseTimeToLive(int64_t id) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (absl::Status s = core_->Available(name_); !s.ok()) return s;
    core_->ExpireLocked();
    auto it = core_->leases.find(id);
    if (it == core_->leases.end()) return absl::NotFoundError("etcdserver: requested lease not found");
    // etcd reports whole seconds left.
    const absl::Duration left = absl::Trunc(it->second.expires_at - core_->clock->Now(), absl::Seconds(1));
    return LeaseLife{left, absl::Seconds(it->second.ttl_seconds)};
  }

  absl::StatusOr<std::unique_ptr<server::EtcdWatch>> Watch(const std::string& key,
                                                           int64_t start_revision) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (absl::Status s = core_->Available(name_); !s.ok()) return s;
    return std::unique_ptr<server::EtcdWatch>(
        new SimWatch(core_, name_, key, start_revision, core_->outage));
  }

  absl::StatusOr<etcdserverpb::StatusResponse> MemberStatus(size_t i) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (absl::Status s = core_->Available(name_); !s.ok()) return s;
    if (i >= members_.size()) return absl::InvalidArgumentError("no such member");
    etcdserverpb::StatusResponse out;
    core_->Header(out.mutable_header());
    out.mutable_header()->set_member_id(kMemberId + i);
    out.set_leader(kMemberId);
    out.set_raftindex(static_cast<uint64_t>(core_->revision));
    int64_t bytes = 0;
    for (const auto& [k, kv] : core_->kvs) bytes += static_cast<int64_t>(k.size() + kv.value().size());
    out.set_dbsize(bytes);
    return out;
  }

  const std::vector<std::string>& endpoints() const override { return members_; }
  size_t current() const override { return 0; }

 private:
  std::shared_ptr<SimEtcd::Core> core_;
  const std::string name_;
  const std::vector<std::string> members_;
};

}  // namespace

SimEtcd::SimEtcd(Clock* clock) : core_(std::make_shared<Core>(clock)) {}

SimEtcd::~SimEtcd() {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    ++core_->outage;  // watches still open end
  }
  core_->changed.notify_all();
}

std::unique_ptr<server::EtcdClient> SimEtcd::Connect(std::string name,
                                                     std::vector<std::string> members) {
  return std::make_unique<SimClient>(core_, std::move(name), std::move(members));
}

void SimEtcd::Partition(const std::string& name, bool partitioned) {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (partitioned) {
      core_->partitioned.insert(name);
    } else {
      core_->partitioned.erase(name);
    }
    core_->NotifyLocked(nullptr);
  }
}

void SimEtcd::SetUnavailable(bool unavailable) {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (unavailable && !core_->unavailable) ++core_->outage;
    core_->unavailable = unavailable;
    core_->NotifyLocked(nullptr);
  }
}

void SimEtcd::LoseRepliesAfterCommit(int n) {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->lose_replies = n;
}

void SimEtcd::SetNoSpace(bool no_space) {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->no_space = no_space;
}

void SimEtcd::Tick() {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->ExpireLocked();
}

int64_t SimEtcd::revision() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->revision;
}

std::vector<std::pair<std::string, std::string>> SimEtcd::Dump(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(core_->mu);
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = core_->kvs.lower_bound(prefix);
       it != core_->kvs.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    out.emplace_back(it->first, it->second.value());
  }
  return out;
}

bool SimEtcd::Delete(const std::string& key) {
  std::lock_guard<std::mutex> lock(core_->mu);
  if (!core_->kvs.contains(key)) return false;
  core_->DeleteKeyLocked(key, ++core_->revision);
  core_->changed.notify_all();
  return true;
}

void SimEtcd::Put(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->PutKeyLocked(key, value, 0, ++core_->revision);
  core_->changed.notify_all();
}

std::optional<KeyValue> SimEtcd::Get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(core_->mu);
  auto it = core_->kvs.find(key);
  if (it == core_->kvs.end()) return std::nullopt;
  return it->second;
}

std::optional<MonoTime> SimEtcd::LeaseExpiresAt(int64_t id) const {
  std::lock_guard<std::mutex> lock(core_->mu);
  auto it = core_->leases.find(id);
  if (it == core_->leases.end()) return std::nullopt;
  return it->second.expires_at;
}

MonoTime SimEtcd::NextExpiry() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  MonoTime next = MonoTime::Max();
  for (const auto& [id, lease] : core_->leases) next = std::min(next, lease.expires_at);
  return next;
}

void SimEtcd::SetObserver(std::function<void(const Event*)> fn) {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->observer = std::move(fn);
}

size_t SimEtcd::leases() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->leases.size();
}

}  // namespace fencelock::sim
