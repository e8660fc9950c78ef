// Reading the state as of one moment, a slice at a time (StateMachine::Freeze), and the copies
// the state keeps of what changes ahead of the reading.
#include "lock-server/state_machine.h"

namespace fencelock::server {

void StateMachine::Freeze() const {
  frozen_ = std::make_unique<Frozen>();
  frozen_->last_token = last_token_;
  frozen_->last_session_id = last_session_id_;
}

FenceToken StateMachine::frozen_last_token() const {
  return frozen_ == nullptr ? FenceToken() : frozen_->last_token;
}

SessionId StateMachine::frozen_last_session_id() const {
  return frozen_ == nullptr ? SessionId() : frozen_->last_session_id;
}

size_t StateMachine::frozen_copies() const {
  return frozen_ == nullptr ? 0 : frozen_->locks.size() + frozen_->sessions.size();
}

void StateMachine::KeepLock(std::string_view lock) {
  Frozen* f = frozen_.get();
  if (f == nullptr || (f->locks_started && lock <= f->locks_read) || f->locks.contains(lock)) {
    return;
  }
  Frozen::LockCopy copy;
  if (const LockState* state = FindLock(lock); state != nullptr) {
    copy.holders.assign(state->holders().begin(), state->holders().end());
    copy.delay_all = state->delay_all();
    copy.delay_writers = state->delay_writers();
  }
  f->locks.emplace(std::string(lock), std::move(copy));
}

void StateMachine::KeepSession(SessionId session) {
  Frozen* f = frozen_.get();
  if (f == nullptr || session <= f->sessions_read || session > f->last_session_id) return;
  if (auto it = sessions_.find(session); it != sessions_.end()) {
    SessionState& copy = f->sessions[session];
    copy.ttl = it->second.ttl;
    copy.secret_digest = it->second.secret_digest;
    copy.owner = it->second.owner;
  }
}

bool StateMachine::ReadFrozen(size_t max, const FrozenSessionVisitor& session,
                              const FrozenLockVisitor& lock) const {
  if (frozen_ == nullptr) return true;
  Frozen& f = *frozen_;
  size_t visited = 0;
  // Sessions: the live ones up to the moment's last id, and the copies of those ended since.
  if (!f.sessions_done) {
    auto live = sessions_.upper_bound(f.sessions_read);
    auto kept = f.sessions.upper_bound(f.sessions_read);
    for (; visited < max; ++visited) {
      const bool live_left = live != sessions_.end() && live->first <= f.last_session_id;
      const bool kept_left = kept != f.sessions.end();
      if (!live_left && !kept_left) {
        f.sessions_done = true;
        break;
      }
      // An ended session's id is never live again, so the two never name the same id.
      if (kept_left && (!live_left || kept->first < live->first)) {
        session(kept->first, kept->second);
        f.sessions_read = kept->first;
        kept = f.sessions.erase(kept);
      } else {
        session(live->first, live->second);
        f.sessions_read = live->first;
        ++live;
      }
    }
  }
  if (!f.sessions_done) return false;
  // Locks: the live ones, or the copy kept of a name changed since the moment (a copy with
  // nothing in it: the name was not kept then).
  auto live = f.locks_started ? locks_.upper_bound(f.locks_read) : locks_.begin();
  auto kept = f.locks_started ? f.locks.upper_bound(f.locks_read) : f.locks.begin();
  for (; visited < max; ++visited) {
    const bool live_left = live != locks_.end();
    const bool kept_left = kept != f.locks.end();
    if (!live_left && !kept_left) {
      frozen_.reset();
      return true;
    }
    f.locks_started = true;
    if (kept_left && (!live_left || kept->first <= (*live)->name())) {
      if (live_left && kept->first == (*live)->name()) ++live;
      const Frozen::LockCopy& copy = kept->second;
      if (!copy.holders.empty() || copy.delay_all.has_value() || copy.delay_writers.has_value()) {
        lock(kept->first, copy.holders, copy.delay_all, copy.delay_writers);
      }
      f.locks_read.assign(kept->first);
      kept = f.locks.erase(kept);
    } else {
      const LockState& state = **live;
      lock(state.name(), state.holders(), state.delay_all(), state.delay_writers());
      f.locks_read.assign(state.name());
      ++live;
    }
  }
  return false;
}

}  // namespace fencelock::server
