#include "lock-server/env.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <system_error>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace fencelock::server {
namespace {

absl::Status ErrnoStatus(const char* op, const std::string& path, int err) {
  std::string message = absl::StrCat(op, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EMFILE:
    case ENFILE:
      // The process (or the system) is out of descriptors: nothing was opened, so nothing
      // was done; the caller may try again (OutOfDescriptors).
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteAll(int fd, const std::string& path, std::string_view data, uint64_t offset) {
  while (!data.empty()) {
    const ssize_t n = pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// A large file lockd writes beside the WAL (a snapshot, a segment's zeros) goes to the disk
// this much at a time, each piece synced: with more of it dirty at once, the WAL's next
// fdatasync waits for the device to take all of it (46 ms for 16 MiB on the benchmark machine,
// 1 ms for 1 MiB), and with all of it, ext4 may order a journal commit after it.
constexpr uint64_t kSyncedPiece = uint64_t{1} << 20;

class PosixSegment final : public SegmentFile {
 public:
  PosixSegment(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixSegment() override { close(fd_); }
  absl::Status WriteAt(uint64_t offset, std::string_view data) override {
    return WriteAll(fd_, path_, data, offset);
  }
  absl::Status Sync() override {
    if (fdatasync(fd_) != 0) return ErrnoStatus("fdatasync", path_, errno);
    return absl::OkStatus();
  }

 private:
  int fd_;
  std::string path_;
};

class PosixFileLock final : public FileLock {
 public:
  PosixFileLock(int dir_fd, int fd) : dir_fd_(dir_fd), fd_(fd) {}
  ~PosixFileLock() override {  // closing the descriptors releases the flocks
    close(fd_);
    if (dir_fd_ >= 0) close(dir_fd_);
  }

 private:
  int dir_fd_;  // -1: the file alone
  int fd_;
};

// Opens `path` (made with `mode` if missing) and holds an exclusive flock on it, its content
// then `owner`. Never follows a symbolic link, and refuses anything but a regular file with one
// link owned by this process's user or root: in a world-writable directory (/run/lock) another
// user could otherwise point the name at a file of ours, which the owner's line would then
// overwrite. Nothing is written before the lock is held. Held elsewhere: kFailedPrecondition
// naming the holder (the file's content) and ending in `rule`. Returns the descriptor, whose
// closing lets go.
absl::StatusOr<int> LockOneFile(const std::string& path, const std::string& owner, mode_t mode,
                                const std::string& rule) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode);
  bool writable = true;
  if (fd < 0 && errno == EACCES) {  // another user's file: a lock needs no write access
    fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    writable = false;
  }
  if (fd < 0 && errno == ELOOP) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is a symbolic link; lockd locks only a regular file of its own (remove it)"));
  }
  if (fd < 0) return ErrnoStatus("open", path, errno);
  struct stat st {};
  absl::Status refused;
  if (fstat(fd, &st) != 0) {
    refused = ErrnoStatus("fstat", path, errno);
  } else if (!S_ISREG(st.st_mode)) {
    refused = absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file; lockd locks only a regular file of its own"));
  } else if (st.st_uid != geteuid() && st.st_uid != 0) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        path, " belongs to uid ", st.st_uid, ", neither lockd's user (uid ", geteuid(),
        ") nor root; lockd will not lock (or write into) another user's file"));
  } else if (st.st_nlink != 1) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        path, " has ", st.st_nlink, " hard links; lockd locks only a file with one name"));
  }
  if (!refused.ok()) {
    close(fd);
    return refused;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t n = pread(fd, holder.data(), holder.size(), 0);
    close(fd);
    if (err != EWOULDBLOCK) return ErrnoStatus("flock", path, err);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is locked by ", holder.empty() ? "another process" : holder, ": ", rule));
  }
  if (!writable) return fd;  // held, though it cannot say by whom
  // Held: only now is the previous holder's line replaced.
  absl::Status s;
  if (ftruncate(fd, 0) != 0) s = ErrnoStatus("ftruncate", path, errno);
  if (s.ok()) s = WriteAll(fd, path, owner + "\n", 0);
  if (!s.ok()) {
    close(fd);
    return s;
  }
  return fd;
}

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open", path, errno);
    std::string contents;
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        close(fd);
        return ErrnoStatus("read", path, err);
      }
      if (n == 0) break;
      contents.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return contents;
  }

  absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) override {
    const std::string tmp = path + ".tmp";
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoStatus("create", tmp, errno);
    // A large file (a snapshot of millions of locks is hundreds of MB) goes kSyncedPiece at a
    // time.
    absl::Status s;
    for (size_t at = 0; s.ok() && at < contents.size(); at += kSyncedPiece) {
      s = WriteAll(fd, tmp, contents.substr(at, kSyncedPiece), at);
      if (s.ok() && contents.size() > kSyncedPiece && fdatasync(fd) != 0) {
        s = ErrnoStatus("fdatasync", tmp, errno);
      }
    }
    if (s.ok() && fsync(fd) != 0) s = ErrnoStatus("fsync", tmp, errno);
    close(fd);
    if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoStatus("rename", tmp, errno);
    if (!s.ok()) {
      unlink(tmp.c_str());
      return s;
    }
    return SyncDir(Parent(path));
  }

  absl::StatusOr<std::unique_ptr<SegmentFile>> CreateSegment(const std::string& path,
                                                             std::string_view header,
                                                             uint64_t size) override {
    const std::string tmp = path + ".tmp";
    if (TakePrepared(path, size)) {
      // Made ahead: only its header, the rename and the directory's sync are left.
      if (const int fd = open(tmp.c_str(), O_WRONLY | O_CLOEXEC); fd >= 0) {
        struct stat st {};
        const bool ready = fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == size &&
                           WriteAll(fd, tmp, header, 0).ok() && fdatasync(fd) == 0;
        close(fd);
        if (ready && rename(tmp.c_str(), path.c_str()) == 0) {
          if (absl::Status s = SyncDir(Parent(path)); !s.ok()) return s;
          return OpenSegment(path);
        }
      }
      // Gone or damaged in between (a stale temporary file removed at open): made here.
    }
    // A new file, never one left at the temporary name truncated.
    unlink(tmp.c_str());
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoStatus("create", tmp, errno);
    absl::Status s = WriteZeros(fd, tmp, size);
    if (s.ok()) s = WriteAll(fd, tmp, header, 0);
    if (s.ok() && fsync(fd) != 0) s = ErrnoStatus("fsync", tmp, errno);
    close(fd);
    if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) s = ErrnoStatus("rename", tmp, errno);
    if (s.ok()) s = SyncDir(Parent(path));
    if (!s.ok()) {
      unlink(tmp.c_str());
      return s;
    }
    return OpenSegment(path);
  }

  void PrepareSegment(const std::string& path, uint64_t size) override {
    if (size < (64 << 10)) return;  // made about as fast at the rotation
    {
      absl::MutexLock lock(&prepared_mu_);
      if (!prepared_.try_emplace(path, Prepared{.size = size}).second) return;
    }
    // The process's one PosixEnv is never destroyed, so the thread may outlive its caller. With
    // no thread to be had, the segment is made at the rotation.
    try {
      std::thread([this, path, size] { MakePrepared(path, size); }).detach();
    } catch (const std::system_error&) {
      absl::MutexLock lock(&prepared_mu_);
      prepared_.erase(path);
    }
  }

  absl::StatusOr<std::unique_ptr<SegmentFile>> OpenSegment(const std::string& path) override {
    const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open", path, errno);
    return std::make_unique<PosixSegment>(fd, path);
  }

  absl::StatusOr<Kind> KindOf(const std::string& path) override {
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) return ErrnoStatus("lstat", path, errno);
    if (S_ISREG(st.st_mode)) return Kind::kFile;
    if (S_ISDIR(st.st_mode)) return Kind::kDirectory;
    if (S_ISLNK(st.st_mode)) return Kind::kSymlink;
    return Kind::kOther;
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus("opendir", dir, errno);
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
    return names;
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return ErrnoStatus("unlink", path, errno);
    return absl::OkStatus();
  }

  absl::Status CreateDir(const std::string& dir) override {
    if (mkdir(dir.c_str(), 0700) != 0) return ErrnoStatus("mkdir", dir, errno);
    return SyncDir(Parent(dir));
  }

  absl::Status RemoveDir(const std::string& dir) override {
    if (rmdir(dir.c_str()) != 0) {
      const int err = errno;
      if (err == ENOTEMPTY || err == EEXIST) {
        return absl::FailedPreconditionError(absl::StrCat("rmdir ", dir, ": not empty"));
      }
      return ErrnoStatus("rmdir", dir, err);
    }
    return SyncDir(Parent(dir));
  }

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path,
                                                     const std::string& owner) override {
    // The directory that holds the file is locked too: removing the file (by hand, or a
    // cleanup script) then cannot let a second server in beside the first.
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) return ErrnoStatus("open", dir, errno);
    if (flock(dir_fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      close(dir_fd);
      if (err != EWOULDBLOCK) return ErrnoStatus("flock", dir, err);
      auto holder = ReadFile(path);
      std::string name = holder.ok() ? std::string(*holder) : std::string();
      while (!name.empty() && (name.back() == '\n' || name.back() == '\0')) name.pop_back();
      return absl::FailedPreconditionError(absl::StrCat(
          dir, " is locked by ",
          name.empty() ? absl::StrCat("another process (", path, " is missing or empty)") : name,
          ": one state directory has exactly one server"));
    }
    auto fd = LockOneFile(path, owner, 0600, "one state directory has exactly one server");
    if (!fd.ok()) {
      close(dir_fd);
      return fd.status();
    }
    return std::make_unique<PosixFileLock>(dir_fd, *fd);
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus("open", dir, errno);
    absl::Status s;
    if (fsync(fd) != 0) s = ErrnoStatus("fsync", dir, errno);
    close(fd);
    return s;
  }

 private:
  struct Prepared {
    uint64_t size = 0;
    bool done = false;  // the thread making it has finished
    bool ok = false;    // and it is there, complete and synced
  };

  // Real zeros rather than a sparse file or unwritten extents: a segment's later fdatasyncs
  // then flush data only, and a full disk shows up where it is made, not in the middle of a
  // commit. kSyncedPiece at a time.
  static absl::Status WriteZeros(int fd, const std::string& path, uint64_t size) {
    const std::string zeros(std::min<uint64_t>(size, kSyncedPiece), '\0');
    for (uint64_t at = 0; at < size; at += zeros.size()) {
      const uint64_t n = std::min<uint64_t>(zeros.size(), size - at);
      if (absl::Status s = WriteAll(fd, path, std::string_view(zeros).substr(0, n), at); !s.ok()) {
        return s;
      }
      if (fdatasync(fd) != 0) return ErrnoStatus("fdatasync", path, errno);
    }
    return absl::OkStatus();
  }

  // PrepareSegment's thread: zeros at path + ".tmp", synced; whether they are there, for
  // TakePrepared.
  void MakePrepared(const std::string& path, uint64_t size) {
    const std::string tmp = path + ".tmp";
    absl::Status s;
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      s = ErrnoStatus("create", tmp, errno);
    } else {
      s = WriteZeros(fd, tmp, size);
      if (s.ok() && fsync(fd) != 0) s = ErrnoStatus("fsync", tmp, errno);
      close(fd);
    }
    if (!s.ok()) unlink(tmp.c_str());  // made at the rotation instead, where a failure counts
    absl::MutexLock lock(&prepared_mu_);
    Prepared& p = prepared_[path];
    p.done = true;
    p.ok = s.ok();
  }

  // Whether `path` was made ahead, complete, at `size`; waits for the thread making it. Either
  // way it is no longer prepared.
  bool TakePrepared(const std::string& path, uint64_t size) {
    absl::MutexLock lock(&prepared_mu_);
    auto it = prepared_.find(path);
    if (it == prepared_.end()) return false;
    const Prepared* p = &it->second;
    prepared_mu_.Await(absl::Condition(
        +[](const Prepared* p) { return p->done; }, p));
    const bool usable = p->ok && p->size == size;
    prepared_.erase(it);
    return usable;
  }

  absl::Mutex prepared_mu_;
  std::map<std::string, Prepared> prepared_ ABSL_GUARDED_BY(prepared_mu_);
};


}  // namespace

absl::StatusOr<std::unique_ptr<FileLock>> LockHostFile(const std::string& path,
                                                       const std::string& owner,
                                                       const std::string& rule) {
  // World-readable, so that a second process of another user can name the holder.
  auto fd = LockOneFile(path, owner, 0644, rule);
  if (!fd.ok()) return fd.status();
  return std::make_unique<PosixFileLock>(-1, *fd);
}

Env* Env::Posix() {
  static Env* env = new PosixEnv();
  return env;
}

}  // namespace fencelock::server
