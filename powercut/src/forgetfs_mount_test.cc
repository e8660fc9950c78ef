// fencelock-forgetfs mounted for real (FUSE, /dev/fuse, root): what programs do with
// ordinary system calls on the mount is what a cut keeps or loses, and after a cut every reader
// sees what survived, not what the kernel had cached.
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "powercut/control.h"
#include "process/process.h"

namespace fencelock::powercut {
namespace {

using ::testing::HasSubstr;

class ForgetfsMountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/forgetfs-mount-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(Mnt());
    auto fs = process::Child::Spawn(
        FORGETFS_BINARY, {"--store=" + dir_ + "/store", "--control=" + Ctl(), Mnt()},
        {.stdout_file = dir_ + "/fs.log", .stderr_file = dir_ + "/fs.log"});
    ASSERT_TRUE(fs.ok()) << fs.status();
    fs_ = std::move(*fs);
    for (int i = 0; i < 500 && !Control(Ctl(), "stats").ok(); ++i) {
      ASSERT_FALSE(fs_.Wait(absl::ZeroDuration()).has_value()) << Read(dir_ + "/fs.log");
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_TRUE(Control(Ctl(), "stats").ok())
        << "forgetfs did not mount (it needs /dev/fuse and root): " << Read(dir_ + "/fs.log");
  }
  void TearDown() override {
    umount2(Mnt().c_str(), MNT_DETACH);
    fs_.Stop();
    std::filesystem::remove_all(dir_);
  }
  std::string Mnt() const { return dir_ + "/mnt"; }
  std::string Ctl() const { return dir_ + "/control"; }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "<absent>";
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Writes `data` to `path` with write(2), fsync(2)ing it if `sync`.
  static void Put(const std::string& path, const std::string& data, bool sync) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    if (sync) {
      ASSERT_EQ(fsync(fd), 0);
    }
    close(fd);
  }
  static void SyncDir(const std::string& dir) {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(fd, 0) << dir;
    ASSERT_EQ(fsync(fd), 0);
    close(fd);
  }

  std::string dir_;
  process::Child fs_;
};

TEST_F(ForgetfsMountTest, ACutKeepsWhatProgramsSyncedAndReadersSeeIt) {
  Put(Mnt() + "/synced", "kept", /*sync=*/true);
  Put(Mnt() + "/also", "kept too", /*sync=*/true);
  SyncDir(Mnt());
  Put(Mnt() + "/later", "lost", /*sync=*/true);  // created after the directory sync
  {
    const int fd = open((Mnt() + "/synced").c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "+more", 5), 5);
    close(fd);
  }
  EXPECT_EQ(Read(Mnt() + "/synced"), "kept+more");  // read once, so the kernel has it cached
  auto stats = Control(Ctl(), "stats");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_THAT(*stats, HasSubstr("unsynced_writes=1"));
  auto cut = Control(Ctl(), "cut drop seed=1");
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_THAT(*cut, HasSubstr("1 names whose create, rename or unlink was not synced"));
  EXPECT_EQ(Read(Mnt() + "/synced"), "kept");
  EXPECT_EQ(Read(Mnt() + "/also"), "kept too");
  EXPECT_EQ(Read(Mnt() + "/later"), "<absent>");
}

TEST_F(ForgetfsMountTest, AnAtomicReplaceWithoutTheDirectorySyncIsUndone) {
  Put(Mnt() + "/SNAP", "old", true);
  SyncDir(Mnt());
  Put(Mnt() + "/SNAP.tmp", "new", true);
  ASSERT_EQ(rename((Mnt() + "/SNAP.tmp").c_str(), (Mnt() + "/SNAP").c_str()), 0);
  EXPECT_EQ(Read(Mnt() + "/SNAP"), "new");
  ASSERT_TRUE(Control(Ctl(), "cut drop").ok());
  EXPECT_EQ(Read(Mnt() + "/SNAP"), "old");
  EXPECT_FALSE(std::filesystem::exists(Mnt() + "/SNAP.tmp"));
}

TEST_F(ForgetfsMountTest, ACutWaitsForOpenFilesAndRefusesWhatItDoesNotModel) {
  const int fd = open((Mnt() + "/open").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  EXPECT_NE(symlink("open", (Mnt() + "/link").c_str()), 0);
  EXPECT_NE(link((Mnt() + "/open").c_str(), (Mnt() + "/hard").c_str()), 0);
  ASSERT_EQ(mkdir((Mnt() + "/d").c_str(), 0755), 0);
  EXPECT_NE(rename((Mnt() + "/open").c_str(), (Mnt() + "/d/open").c_str()), 0);
  EXPECT_THAT(Read(dir_ + "/fs.log"), HasSubstr("refused: symlink"));
  // The cut waits for the last file to close (up to 10 s), as for a process being killed.
  std::thread closer([fd] {
    absl::SleepFor(absl::Milliseconds(300));
    close(fd);
  });
  auto cut = Control(Ctl(), "cut drop");
  closer.join();
  EXPECT_TRUE(cut.ok()) << cut.status();
  auto bad = Control(Ctl(), "cut sideways");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("unknown cut \"sideways\""));
}

}  // namespace
}  // namespace fencelock::powercut
