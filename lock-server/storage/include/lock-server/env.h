// The file operations lockd's durable state uses, behind an interface so that tests can run
// recovery against an in-memory copy of a state directory and inject disk faults (in the manner
// of LevelDB's Env and its fault-injection wrapper; those test Envs are in
// lock-server/storage/testing/test_envs.h, outside every production target).
//
// Every operation that makes something durable says so; nothing else syncs. Implementations
// are thread-safe. An operation that could not open a file or directory because the process
// (or the system) ran out of descriptors fails with kUnavailable (OutOfDescriptors()); it then
// left nothing that a second try of the same operation would trip over.
#ifndef FENCELOCK_LOCK_SERVER_ENV_H_
#define FENCELOCK_LOCK_SERVER_ENV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fencelock::server {

// A preallocated file written in place (a WAL segment).
class SegmentFile {
 public:
  virtual ~SegmentFile() = default;
  // Writes `data` at `offset`, which must lie inside the allocated size. Not durable until
  // Sync(). kResourceExhausted or kDataLoss/kInternal on a disk error.
  virtual absl::Status WriteAt(uint64_t offset, std::string_view data) = 0;
  // Makes every write so far durable (fdatasync).
  virtual absl::Status Sync() = 0;
};

// An exclusive hold on a file (a state directory's LOCK) for as long as the object lives.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

// An exclusive flock on `path` on the real file system (created 0644 if missing; another
// user's file is locked read-only), whose content then names `owner`: for a lock of the whole
// host, such as the admission namespace's. Held elsewhere: kFailedPrecondition naming the
// holder and ending in `rule`. Never follows a symbolic link: kFailedPrecondition for one, and
// for anything but a regular file with one link owned by this process's user or root (the
// path may be in a world-writable directory such as /run/lock).
absl::StatusOr<std::unique_ptr<FileLock>> LockHostFile(const std::string& path,
                                                       const std::string& owner,
                                                       const std::string& rule);

// True for an Env failure that only lacked a file descriptor (EMFILE, ENFILE): worth trying
// again once descriptors are free, and no sign of a damaged disk.
inline bool OutOfDescriptors(const absl::Status& s) { return absl::IsUnavailable(s); }

class Env {
 public:
  virtual ~Env() = default;

  // The real file system. Never null.
  static Env* Posix();

  // The whole file. kNotFound if it does not exist.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Replaces `path` with `contents` durably and atomically: a temporary file is written and
  // synced, renamed over `path`, and the directory is synced. Readers see the old or the new
  // contents, never a mix.
  virtual absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) = 0;
  // Creates `path` durably with `header` at offset 0 and zeros up to `size` bytes, atomically
  // (a temporary name until it is complete and synced), and opens it for writing.
  virtual absl::StatusOr<std::unique_ptr<SegmentFile>> CreateSegment(const std::string& path,
                                                                     std::string_view header,
                                                                     uint64_t size) = 0;
  // Begins to make, in the background, the segment a later CreateSegment(path, header, size)
  // will ask for, so that the writer does not wait while a segment's zeros are written. Nothing
  // of it is under `path` until that CreateSegment; a process that ends first leaves a
  // temporary file, which the next open removes. Default: nothing (CreateSegment makes it);
  // the real file system's makes segments of 64 KiB and more ahead, on a thread of their own.
  virtual void PrepareSegment(const std::string& path, uint64_t size) {}
  // Opens an existing segment for writing in place.
  virtual absl::StatusOr<std::unique_ptr<SegmentFile>> OpenSegment(const std::string& path) = 0;
  // What `path` itself is, never following a symbolic link (lstat). kNotFound if missing.
  enum class Kind { kFile, kDirectory, kSymlink, kOther };
  virtual absl::StatusOr<Kind> KindOf(const std::string& path) = 0;
  // Names (not paths) of the entries in `dir`. kNotFound if `dir` does not exist.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // Removes a file; durable once the directory is synced by a later atomic write or SyncDir.
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Removes the empty directory `dir`, durably (`lockd destroy`). kFailedPrecondition if it
  // is not empty.
  virtual absl::Status RemoveDir(const std::string& dir) = 0;
  // Creates a directory (its parent must exist) and syncs the parent.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Takes an exclusive lock on `path` (created if missing) and on the directory that holds it
  // for the life of the returned object, across processes, and writes `owner` into the file
  // for whoever is refused next. Removing the file does not release the directory's lock. A
  // process that dies loses its locks. kFailedPrecondition, quoting the holder's `owner`, if
  // another holds either.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path,
                                                             const std::string& owner) = 0;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_ENV_H_
