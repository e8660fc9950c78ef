// A file system that forgets what was never synced, as a disk does when the power goes
// (issue 38). It passes every operation through to a folder (`<store>/live`) and keeps, beside
// it, what a power cut would leave:
//   - a file's data and size as of its last fsync or fdatasync (a copy in `<store>/durable`,
//     brought up to date at each sync by replaying the writes and truncations since the
//     previous one);
//   - a directory's entries as of its last fsync: a create, rename or unlink is durable only
//     once its directory is synced (the POSIX rule, which ext4 and XFS do not always need, but
//     which a program cannot count on).
// Cut() throws away everything else and leaves `<store>/live` as the disk would be found after
// the power came back. The unsynced writes are dropped, or (as a disk may) some of them are
// kept, page by page and in any order, or the newest one of each file is torn at a sector or
// page boundary.
//
// The FUSE front end is forgetfs_main.cc; this class has no FUSE types, so the model is tested
// by calling it directly (forgetful_fs_test.cc). Operations it does not model (links, symlinks,
// device nodes, renames of directories or across directories, exchanges, extended attributes,
// fallocate other than plain allocation) are refused with a log line, never guessed at.
//
// Thread-safe: one mutex orders every operation, so the model sees them in the order the
// backing folder does.
#ifndef FENCELOCK_POWERCUT_FORGETFUL_FS_H_
#define FENCELOCK_POWERCUT_FORGETFUL_FS_H_

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace fencelock::powercut {

// What becomes of the writes (and truncations) made since a file's last sync, at a cut.
enum class Unsynced {
  kDrop,      // all lost: the file is as of its last sync
  kKeepSome,  // each 4 KiB piece of each write kept or lost at random, the kept ones applied in
              // a random order (a disk reorders what it has not been told to order)
  kTear,      // all lost but a prefix of each file's newest write, cut at a `tear_unit` boundary
};

struct CutOptions {
  Unsynced unsynced = Unsynced::kDrop;
  uint64_t seed = 1;
  // kTear: 512 (a sector) or 4096 (a page).
  uint64_t tear_unit = 4096;
};

struct CutReport {
  int64_t files = 0;             // files in the durable tree, written back to `live`
  int64_t unsynced_writes = 0;   // writes and truncations pending at the cut
  int64_t pieces_kept = 0;       // kKeepSome and kTear: pieces of them that survived
  int64_t pieces_dropped = 0;
  int64_t entries_lost = 0;      // live names whose create, rename or unlink was not synced
  std::string ToString() const;
};

struct FsStats {
  int64_t files = 0;
  int64_t open_handles = 0;
  int64_t unsynced_writes = 0;
  int64_t unsynced_bytes = 0;
  int64_t unsynced_dirs = 0;  // directories whose entries differ from their durable ones
  int64_t syncs = 0;          // fsync and fdatasync of files, since the start
  int64_t dir_syncs = 0;
  int64_t cuts = 0;
  int64_t refused = 0;        // operations refused as not modeled
  int64_t freezes = 0;        // armed cuts that came (Arm)
  bool armed = false;
  bool frozen = false;        // an armed cut came: every operation waits for Cut()
};

class ForgetfulFs {
 public:
  // Opens `store` (created if missing) with `<store>/live` and `<store>/durable`. Whatever
  // `live` holds now is taken as durable. `log` gets one line per refused operation and per cut
  // (default: standard error).
  static absl::StatusOr<std::unique_ptr<ForgetfulFs>> Open(
      const std::string& store, std::function<void(const std::string&)> log = nullptr);
  ~ForgetfulFs();

  // The operations, on paths inside the file system ("/", "/a/b"). Each returns 0 or a
  // negative errno, as FUSE wants. A handle is what Open or Create gave.
  int GetAttr(const std::string& path, struct stat* st);
  int FGetAttr(uint64_t handle, struct stat* st);
  int ReadDir(const std::string& path, std::vector<std::string>* names);
  int Mkdir(const std::string& path, mode_t mode);
  int Rmdir(const std::string& path);
  int Unlink(const std::string& path);
  int Rename(const std::string& from, const std::string& to, unsigned int flags);
  int Create(const std::string& path, mode_t mode, int flags, uint64_t* handle);
  int Open(const std::string& path, int flags, uint64_t* handle);
  int Read(uint64_t handle, char* buf, size_t size, off_t offset);  // bytes read, or -errno
  int Write(uint64_t handle, const char* buf, size_t size, off_t offset);  // bytes, or -errno
  int Truncate(const std::string& path, off_t size);
  int FTruncate(uint64_t handle, off_t size);
  int Fallocate(uint64_t handle, int mode, off_t offset, off_t length);
  int Fsync(uint64_t handle);
  int FsyncDir(const std::string& path);
  int Release(uint64_t handle);
  // Modes and owners are not modeled: a change is durable at once.
  int Chmod(const std::string& path, mode_t mode);
  int Chown(const std::string& path, uid_t uid, gid_t gid);
  int Utimens(const std::string& path, const struct timespec times[2]);
  int Statfs(struct statvfs* st);
  // An operation the model does not know: logged, counted, -EPERM.
  int Refuse(const std::string& what);

  // Times the next cut: the `writes`-th write from now is applied (as unsynced) and then
  // nothing more is answered, every operation waiting, until Cut(), after which each fails
  // with EIO. The power goes with that write in flight. Stats().frozen says it came.
  void Arm(int64_t writes);
  // The power cut. Fails (kFailedPrecondition, naming them) while any file is open: the
  // processes that use the file system must be gone first. Afterwards `live` holds what
  // survived, and that is durable.
  absl::StatusOr<CutReport> Cut(const CutOptions& options);
  FsStats Stats();

 private:
  struct Pending {
    bool truncate = false;  // else a write
    uint64_t offset = 0;    // write: where; truncate: the new size
    std::string data;
  };
  struct Inode {
    bool dir = false;
    std::vector<Pending> pending;  // a file's, since its last sync, in order
    // A directory's entries (name → inode) as of its last sync. Kept by inode, not by path: a
    // directory removed and made again under its old name starts empty.
    std::map<std::string, uint64_t> synced;
    mode_t mode = 0755;  // a directory's, to make it again after a cut
    int open = 0;
  };
  struct Handle {
    int fd = -1;
    uint64_t inode = 0;
  };

  ForgetfulFs(std::string store, std::function<void(const std::string&)> log);
  absl::Status Scan() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Live(const std::string& path) const { return live_dir_ + path; }
  std::string DurableCopy(uint64_t inode) const;
  uint64_t NewInode(bool dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int OpenLocked(const std::string& path, int flags, mode_t mode, bool create, uint64_t* handle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyPending(uint64_t inode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits while the power is gone (Arm); false if a cut came meanwhile: the operation fails.
  bool WaitThawed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(const std::string& line) const;

  const std::string store_, live_dir_, durable_dir_;
  const std::function<void(const std::string&)> log_;
  absl::Mutex mu_;
  uint64_t next_inode_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Inode> inodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> live_ ABSL_GUARDED_BY(mu_);  // path → inode, as now
  std::map<uint64_t, Handle> handles_ ABSL_GUARDED_BY(mu_);
  FsStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t armed_ ABSL_GUARDED_BY(mu_) = 0;  // writes until the power goes; 0: not armed
  bool thawed_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // cuts that ended a freeze or an arming
};

}  // namespace fencelock::powercut

#endif  // FENCELOCK_POWERCUT_FORGETFUL_FS_H_
