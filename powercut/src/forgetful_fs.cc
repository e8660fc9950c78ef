#include "powercut/forgetful_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logging/logging.h"

namespace fencelock::powercut {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kRoot = 1;
constexpr uint64_t kPiece = 4096;  // kKeepSome keeps or loses this much at a time

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string Child(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

// The live children of `dir` in a path → inode map ordered by path.
std::map<std::string, uint64_t> Children(const std::map<std::string, uint64_t>& live,
                                         const std::string& dir) {
  std::map<std::string, uint64_t> out;
  const std::string prefix = dir == "/" ? "/" : dir + "/";
  for (auto it = live.lower_bound(prefix); it != live.end() && it->first.starts_with(prefix);
       ++it) {
    const std::string name = it->first.substr(prefix.size());
    if (!name.empty() && name.find('/') == std::string::npos) out.emplace(name, it->second);
  }
  return out;
}

int Errno() { return -errno; }

// Copies the file `from` to `to` (replaced), keeping its mode. False on an error.
bool CopyFile(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  return !ec;
}

}  // namespace

std::string CutReport::ToString() const {
  return absl::StrCat(files, " files written back, ", unsynced_writes,
                      " unsynced writes and truncations, ", pieces_kept, " pieces of them kept, ",
                      pieces_dropped, " dropped; ", entries_lost,
                      " names whose create, rename or unlink was not synced");
}

ForgetfulFs::ForgetfulFs(std::string store, std::function<void(const std::string&)> log)
    : store_(std::move(store)),
      live_dir_(store_ + "/live"),
      durable_dir_(store_ + "/durable"),
      log_(std::move(log)) {}

ForgetfulFs::~ForgetfulFs() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, h] : handles_) close(h.fd);
}

absl::StatusOr<std::unique_ptr<ForgetfulFs>> ForgetfulFs::Open(
    const std::string& store, std::function<void(const std::string&)> log) {
  std::error_code ec;
  fs::create_directories(store + "/live", ec);
  if (!ec) fs::create_directories(store + "/durable", ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make ", store, "/live and ", store, "/durable: ", ec.message()));
  }
  std::unique_ptr<ForgetfulFs> f(new ForgetfulFs(store, std::move(log)));
  absl::MutexLock lock(&f->mu_);
  if (absl::Status s = f->Scan(); !s.ok()) return s;
  return f;
}

void ForgetfulFs::Log(const std::string& line) const {
  if (log_) {
    log_(line);
  } else {
    logging::Program().Error(absl::StrFormat("forgetfs: %s", line.c_str()));
  }
}

std::string ForgetfulFs::DurableCopy(uint64_t inode) const {
  return absl::StrCat(durable_dir_, "/", inode);
}

uint64_t ForgetfulFs::NewInode(bool dir) {
  const uint64_t id = next_inode_++;
  inodes_[id].dir = dir;
  return id;
}

