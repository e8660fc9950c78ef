// A simulated disk under lockd's local commit log: an Env that remembers, per file, what is
// durable and what was only written. Atomic writes and created segments are durable at once; a
// WriteAt is durable only after the file's Sync. Crash() forgets every unsynced write, or keeps
// a random prefix of it (a torn write). A sync can be made to fail once.
//
// Deterministic (std::map everywhere) and single-threaded: the simulator's thread.
#ifndef FENCELOCK_SIM_SIM_DISK_H_
#define FENCELOCK_SIM_SIM_DISK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "lock-server/env.h"

namespace fencelock::sim {

class SimDisk final : public server::Env {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) override;
  absl::StatusOr<std::unique_ptr<server::SegmentFile>> CreateSegment(const std::string& path,
                                                                     std::string_view header,
                                                                     uint64_t size) override;
  absl::StatusOr<std::unique_ptr<server::SegmentFile>> OpenSegment(
      const std::string& path) override;
  absl::StatusOr<Kind> KindOf(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveDir(const std::string& dir) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::Status SyncDir(const std::string& dir) override { return absl::OkStatus(); }
  // One simulated lockd at a time: the lock always succeeds.
  absl::StatusOr<std::unique_ptr<server::FileLock>> LockFile(const std::string& path,
                                                             const std::string& owner) override {
    return std::make_unique<server::FileLock>();
  }

  // The next Sync (or atomic write) fails with kDataLoss, as an EIO from fdatasync would.
  void FailNextSync() { fail_next_sync_ = true; }
  // Disarms FailNextSync (the disk was replaced while lockd was down).
  void ClearFaults() { fail_next_sync_ = false; }
  // Loses what was not synced. `keep` is asked, for each file with unsynced writes, how many
  // bytes of the first unsynced range survive (0: none, a torn write otherwise).
  void Crash(const std::function<uint64_t(uint64_t unsynced_bytes)>& keep);

 private:
  friend class SimSegment;
  struct File {
    std::string durable;
    std::string written;  // durable plus every write since the last sync
  };
  absl::Status SyncFile(const std::string& path);

  std::map<std::string, File> files_;
  std::set<std::string> dirs_;
  bool fail_next_sync_ = false;
};

}  // namespace fencelock::sim

#endif  // FENCELOCK_SIM_SIM_DISK_H_
