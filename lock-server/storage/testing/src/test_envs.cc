#include "lock-server/testing/test_envs.h"

#include "absl/strings/str_cat.h"

namespace fencelock::server {

class MemSegment final : public SegmentFile {
 public:
  MemSegment(MemEnv* env, std::string path) : env_(env), path_(std::move(path)) {}
  absl::Status WriteAt(uint64_t offset, std::string_view data) override {
    absl::MutexLock lock(&env_->mu_);
    auto it = env_->files_.find(path_);
    if (it == env_->files_.end()) return absl::NotFoundError(path_);
    if (offset + data.size() > it->second.size()) {
      return absl::InvalidArgumentError(absl::StrCat("write past the end of ", path_));
    }
    it->second.replace(offset, data.size(), data);
    return absl::OkStatus();
  }
  absl::Status Sync() override { return absl::OkStatus(); }

 private:
  MemEnv* env_;
  std::string path_;
};

absl::StatusOr<std::string> MemEnv::ReadFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return absl::NotFoundError(absl::StrCat("open ", path, ": no such file"));
  return it->second;
}

absl::Status MemEnv::WriteFileAtomically(const std::string& path, std::string_view contents) {
  absl::MutexLock lock(&mu_);
  files_[path] = std::string(contents);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SegmentFile>> MemEnv::CreateSegment(const std::string& path,
                                                                   std::string_view header,
                                                                   uint64_t size) {
  {
    absl::MutexLock lock(&mu_);
    std::string contents(size, '\0');
    contents.replace(0, header.size(), header);
    files_[path] = std::move(contents);
  }
  return OpenSegment(path);
}

absl::StatusOr<std::unique_ptr<SegmentFile>> MemEnv::OpenSegment(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (!files_.contains(path)) return absl::NotFoundError(absl::StrCat("open ", path));
  return std::make_unique<MemSegment>(this, path);
}

absl::StatusOr<Env::Kind> MemEnv::KindOf(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (files_.contains(path)) return Kind::kFile;
  if (dirs_.contains(path)) return Kind::kDirectory;
  auto next = files_.lower_bound(path + "/");
  if (next != files_.end() && next->first.rfind(path + "/", 0) == 0) return Kind::kDirectory;
  return absl::NotFoundError(absl::StrCat("lstat ", path, ": no such file or directory"));
}

absl::StatusOr<std::vector<std::string>> MemEnv::ListDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  const std::string prefix = dir + "/";
  std::vector<std::string> names;
  bool any = dirs_.contains(dir);
  for (const auto& [path, contents] : files_) {
    if (path.rfind(prefix, 0) == 0 && path.find('/', prefix.size()) == std::string::npos) {
      names.push_back(path.substr(prefix.size()));
      any = true;
    }
  }
  if (!any) return absl::NotFoundError(absl::StrCat("opendir ", dir, ": no such directory"));
  return names;
}

absl::Status MemEnv::RemoveFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (files_.erase(path) == 0) return absl::NotFoundError(absl::StrCat("unlink ", path));
  return absl::OkStatus();
}

absl::Status MemEnv::RemoveDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  const std::string prefix = dir + "/";
  for (const auto& [path, contents] : files_) {
    if (path.rfind(prefix, 0) == 0) {
      return absl::FailedPreconditionError(absl::StrCat("rmdir ", dir, ": not empty"));
    }
  }
  if (dirs_.erase(dir) == 0) return absl::NotFoundError(absl::StrCat("rmdir ", dir));
  return absl::OkStatus();
}

absl::Status MemEnv::CreateDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  dirs_[dir] = true;
  return absl::OkStatus();
}

class MemFileLock final : public FileLock {
 public:
  MemFileLock(MemEnv* env, std::string path) : env_(env), path_(std::move(path)) {}
  ~MemFileLock() override {
    absl::MutexLock lock(&env_->mu_);
    env_->locked_.erase(path_);
  }

 private:
  MemEnv* env_;
  std::string path_;
};

absl::StatusOr<std::unique_ptr<FileLock>> MemEnv::LockFile(const std::string& path,
                                                           const std::string& owner) {
  absl::MutexLock lock(&mu_);
  if (auto it = locked_.find(path); it != locked_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is locked by ", it->second, ": one state directory has exactly one server"));
  }
  locked_[path] = owner;
  files_[path] = owner + "\n";
  return std::make_unique<MemFileLock>(this, path);
}

void MemEnv::PutFile(const std::string& path, std::string contents) {
  absl::MutexLock lock(&mu_);
  files_[path] = std::move(contents);
}

std::map<std::string, std::string> MemEnv::Files() const {
  absl::MutexLock lock(&mu_);
  return files_;
}

// ---- FaultInjectingEnv ----

namespace {
class FaultySegment final : public SegmentFile {
 public:
  FaultySegment(FaultInjectingEnv* env, std::unique_ptr<SegmentFile> base)
      : env_(env), base_(std::move(base)) {}
  absl::Status WriteAt(uint64_t offset, std::string_view data) override {
    if (absl::Status s = env_->Check(); !s.ok()) return s;
    return base_->WriteAt(offset, data);
  }
  absl::Status Sync() override {
    if (absl::Status s = env_->Check(); !s.ok()) return s;
    return base_->Sync();
  }

 private:
  FaultInjectingEnv* env_;
  std::unique_ptr<SegmentFile> base_;
};
}  // namespace

void FaultInjectingEnv::SetDiskFull(bool full) {
  absl::MutexLock lock(&mu_);
  full_ = full;
}
bool FaultInjectingEnv::disk_full() const {
  absl::MutexLock lock(&mu_);
  return full_;
}
int FaultInjectingEnv::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

absl::Status FaultInjectingEnv::Check() {
  absl::MutexLock lock(&mu_);
  if (!full_) return absl::OkStatus();
  ++refused_;
  return absl::ResourceExhaustedError("No space left on device (injected)");
}

absl::Status FaultInjectingEnv::WriteFileAtomically(const std::string& path,
                                                    std::string_view contents) {
  if (absl::Status s = Check(); !s.ok()) return s;
  return base_->WriteFileAtomically(path, contents);
}

absl::StatusOr<std::unique_ptr<SegmentFile>> FaultInjectingEnv::CreateSegment(
    const std::string& path, std::string_view header, uint64_t size) {
  if (absl::Status s = Check(); !s.ok()) return s;
  auto segment = base_->CreateSegment(path, header, size);
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<SegmentFile>(std::make_unique<FaultySegment>(this, std::move(*segment)));
}

absl::StatusOr<std::unique_ptr<SegmentFile>> FaultInjectingEnv::OpenSegment(
    const std::string& path) {
  auto segment = base_->OpenSegment(path);
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<SegmentFile>(std::make_unique<FaultySegment>(this, std::move(*segment)));
}

absl::Status FaultInjectingEnv::RemoveFile(const std::string& path) {
  if (absl::Status s = Check(); !s.ok()) return s;
  return base_->RemoveFile(path);
}

absl::Status FaultInjectingEnv::RemoveDir(const std::string& dir) {
  if (absl::Status s = Check(); !s.ok()) return s;
  return base_->RemoveDir(dir);
}

absl::Status FaultInjectingEnv::CreateDir(const std::string& dir) {
  if (absl::Status s = Check(); !s.ok()) return s;
  return base_->CreateDir(dir);
}

absl::Status FaultInjectingEnv::SyncDir(const std::string& dir) {
  if (absl::Status s = Check(); !s.ok()) return s;
  return base_->SyncDir(dir);
}

}  // namespace fencelock::server