// Takes what `live` holds as durable: every file's data copied, every directory's entries
// recorded as synced.
absl::Status ForgetfulFs::Scan() {
  std::error_code ec;
  fs::remove_all(durable_dir_, ec);
  fs::create_directories(durable_dir_, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot empty ", durable_dir_, ": ", ec.message()));
  inodes_.clear();
  live_.clear();
  next_inode_ = kRoot;
  live_["/"] = NewInode(/*dir=*/true);
  for (auto it = fs::recursive_directory_iterator(live_dir_, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string path = it->path().string().substr(live_dir_.size());
    const fs::file_status status = it->symlink_status(ec);
    if (fs::is_directory(status)) {
      live_[path] = NewInode(true);
      inodes_[live_[path]].mode = static_cast<mode_t>(status.permissions());
    } else if (fs::is_regular_file(status)) {
      const uint64_t id = NewInode(false);
      live_[path] = id;
      if (!CopyFile(it->path().string(), DurableCopy(id))) {
        return absl::InternalError(absl::StrCat("cannot copy ", it->path().string()));
      }
    } else {
      return absl::FailedPreconditionError(absl::StrCat(
          it->path().string(), " is neither a file nor a directory, which forgetfs does not model"));
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot read ", live_dir_, ": ", ec.message()));
  for (const auto& [path, id] : live_) {
    if (inodes_[id].dir) inodes_[id].synced = Children(live_, path);
  }
  return absl::OkStatus();
}

bool ForgetfulFs::WaitThawed() {
  const uint64_t generation = generation_;
  mu_.Await(absl::Condition(&thawed_));
  return generation == generation_;
}

void ForgetfulFs::Arm(int64_t writes) {
  absl::MutexLock lock(&mu_);
  armed_ = writes;
}

int ForgetfulFs::Refuse(const std::string& what) {
  absl::MutexLock lock(&mu_);
  ++stats_.refused;
  Log(absl::StrCat("refused: ", what, " (not modeled)"));
  return -EPERM;
}

int ForgetfulFs::GetAttr(const std::string& path, struct stat* st) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  return lstat(Live(path).c_str(), st) == 0 ? 0 : Errno();
}

int ForgetfulFs::FGetAttr(uint64_t handle, struct stat* st) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  auto it = handles_.find(handle);
  if (it == handles_.end()) return -EBADF;
  return fstat(it->second.fd, st) == 0 ? 0 : Errno();
}

int ForgetfulFs::ReadDir(const std::string& path, std::vector<std::string>* names) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  DIR* d = opendir(Live(path).c_str());
  if (d == nullptr) return Errno();
  while (const dirent* e = readdir(d)) names->push_back(e->d_name);
  closedir(d);
  return 0;
}

int ForgetfulFs::Mkdir(const std::string& path, mode_t mode) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  if (mkdir(Live(path).c_str(), mode) != 0) return Errno();
  struct stat st;
  const uint64_t id = NewInode(true);
  live_[path] = id;
  if (stat(Live(path).c_str(), &st) == 0) inodes_[id].mode = st.st_mode & 07777;
  return 0;
}

int ForgetfulFs::Rmdir(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  if (rmdir(Live(path).c_str()) != 0) return Errno();
  live_.erase(path);
  return 0;
}

int ForgetfulFs::Unlink(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  if (unlink(Live(path).c_str()) != 0) return Errno();
  live_.erase(path);
  return 0;
}

int ForgetfulFs::Rename(const std::string& from, const std::string& to, unsigned int flags) {
  {
    absl::MutexLock lock(&mu_);
    if (!WaitThawed()) return -EIO;
    auto it = live_.find(from);
    if (it == live_.end()) return -ENOENT;
    const bool dir = inodes_[it->second].dir;
    if (!dir && Parent(from) == Parent(to) && (flags & ~RENAME_NOREPLACE) == 0) {
      if (renameat2(AT_FDCWD, Live(from).c_str(), AT_FDCWD, Live(to).c_str(), flags) != 0) {
        return Errno();
      }
      const uint64_t id = it->second;
      live_.erase(it);
      live_[to] = id;
      return 0;
    }
  }
  return Refuse(absl::StrCat("rename ", from, " to ", to,
                             flags != 0 ? absl::StrCat(" with flags ", flags) : std::string(),
                             " (only a file's, within its directory)"));
}

