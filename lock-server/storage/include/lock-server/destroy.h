// `lockd destroy`: the seed ADR-0003's exact cleanup. A coordinator's state is removed only
// once it holds nothing: no lock held, no pool lease (provisional or active). The check and the
// removal happen under the state directory's LOCK, so no lockd can start on it in between.
#ifndef FENCELOCK_LOCK_SERVER_DESTROY_H_
#define FENCELOCK_LOCK_SERVER_DESTROY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lock-server/env.h"
#include "lock-server/state_machine.h"

namespace fencelock::server {

struct DestroyOutcome {
  // What the state still holds, one line each ("lock payout/7 token 12 held by session 3",
  // "pool hosts: build/b1 token 40 active"). Not empty: nothing was removed.
  std::vector<std::string> held;
  std::vector<std::string> removed;  // the files removed, in order (FORMAT first)
  // Files in the directory that lockd did not write: left there, and with them the directory.
  std::vector<std::string> kept;
  bool removed_dir = false;
};

// What `state` holds that forbids its destruction, one line each (see DestroyOutcome::held).
std::vector<std::string> HeldInState(const StateMachine& state);

// Removes the state directory `dir` that `lockd init` made, if it holds nothing (see above).
// Removes only the names lockd writes (FORMAT, SEQUENCES, COMMITTED, LOCK, DESTROYING,
// wal-<20 digits>, snapshot-<20 digits>, and each with ".tmp"), and only regular files; never
// follows a symbolic link, `dir` included. Before FORMAT goes, it writes DESTROYING; a destroy
// interrupted at any point after that is finished by running it again. Errors (each message
// ends with what was removed: "nothing removed", or the list and how to finish):
// kFailedPrecondition when a process holds the directory (naming it, as `lockd serve` would),
// for a symbolic link, and for one of lockd's names that is not a regular file; kNotFound for
// a directory that is not a state directory (no FORMAT and no DESTROYING; an empty directory
// is simply removed); recovery's errors for a damaged one (it is never removed by this: an
// operator looks first).
absl::StatusOr<DestroyOutcome> DestroyStateDir(Env* env, const std::string& dir,
                                               const std::string& owner);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_DESTROY_H_
