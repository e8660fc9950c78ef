#include "reply_gate.h"

namespace fencelock::server {

void ReplyGate::Submit(ConnectionId c, uint64_t batch, uint64_t committed, uint64_t request_id,
                       std::string frame) {
  // Committed already: out now, even ahead of replies of this connection that still wait
  // (replies to different requests may arrive in any order).
  if (batch <= committed) {
    deliver_(c, std::move(frame));
    return;
  }
  held_[c].push_back(Held{batch, request_id, std::move(frame)});
}

void ReplyGate::Committed(uint64_t batch) {
  for (auto it = held_.begin(); it != held_.end();) {
    std::vector<Held>& queue = it->second;
    std::string frames;
    // Tags are not in order (a KeepAlive's reply waits only for its own facts): every reply
    // whose batch is committed goes, the others keep their order.
    size_t kept = 0;
    for (Held& h : queue) {
      if (h.batch <= batch) {
        if (frames.empty()) {
          frames = std::move(h.frame);  // most often the only one: no copy
        } else {
          frames += h.frame;
        }
      } else {
        if (&queue[kept] != &h) queue[kept] = std::move(h);
        ++kept;
      }
    }
    queue.resize(kept);
    const ConnectionId c = it->first;
    it = queue.empty() ? held_.erase(it) : std::next(it);
    if (!frames.empty()) deliver_(c, std::move(frames));
  }
}

std::vector<std::pair<ConnectionId, uint64_t>> ReplyGate::TakeAll() {
  std::vector<std::pair<ConnectionId, uint64_t>> out;
  for (const auto& [c, queue] : held_) {
    for (const Held& h : queue) out.emplace_back(c, h.request_id);
  }
  held_.clear();
  return out;
}

}  // namespace fencelock::server