int ForgetfulFs::OpenLocked(const std::string& path, int flags, mode_t mode, bool create,
                            uint64_t* handle) {
  // The offset of every write comes from the kernel: O_APPEND on the backing file would make
  // pwrite ignore it.
  const int backing_flags = (flags & ~(O_APPEND | O_CREAT | O_EXCL)) | O_CLOEXEC;
  auto it = live_.find(path);
  uint64_t id = 0;
  int fd = -1;
  if (it == live_.end()) {
    if (!create) return -ENOENT;
    fd = open(Live(path).c_str(), backing_flags | O_CREAT | O_EXCL, mode);
    if (fd < 0) return Errno();
    id = NewInode(false);
    const int copy = open(DurableCopy(id).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (copy < 0) {
      const int error = Errno();
      close(fd);
      unlink(Live(path).c_str());
      inodes_.erase(id);
      return error;
    }
    close(copy);
    live_[path] = id;
  } else {
    if (create && (flags & O_EXCL) != 0) return -EEXIST;
    id = it->second;
    if (inodes_[id].dir) return -EISDIR;
    fd = open(Live(path).c_str(), backing_flags);
    if (fd < 0) return Errno();
    if ((flags & O_TRUNC) != 0) inodes_[id].pending.push_back({.truncate = true, .offset = 0});
  }
  ++inodes_[id].open;
  *handle = next_handle_++;
  handles_[*handle] = Handle{.fd = fd, .inode = id};
  return 0;
}

int ForgetfulFs::Create(const std::string& path, mode_t mode, int flags, uint64_t* handle) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  return OpenLocked(path, flags, mode, /*create=*/true, handle);
}

int ForgetfulFs::Open(const std::string& path, int flags, uint64_t* handle) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  return OpenLocked(path, flags, 0, /*create=*/false, handle);
}

int ForgetfulFs::Read(uint64_t handle, char* buf, size_t size, off_t offset) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  auto it = handles_.find(handle);
  if (it == handles_.end()) return -EBADF;
  const ssize_t n = pread(it->second.fd, buf, size, offset);
  return n < 0 ? Errno() : static_cast<int>(n);
}

int ForgetfulFs::Write(uint64_t handle, const char* buf, size_t size, off_t offset) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  auto it = handles_.find(handle);
  if (it == handles_.end()) return -EBADF;
  const ssize_t n = pwrite(it->second.fd, buf, size, offset);
  if (n < 0) return Errno();
  if (n > 0) {
    inodes_[it->second.inode].pending.push_back(
        {.offset = static_cast<uint64_t>(offset), .data = std::string(buf, static_cast<size_t>(n))});
  }
  if (armed_ > 0 && --armed_ == 0) {
    // The power goes with this write in flight: nothing answers until the cut.
    thawed_ = false;
    ++stats_.freezes;
    mu_.Await(absl::Condition(&thawed_));
    return -EIO;
  }
  return static_cast<int>(n);
}

int ForgetfulFs::Truncate(const std::string& path, off_t size) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  auto it = live_.find(path);
  if (it == live_.end()) return -ENOENT;
  if (truncate(Live(path).c_str(), size) != 0) return Errno();
  inodes_[it->second].pending.push_back({.truncate = true, .offset = static_cast<uint64_t>(size)});
  return 0;
}

int ForgetfulFs::FTruncate(uint64_t handle, off_t size) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  auto it = handles_.find(handle);
  if (it == handles_.end()) return -EBADF;
  if (ftruncate(it->second.fd, size) != 0) return Errno();
  inodes_[it->second.inode].pending.push_back(
      {.truncate = true, .offset = static_cast<uint64_t>(size)});
  return 0;
}

int ForgetfulFs::Fallocate(uint64_t handle, int mode, off_t offset, off_t length) {
  if (mode != 0) return Refuse(absl::StrCat("fallocate with mode ", mode));
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  auto it = handles_.find(handle);
  if (it == handles_.end()) return -EBADF;
  struct stat st;
  if (fstat(it->second.fd, &st) != 0) return Errno();
  if (const int error = posix_fallocate(it->second.fd, offset, length); error != 0) return -error;
  // Plain allocation changes what a reader sees only by the size it may grow to.
  const uint64_t end = static_cast<uint64_t>(offset + length);
  if (end > static_cast<uint64_t>(st.st_size)) {
    inodes_[it->second.inode].pending.push_back({.truncate = true, .offset = end});
  }
  return 0;
}

