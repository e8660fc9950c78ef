// The reply gate: holds each reply until the commit-log batch it may reflect is committed, so
// that nothing is acknowledged, and no state is shown, before it is committed.
//
// A reply may reflect any record applied before it was produced (a grant, another client's
// release, an expiry), so it is tagged with the log's newest batch at that moment, unless it
// reflects only records known to be in an older batch (a KeepAlive that renewed its session and
// locks: their opening and grants). A reply leaves as soon as its batch is committed, so replies
// of one connection may leave in another order than they were produced; those that wait leave
// in the order they were produced.
//
// Not thread-safe: the core's thread.
#ifndef FENCELOCK_LOCK_SERVER_REPLY_GATE_H_
#define FENCELOCK_LOCK_SERVER_REPLY_GATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lock-server/server_core.h"

namespace fencelock::server {

class ReplyGate {
 public:
  // Called with the frames of one connection that may go now (one call per connection per
  // release, so that they leave in one write).
  using Deliver = std::function<void(ConnectionId, std::string frames)>;
  explicit ReplyGate(Deliver deliver) : deliver_(std::move(deliver)) {}

  // Delivers `frame` now if `batch` is committed, otherwise holds it.
  void Submit(ConnectionId c, uint64_t batch, uint64_t committed, uint64_t request_id,
              std::string frame);
  // Every batch up to `batch` is committed: delivers what waited for them.
  void Committed(uint64_t batch);
  // Nothing held will ever be committed (the log failed): forgets every held reply and returns
  // its connection and request id, oldest first per connection.
  std::vector<std::pair<ConnectionId, uint64_t>> TakeAll();
  // The connection is gone: its held replies are dropped.
  void Drop(ConnectionId c) { held_.erase(c); }
  // No reply is held.
  bool empty() const { return held_.empty(); }
  // Replies of `c` held now.
  size_t held(ConnectionId c) const {
    auto it = held_.find(c);
    return it == held_.end() ? 0 : it->second.size();
  }

 private:
  struct Held {
    uint64_t batch;
    uint64_t request_id;
    std::string frame;
  };
  Deliver deliver_;
  // Ordered by connection id, so that releases go out in the same order in every run.
  std::map<ConnectionId, std::vector<Held>> held_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_REPLY_GATE_H_
