// What both power-cut runs (lockd alone, the payout demo's whole host) share: a forgetfs
// mounted for the run, the cut itself, and the tally of what the cuts found pending.
#ifndef FENCELOCK_POWERCUT_POWERED_MOUNT_H_
#define FENCELOCK_POWERCUT_POWERED_MOUNT_H_

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "process/process.h"

namespace fencelock::powercut {

// The whole file's contents ("" if it cannot be read).
std::string ReadFile(const std::string& path);
// The last line of `text`, with its newline if it has one ("" for empty text).
std::string LastLine(const std::string& text);

// What the cuts of a run found pending, summed.
struct CutTally {
  int64_t unsynced = 0, kept = 0, dropped = 0, names_lost = 0;
  int cuts = 0;
  int in_flight = 0;  // cuts that came with a write in flight (armed)
  std::string Describe() const;
};

// fencelock-forgetfs mounted on <dir>/mnt, its store in <dir>/store, its control socket
// <dir>/control, its log <dir>/logs/forgetfs.log. Unmounted on destruction.
class PoweredMount {
 public:
  PoweredMount(std::string dir, std::string forgetfs_binary)
      : dir_(std::move(dir)), binary_(std::move(forgetfs_binary)) {}
  ~PoweredMount();
  PoweredMount(const PoweredMount&) = delete;
  PoweredMount& operator=(const PoweredMount&) = delete;

  absl::Status Mount();
  std::string path() const { return dir_ + "/mnt"; }
  // Makes the directory `name` in the mount and syncs it and the mount's root, as an installer
  // would: it survives every cut. Returns its path.
  absl::StatusOr<std::string> MakeDurableDirectory(const std::string& name);

  // In half the rounds (drawn from `rng`) arms the power to go at one of the next 400 writes,
  // with that write in flight; returns whether it did.
  absl::StatusOr<bool> MaybeArm(std::mt19937_64& rng);
  // Lets the processes on the mount run for `load`, or until an armed cut has come (the write
  // is in flight and everything waits for the cut), polled every `poll`; returns whether it
  // came.
  bool RunUntil(absl::Duration load, bool armed, absl::Duration poll);
  // The power cut, its mode drawn from `rng`: waits for every file to close (kill the
  // processes first, or in parallel), then leaves what a disk would, adding to `tally`.
  absl::Status Cut(std::mt19937_64& rng, bool was_frozen, CutTally& tally);

 private:
  const std::string dir_, binary_;
  process::Child fs_;
};

}  // namespace fencelock::powercut

#endif  // FENCELOCK_POWERCUT_POWERED_MOUNT_H_