void ForgetfulFs::ApplyPending(uint64_t inode) {
  Inode& node = inodes_[inode];
  if (node.pending.empty()) return;
  const int fd = open(DurableCopy(inode).c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    Log(absl::StrCat("cannot open ", DurableCopy(inode), ": ", std::strerror(errno)));
    return;
  }
  for (const Pending& p : node.pending) {
    const bool done = p.truncate ? ftruncate(fd, static_cast<off_t>(p.offset)) == 0
                                 : pwrite(fd, p.data.data(), p.data.size(),
                                          static_cast<off_t>(p.offset)) ==
                                       static_cast<ssize_t>(p.data.size());
    if (!done) Log(absl::StrCat("cannot update ", DurableCopy(inode), ": ", std::strerror(errno)));
  }
  close(fd);
  node.pending.clear();
}

int ForgetfulFs::Fsync(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  auto it = handles_.find(handle);
  if (it == handles_.end()) return -EBADF;
  ++stats_.syncs;
  ApplyPending(it->second.inode);
  return 0;
}

int ForgetfulFs::FsyncDir(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  auto it = live_.find(path);
  if (it == live_.end()) return -ENOENT;
  if (!inodes_[it->second].dir) return -ENOTDIR;
  ++stats_.dir_syncs;
  // The directory's entries now are what a cut leaves of it.
  inodes_[it->second].synced = Children(live_, path);
  return 0;
}

int ForgetfulFs::Release(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return -EBADF;
  close(it->second.fd);
  --inodes_[it->second.inode].open;
  handles_.erase(it);
  return 0;
}

int ForgetfulFs::Chmod(const std::string& path, mode_t mode) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  if (chmod(Live(path).c_str(), mode) != 0) return Errno();
  // Modes are not modeled: durable at once.
  if (auto it = live_.find(path); it != live_.end()) {
    if (inodes_[it->second].dir) {
      inodes_[it->second].mode = mode & 07777;
    } else {
      (void)chmod(DurableCopy(it->second).c_str(), mode);
    }
  }
  return 0;
}

int ForgetfulFs::Chown(const std::string& path, uid_t uid, gid_t gid) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  if (lchown(Live(path).c_str(), uid, gid) != 0) return Errno();
  if (auto it = live_.find(path); it != live_.end() && !inodes_[it->second].dir) {
    (void)chown(DurableCopy(it->second).c_str(), uid, gid);
  }
  return 0;
}

int ForgetfulFs::Utimens(const std::string& path, const struct timespec times[2]) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  return utimensat(AT_FDCWD, Live(path).c_str(), times, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : Errno();
}

int ForgetfulFs::Statfs(struct statvfs* st) {
  absl::MutexLock lock(&mu_);
  if (!WaitThawed()) return -EIO;
  return statvfs(live_dir_.c_str(), st) == 0 ? 0 : Errno();
}

FsStats ForgetfulFs::Stats() {
  absl::MutexLock lock(&mu_);
  FsStats s = stats_;
  s.armed = armed_ > 0;
  s.frozen = !thawed_;
  s.open_handles = static_cast<int64_t>(handles_.size());
  for (const auto& [path, id] : live_) {
    if (!inodes_[id].dir) ++s.files;
  }
  for (const auto& [id, node] : inodes_) {
    s.unsynced_writes += static_cast<int64_t>(node.pending.size());
    for (const Pending& p : node.pending) s.unsynced_bytes += static_cast<int64_t>(p.data.size());
  }
  for (const auto& [path, id] : live_) {
    if (inodes_[id].dir && inodes_[id].synced != Children(live_, path)) ++s.unsynced_dirs;
  }
  return s;
}

