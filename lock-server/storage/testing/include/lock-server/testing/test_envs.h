// Envs for tests and the simulator, never linked into a production binary: MemEnv keeps a
// state directory in memory; FaultInjectingEnv wraps another Env and fails writes on command, as
// a full or failing disk would.
#ifndef FENCELOCK_LOCK_SERVER_TESTING_TEST_ENVS_H_
#define FENCELOCK_LOCK_SERVER_TESTING_TEST_ENVS_H_

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "lock-server/env.h"

namespace fencelock::server {

// An Env that keeps files in memory. For tests: load a real state directory into it, damage
// it, run recovery. Thread-safe.
class MemEnv : public Env {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) override;
  absl::StatusOr<std::unique_ptr<SegmentFile>> CreateSegment(const std::string& path,
                                                             std::string_view header,
                                                             uint64_t size) override;
  absl::StatusOr<std::unique_ptr<SegmentFile>> OpenSegment(const std::string& path) override;
  // Only files and directories: a path with files under it, or made by CreateDir, is one.
  absl::StatusOr<Kind> KindOf(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveDir(const std::string& dir) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::Status SyncDir(const std::string& dir) override { return absl::OkStatus(); }
  // Exclusive among users of this MemEnv.
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path,
                                                     const std::string& owner) override;

  // Direct access for tests.
  void PutFile(const std::string& path, std::string contents);
  std::map<std::string, std::string> Files() const;

 private:
  friend class MemSegment;
  friend class MemFileLock;
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> files_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> dirs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> locked_ ABSL_GUARDED_BY(mu_);  // path -> owner
};

// Wraps another Env and fails writes on command, as a full or failing disk would. Reads pass
// through. Thread-safe.
class FaultInjectingEnv : public Env {
 public:
  explicit FaultInjectingEnv(Env* base) : base_(base) {}

  // While set, every write, sync, create and remove fails with kResourceExhausted
  // ("No space left on device").
  void SetDiskFull(bool full);
  bool disk_full() const;
  // Number of operations refused so far.
  int refused() const;

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return base_->ReadFile(path);
  }
  absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) override;
  absl::StatusOr<std::unique_ptr<SegmentFile>> CreateSegment(const std::string& path,
                                                             std::string_view header,
                                                             uint64_t size) override;
  absl::StatusOr<std::unique_ptr<SegmentFile>> OpenSegment(const std::string& path) override;
  absl::StatusOr<Kind> KindOf(const std::string& path) override { return base_->KindOf(path); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveDir(const std::string& dir) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path,
                                                     const std::string& owner) override {
    return base_->LockFile(path, owner);
  }

  // kResourceExhausted while the disk is full, OK otherwise (counts refusals).
  absl::Status Check();

 private:
  Env* const base_;
  mutable absl::Mutex mu_;
  bool full_ ABSL_GUARDED_BY(mu_) = false;
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_TESTING_TEST_ENVS_H_
