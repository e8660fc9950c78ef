#include "powered_mount.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "powercut/control.h"

namespace fencelock::powercut {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string LastLine(const std::string& text) {
  if (text.size() < 2) return text;
  const size_t newline = text.rfind('\n', text.size() - 2);
  return newline == std::string::npos ? text : text.substr(newline + 1);
}

std::string CutTally::Describe() const {
  return absl::StrCat(unsynced, " unsynced writes at the cuts (", kept, " pieces kept, ", dropped,
                      " dropped; ", in_flight, " cuts with a write in flight), ", names_lost,
                      " names lost");
}

PoweredMount::~PoweredMount() {
  if (fs_.running()) {
    umount2(path().c_str(), MNT_DETACH);
    fs_.Stop(absl::Seconds(5));
  }
}

absl::Status PoweredMount::Mount() {
  std::filesystem::create_directories(path());
  std::filesystem::create_directories(dir_ + "/logs");
  auto fs = process::Child::Spawn(
      binary_, {"--store=" + dir_ + "/store", "--control=" + dir_ + "/control", path()},
      {.stdout_file = dir_ + "/logs/forgetfs.log", .stderr_file = dir_ + "/logs/forgetfs.log"});
  if (!fs.ok()) return fs.status();
  fs_ = std::move(*fs);
  for (int i = 0; i < 500; ++i) {
    if (absl::StrContains(ReadFile("/proc/self/mounts"), " " + path() + " fuse.forgetfs ") &&
        Control(dir_ + "/control", "stats").ok()) {
      return absl::OkStatus();
    }
    if (fs_.Wait(absl::ZeroDuration()).has_value()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::UnavailableError(absl::StrCat("forgetfs did not mount on ", path(), "; see ", dir_,
                                             "/logs/forgetfs.log"));
}

absl::StatusOr<std::string> PoweredMount::MakeDurableDirectory(const std::string& name) {
  const std::string made = path() + "/" + name;
  if (mkdir(made.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrCat("cannot make ", made, ": ", std::strerror(errno)));
  }
  for (const std::string& dir : {made, path()}) {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
      const int error = errno;
      if (fd >= 0) close(fd);
      return absl::UnavailableError(absl::StrCat("cannot sync ", dir, ": ", std::strerror(error)));
    }
    close(fd);
  }
  return made;
}

absl::StatusOr<bool> PoweredMount::MaybeArm(std::mt19937_64& rng) {
  if (rng() % 2 != 0) return false;
  auto armed = Control(dir_ + "/control", absl::StrCat("arm ", 1 + rng() % 400));
  if (!armed.ok()) return armed.status();
  return true;
}

bool PoweredMount::RunUntil(absl::Duration load, bool armed, absl::Duration poll) {
  const absl::Time until = absl::Now() + load;
  while (absl::Now() < until) {
    absl::SleepFor(poll);
    if (!armed) continue;
    auto stats = Control(dir_ + "/control", "stats");
    if (stats.ok() && absl::StrContains(*stats, "frozen=1")) return true;
  }
  return false;
}

absl::Status PoweredMount::Cut(std::mt19937_64& rng, bool was_frozen, CutTally& tally) {
  static const char* const kModes[] = {"drop", "keep-some", "tear-sector", "tear-page"};
  const std::string mode = kModes[rng() % 4];
  auto cut = Control(dir_ + "/control", absl::StrCat("cut ", mode, " seed=", rng()));
  if (!cut.ok()) return cut.status();
  ++tally.cuts;
  if (was_frozen) ++tally.in_flight;
  // "N files written back, U unsynced writes and truncations, K pieces of them kept, D
  // dropped; L names ..."
  long files = 0, unsynced = 0, kept = 0, dropped = 0, lost = 0;
  if (std::sscanf(cut->c_str(),
                  "%ld files written back, %ld unsynced writes and truncations, %ld pieces of "
                  "them kept, %ld dropped; %ld names",
                  &files, &unsynced, &kept, &dropped, &lost) == 5) {
    tally.unsynced += unsynced;
    tally.kept += kept;
    tally.dropped += dropped;
    tally.names_lost += lost;
  }
  return absl::OkStatus();
}

}  // namespace fencelock::powercut