absl::StatusOr<CutReport> ForgetfulFs::Cut(const CutOptions& options) {
  if (options.unsynced == Unsynced::kTear && options.tear_unit != 512 &&
      options.tear_unit != 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tear at ", options.tear_unit, " bytes: 512 (a sector) or 4096 (a page)"));
  }
  absl::MutexLock lock(&mu_);
  // Whatever waits for the power to go, or waits with it gone, fails now; their processes are
  // dead, and their files close once they return.
  if (!thawed_ || armed_ > 0) {
    thawed_ = true;
    armed_ = 0;
    ++generation_;
  }
  if (!handles_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        handles_.size(), " files are still open: stop every process that uses the file system "
                         "before the power cut"));
  }
  CutReport report;
  std::mt19937_64 rng(options.seed);
  // What each file's disk holds: its durable copy, and what the cut keeps of the rest.
  for (auto& [id, node] : inodes_) {
    if (node.dir || node.pending.empty()) continue;
    report.unsynced_writes += static_cast<int64_t>(node.pending.size());
    std::vector<Pending> kept;
    if (options.unsynced == Unsynced::kKeepSome) {
      for (const Pending& p : node.pending) {
        if (p.truncate) {
          if (rng() % 2 == 0) {
            kept.push_back(p);
            ++report.pieces_kept;
          } else {
            ++report.pieces_dropped;
          }
          continue;
        }
        for (uint64_t at = 0; at < p.data.size();) {
          // Pieces end at 4 KiB boundaries of the file, as pages do.
          const uint64_t offset = p.offset + at;
          const uint64_t len = std::min<uint64_t>(kPiece - offset % kPiece, p.data.size() - at);
          if (rng() % 2 == 0) {
            kept.push_back({.offset = offset, .data = p.data.substr(at, len)});
            ++report.pieces_kept;
          } else {
            ++report.pieces_dropped;
          }
          at += len;
        }
      }
      std::shuffle(kept.begin(), kept.end(), rng);
    } else if (options.unsynced == Unsynced::kTear) {
      const Pending& last = node.pending.back();
      if (!last.truncate) {
        // A prefix that ends at a boundary inside the write (or none of it).
        std::vector<uint64_t> ends = {0};
        for (uint64_t b = (last.offset / options.tear_unit + 1) * options.tear_unit;
             b < last.offset + last.data.size(); b += options.tear_unit) {
          ends.push_back(b - last.offset);
        }
        const uint64_t end = ends[rng() % ends.size()];
        if (end > 0) {
          kept.push_back({.offset = last.offset, .data = last.data.substr(0, end)});
          ++report.pieces_kept;
        }
        report.pieces_dropped += end < last.data.size() ? 1 : 0;
      }
      report.pieces_dropped += static_cast<int64_t>(node.pending.size()) - 1;
    } else {
      report.pieces_dropped += static_cast<int64_t>(node.pending.size());
    }
    node.pending = std::move(kept);
    ApplyPending(id);
  }
  // The durable tree, from the root through each directory's synced entries.
  std::map<std::string, uint64_t> survivors;
  std::vector<std::string> dirs = {"/"};
  survivors["/"] = kRoot;
  while (!dirs.empty()) {
    const std::string dir = dirs.back();
    dirs.pop_back();
    for (const auto& [name, id] : inodes_[survivors[dir]].synced) {
      const std::string path = Child(dir, name);
      survivors[path] = id;
      if (inodes_[id].dir) dirs.push_back(path);
    }
  }
  for (const auto& [path, id] : live_) {
    auto s = survivors.find(path);
    if (s == survivors.end() || s->second != id) ++report.entries_lost;
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(live_dir_, ec)) fs::remove_all(entry.path(), ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot empty ", live_dir_, ": ", ec.message()));
  for (const auto& [path, id] : survivors) {  // ordered: a directory before its entries
    if (path == "/") continue;
    if (inodes_[id].dir) {
      if (fs::create_directory(Live(path), ec)) {
        fs::permissions(Live(path), static_cast<fs::perms>(inodes_[id].mode), ec);
      }
    } else if (CopyFile(DurableCopy(id), Live(path))) {
      ++report.files;
    } else {
      ec = std::make_error_code(std::errc::io_error);
    }
    if (ec) return absl::InternalError(absl::StrCat("cannot write back ", Live(path)));
  }
  // Power is back: what is on the disk is all there is, and all of it is durable.
  if (absl::Status s = Scan(); !s.ok()) return s;
  ++stats_.cuts;
  Log(absl::StrCat("power cut: ", report.ToString()));
  return report;
}

}  // namespace fencelock::powercut
