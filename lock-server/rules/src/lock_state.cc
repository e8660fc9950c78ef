// LockState (state_machine.h): one lock name's state, its name in the same allocation, and
// its holders kept in place while there is one.
#include <algorithm>
#include <cstring>
#include <new>

#include "lock-server/state_machine.h"

namespace fencelock::server {

namespace {

// The holder in `holders` (ascending token) with `token`, or null.
template <typename Holders>
auto FindInHolders(Holders holders, FenceToken token) -> decltype(&holders.front()) {
  auto it = std::lower_bound(holders.begin(), holders.end(), token,
                             [](const HolderState& h, FenceToken t) { return h.token < t; });
  return it != holders.end() && it->token == token ? &*it : nullptr;
}

}  // namespace

const std::optional<LockDelay> LockState::kNoDelay;

void LockState::Free::operator()(LockState* state) const {
  state->~LockState();
  ::operator delete(static_cast<void*>(state));
}

LockState::Owned LockState::Make(std::string_view name) {
  void* place = ::operator new(sizeof(LockState) + name.size());
  Owned state(new (place) LockState(name.size()));
  std::memcpy(reinterpret_cast<char*>(state.get() + 1), name.data(), name.size());
  return state;
}

const HolderState* LockState::FindToken(FenceToken token) const {
  return FindInHolders(holders(), token);
}

HolderState* LockState::FindToken(FenceToken token) {
  return FindInHolders(mutable_holders(), token);
}

const HolderState* LockState::FindSession(SessionId session) const {
  for (const HolderState& h : holders()) {
    if (h.session == session) return &h;
  }
  return nullptr;
}

void LockState::Add(const HolderState& holder) {
  if (holder_count_ == 0 && (extra_ == nullptr || extra_->holders.empty())) {
    one_ = holder;
  } else {
    if (extra_ == nullptr) extra_ = std::make_unique<Extra>();
    if (extra_->holders.empty()) extra_->holders.push_back(one_);
    extra_->holders.push_back(holder);
  }
  ++holder_count_;
}

void LockState::Remove(FenceToken token) {
  if (extra_ != nullptr && !extra_->holders.empty()) {
    std::vector<HolderState>& all = extra_->holders;
    all.erase(all.begin() + (FindToken(token) - all.data()));
    if (all.size() == 1) {
      one_ = all.front();
      all.clear();
      all.shrink_to_fit();
    }
  } else {
    one_ = HolderState{};
  }
  --holder_count_;
  Compact();
}

std::optional<LockDelay>& LockState::mutable_delay(LockMode lost) {
  if (extra_ == nullptr) extra_ = std::make_unique<Extra>();
  return lost == LockMode::kExclusive ? extra_->delay_all : extra_->delay_writers;
}

void LockState::Compact() {
  if (extra_ != nullptr && extra_->holders.empty() && !extra_->delay_all.has_value() &&
      !extra_->delay_writers.has_value()) {
    extra_.reset();
  }
}

MonoTime LockState::DelayedUntil(LockMode mode) const {
  MonoTime until = MonoTime::Min();
  if (delay_all().has_value()) until = std::max(until, delay_all()->until);
  if (mode == LockMode::kExclusive && delay_writers().has_value()) {
    until = std::max(until, delay_writers()->until);
  }
  return until;
}

}  // namespace fencelock::server
