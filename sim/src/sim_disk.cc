#include "sim_disk.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fencelock::sim {

class SimSegment final : public server::SegmentFile {
 public:
  SimSegment(SimDisk* disk, std::string path) : disk_(disk), path_(std::move(path)) {}
  absl::Status WriteAt(uint64_t offset, std::string_view data) override {
    auto it = disk_->files_.find(path_);
    if (it == disk_->files_.end()) return absl::NotFoundError(path_);
    if (offset + data.size() > it->second.written.size()) {
      return absl::InvalidArgumentError(absl::StrCat("write past the end of ", path_));
    }
    it->second.written.replace(offset, data.size(), data);
    return absl::OkStatus();
  }
  absl::Status Sync() override { return disk_->SyncFile(path_); }

 private:
  SimDisk* disk_;
  std::string path_;
};

absl::Status SimDisk::SyncFile(const std::string& path) {
  if (fail_next_sync_) {
    fail_next_sync_ = false;
    return absl::DataLossError(absl::StrCat("fdatasync ", path, ": Input/output error (simulated)"));
  }
  auto it = files_.find(path);
  if (it == files_.end()) return absl::NotFoundError(path);
  it->second.durable = it->second.written;
  return absl::OkStatus();
}

absl::StatusOr<std::string> SimDisk::ReadFile(const std::string& path) {
  auto it = files_.find(path);
  if (it == files_.end()) return absl::NotFoundError(absl::StrCat("open ", path, ": no such file"));
  return it->second.written;
}

absl::Status SimDisk::WriteFileAtomically(const std::string& path, std::string_view contents) {
  if (fail_next_sync_) {
    fail_next_sync_ = false;
    return absl::DataLossError(absl::StrCat("fsync ", path, ".tmp: Input/output error (simulated)"));
  }
  files_[path] = File{std::string(contents), std::string(contents)};
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<server::SegmentFile>> SimDisk::CreateSegment(
    const std::string& path, std::string_view header, uint64_t size) {
  std::string contents(size, '\0');
  contents.replace(0, header.size(), header);
  files_[path] = File{contents, contents};
  return std::make_unique<SimSegment>(this, path);
}

absl::StatusOr<std::unique_ptr<server::SegmentFile>> SimDisk::OpenSegment(const std::string& path) {
  if (!files_.contains(path)) return absl::NotFoundError(absl::StrCat("open ", path));
  return std::make_unique<SimSegment>(this, path);
}

absl::StatusOr<server::Env::Kind> SimDisk::KindOf(const std::string& path) {
  if (files_.contains(path)) return Kind::kFile;
  if (dirs_.contains(path)) return Kind::kDirectory;
  return absl::NotFoundError(absl::StrCat("lstat ", path));
}

absl::StatusOr<std::vector<std::string>> SimDisk::ListDir(const std::string& dir) {
  if (!dirs_.contains(dir)) return absl::NotFoundError(absl::StrCat("opendir ", dir));
  std::vector<std::string> names;
  const std::string prefix = dir + "/";
  for (const auto& [path, file] : files_) {
    if (path.compare(0, prefix.size(), prefix) == 0) names.push_back(path.substr(prefix.size()));
  }
  return names;
}

absl::Status SimDisk::RemoveFile(const std::string& path) {
  if (files_.erase(path) == 0) return absl::NotFoundError(absl::StrCat("unlink ", path));
  return absl::OkStatus();
}

absl::Status SimDisk::RemoveDir(const std::string& dir) {
  const std::string prefix = dir + "/";
  for (const auto& [path, file] : files_) {
    if (path.compare(0, prefix.size(), prefix) == 0) {
      return absl::FailedPreconditionError(absl::StrCat("rmdir ", dir, ": not empty"));
    }
  }
  if (dirs_.erase(dir) == 0) return absl::NotFoundError(absl::StrCat("rmdir ", dir));
  return absl::OkStatus();
}

absl::Status SimDisk::CreateDir(const std::string& dir) {
  dirs_.insert(dir);
  return absl::OkStatus();
}

void SimDisk::Crash(const std::function<uint64_t(uint64_t)>& keep) {
  for (auto& [path, file] : files_) {
    if (file.written == file.durable) continue;
    // The first and last bytes that differ bound the unsynced writes; a torn write keeps a
    // prefix of them, in the order they would reach the platter.
    const auto mismatch =
        std::mismatch(file.written.begin(), file.written.end(), file.durable.begin());
    const size_t first = static_cast<size_t>(mismatch.first - file.written.begin());
    size_t last = file.written.size();
    while (last > first && file.written[last - 1] == file.durable[last - 1]) --last;
    const uint64_t kept = std::min<uint64_t>(keep(last - first), last - first);
    std::string result = file.durable;
    result.replace(first, kept, file.written, first, kept);
    file.durable = result;
    file.written = result;
  }
}

}  // namespace fencelock::sim
