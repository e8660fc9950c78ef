#include "lock-server/destroy.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lock-server/storage.h"

namespace fencelock::server {
namespace {

std::string Path(const std::string& dir, const std::string& name) { return dir + "/" + name; }

// A name that only lockd writes in a state directory.
bool LockdsFile(const std::string& name) {
  return name == kFormatFile || name == kSequencesFile || name == kLockFile ||
         name == kCommittedFile || absl::StartsWith(name, "snapshot-") ||
         absl::StartsWith(name, "wal-") || absl::EndsWith(name, ".tmp");
}

}  // namespace

std::vector<std::string> HeldInState(const StateMachine& state) {
  std::vector<std::string> held;
  for (const auto& [lock, state_of_lock] : state.locks()) {
    for (const HolderState& h : state_of_lock.holders) {
      held.push_back(absl::StrCat("lock ", lock, " token ", h.token,
                                  h.mode == LockMode::kShared ? " held shared" : " held",
                                  " by session ", h.session));
    }
  }
  for (const auto& [name, pool] : state.pools()) {
    for (const auto& [key, lease] : pool.leases) {
      held.push_back(absl::StrCat("pool ", name, ": ", key.first, "/", key.second, " token ",
                                  lease.token, lease.active ? " active" : " provisional"));
    }
  }
  return held;
}

absl::StatusOr<DestroyOutcome> DestroyStateDir(Env* env, const std::string& dir,
                                               const std::string& owner) {
  auto names = env->ListDir(dir);
  if (!names.ok()) return names.status();
  const bool initialized =
      std::find(names->begin(), names->end(), kFormatFile) != names->end();
  const bool only_lockds = std::all_of(names->begin(), names->end(), LockdsFile);
  if (!initialized && (names->empty() || !only_lockds)) {
    return absl::NotFoundError(absl::StrCat(
        dir, " is not a lockd state directory (no ", kFormatFile, ")"));
  }
  // No lockd may start on it from here on, nor run on it now.
  auto locked = env->LockFile(Path(dir, kLockFile), owner);
  if (!locked.ok()) return locked.status();
  DestroyOutcome out;
  if (initialized) {
    // Read-only: what the state holds, as a restart would restore it.
    auto recovered = Recover(env, dir, MonoTime::FromNanos(0));
    if (!recovered.ok()) return recovered.status();
    out.held = HeldInState(recovered->state);
    if (!out.held.empty()) return out;
    // FORMAT first: from here the directory is no state a lockd would serve, and a destroy
    // interrupted now is finished by the next one.
    if (absl::Status s = env->RemoveFile(Path(dir, kFormatFile)); !s.ok()) return s;
    if (absl::Status s = env->SyncDir(dir); !s.ok()) return s;
    out.removed.push_back(kFormatFile);
  }
  for (const std::string& name : *names) {
    if (name == kFormatFile || name == kLockFile) continue;
    if (!LockdsFile(name)) {
      out.kept.push_back(name);
      continue;
    }
    if (absl::Status s = env->RemoveFile(Path(dir, name)); !s.ok()) return s;
    out.removed.push_back(name);
  }
  // The LOCK last, while still held; the directory itself if nothing else is in it.
  if (absl::Status s = env->RemoveFile(Path(dir, kLockFile)); !s.ok() && !absl::IsNotFound(s)) {
    return s;
  }
  out.removed.push_back(kLockFile);
  locked->reset();
  if (out.kept.empty()) {
    if (absl::Status s = env->RemoveDir(dir); !s.ok()) return s;
    out.removed_dir = true;
  }
  return out;
}

}  // namespace fencelock::server
