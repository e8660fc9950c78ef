#include "lock-server/destroy.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lock-server/storage.h"

namespace fencelock::server {
namespace {

std::string Path(const std::string& dir, const std::string& name) { return dir + "/" + name; }

// The message of a destroy that stopped after removing `removed`.
absl::Status Stopped(const absl::Status& why, const std::string& dir,
                     const std::vector<std::string>& removed) {
  if (removed.empty()) {
    return absl::Status(why.code(), absl::StrCat(why.message(), "; nothing removed"));
  }
  return absl::Status(why.code(),
                      absl::StrCat(why.message(), "; removed so far from ", dir, ": ",
                                   absl::StrJoin(removed, ", "),
                                   "; run lockd destroy again to finish"));
}

}  // namespace

std::vector<std::string> HeldInState(const StateMachine& state) {
  std::vector<std::string> held;
  for (const LockState* state_of_lock : state.locks()) {
    for (const HolderState& h : state_of_lock->holders()) {
      held.push_back(absl::StrCat("lock ", std::string(state_of_lock->name()), " token ", h.token,
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
  DestroyOutcome out;
  // Never through a symbolic link: the directory named is the one destroyed, or none.
  auto kind = env->KindOf(dir);
  if (!kind.ok()) return Stopped(kind.status(), dir, out.removed);
  if (*kind == Env::Kind::kSymlink) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " is a symbolic link; lockd destroy never follows one (name the directory it "
             "points to); nothing removed"));
  }
  if (*kind != Env::Kind::kDirectory) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory; nothing removed"));
  }
  auto names = env->ListDir(dir);
  if (!names.ok()) return Stopped(names.status(), dir, out.removed);
  std::sort(names->begin(), names->end());
  auto has = [&](const char* name) {
    return std::find(names->begin(), names->end(), name) != names->end();
  };
  const bool initialized = has(kFormatFile);
  const bool interrupted = has(kDestroyMarkerFile);
  if (!initialized && !interrupted && !names->empty()) {
    return absl::NotFoundError(absl::StrCat(
        dir, " is not a lockd state directory (no ", kFormatFile, ", and no ", kDestroyMarkerFile,
        " left by an interrupted lockd destroy); nothing removed"));
  }
  // Everything is looked at before anything goes: one of lockd's names that is not a regular
  // file (a directory, a link) was not written by lockd, and stops the destroy here.
  std::vector<std::string> doomed;
  for (const std::string& name : *names) {
    if (!IsLockdFileName(name)) {
      out.kept.push_back(name);
      continue;
    }
    auto k = env->KindOf(Path(dir, name));
    if (!k.ok()) return Stopped(k.status(), dir, out.removed);
    if (*k != Env::Kind::kFile) {
      return absl::FailedPreconditionError(absl::StrCat(
          Path(dir, name), " is not a regular file, so lockd did not write it; move it away "
                           "and run lockd destroy again; nothing removed"));
    }
    if (name != kFormatFile && name != kLockFile && name != kDestroyMarkerFile) {
      doomed.push_back(name);
    }
  }
  // No lockd may start on it from here on, nor run on it now.
  auto locked = env->LockFile(Path(dir, kLockFile), owner);
  if (!locked.ok()) return Stopped(locked.status(), dir, out.removed);
  if (initialized) {
    // Read-only: what the state holds, as a restart would restore it.
    auto recovered = Recover(env, dir, MonoTime::FromNanos(0));
    if (!recovered.ok()) return Stopped(recovered.status(), dir, out.removed);
    out.held = HeldInState(recovered->state);
    if (!out.held.empty()) return out;
    // The marker first, then FORMAT: from here the directory is no state a lockd would serve,
    // and a destroy interrupted at any later point is finished by the next one.
    if (!interrupted) {
      if (absl::Status s = env->WriteFileAtomically(
              Path(dir, kDestroyMarkerFile),
              absl::StrCat("lockd destroy (", owner, ") began removing this state; run lockd "
                           "destroy --data-dir=", dir, " to finish\n"));
          !s.ok()) {
        return Stopped(s, dir, out.removed);
      }
    }
    if (absl::Status s = env->RemoveFile(Path(dir, kFormatFile)); !s.ok()) {
      return Stopped(s, dir, out.removed);
    }
    if (absl::Status s = env->SyncDir(dir); !s.ok()) return Stopped(s, dir, out.removed);
    out.removed.push_back(kFormatFile);
  }
  for (const std::string& name : doomed) {
    absl::Status s = env->RemoveFile(Path(dir, name));
    if (!s.ok() && !absl::IsNotFound(s)) return Stopped(s, dir, out.removed);
    out.removed.push_back(name);
  }
  // The LOCK while still held (the directory's own lock keeps excluding), the marker last.
  for (const char* name : {kLockFile, kDestroyMarkerFile}) {
    absl::Status s = env->RemoveFile(Path(dir, name));
    if (!s.ok() && !absl::IsNotFound(s)) return Stopped(s, dir, out.removed);
    if (s.ok()) out.removed.push_back(name);
  }
  if (absl::Status s = env->SyncDir(dir); !s.ok()) return Stopped(s, dir, out.removed);
  locked->reset();
  if (out.kept.empty()) {
    if (absl::Status s = env->RemoveDir(dir); !s.ok()) return Stopped(s, dir, out.removed);
    out.removed_dir = true;
  }
  return out;
}

}  // namespace fencelock::server
