#include "powercut/forgetful_fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>

#include "absl/time/clock.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::powercut {
namespace {

using ::testing::HasSubstr;

class ForgetfulFsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/forgetful-fs-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    store_ = tmpl;
    Reopen();
  }
  void TearDown() override {
    fs_.reset();
    std::filesystem::remove_all(store_);
  }
  void Reopen() {
    fs_.reset();
    auto fs = ForgetfulFs::Open(store_, [this](const std::string& line) { log_ += line + "\n"; });
    ASSERT_TRUE(fs.ok()) << fs.status();
    fs_ = std::move(*fs);
  }

  // Writes `data` at `offset` of `path` (created if missing) and closes it, syncing it first if
  // `sync`.
  void Write(const std::string& path, const std::string& data, off_t offset = 0,
             bool sync = false) {
    uint64_t h = 0;
    int r = fs_->Open(path, O_WRONLY, &h);
    if (r == -ENOENT) r = fs_->Create(path, 0644, O_WRONLY | O_CREAT, &h);
    ASSERT_EQ(r, 0) << path;
    ASSERT_EQ(fs_->Write(h, data.data(), data.size(), offset), static_cast<int>(data.size()));
    if (sync) {
      ASSERT_EQ(fs_->Fsync(h), 0);
    }
    ASSERT_EQ(fs_->Release(h), 0);
  }
  void Sync(const std::string& path) {
    uint64_t h = 0;
    ASSERT_EQ(fs_->Open(path, O_RDONLY, &h), 0) << path;
    ASSERT_EQ(fs_->Fsync(h), 0);
    ASSERT_EQ(fs_->Release(h), 0);
  }
  // What the live folder holds at `path`, or "<absent>".
  std::string Contents(const std::string& path) {
    std::ifstream in(store_ + "/live" + path, std::ios::binary);
    if (!in) return "<absent>";
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  CutReport Cut(Unsynced unsynced = Unsynced::kDrop, uint64_t seed = 1, uint64_t unit = 4096) {
    auto report = fs_->Cut({.unsynced = unsynced, .seed = seed, .tear_unit = unit});
    EXPECT_TRUE(report.ok()) << report.status();
    return report.ok() ? *report : CutReport{};
  }

  std::string store_;
  std::string log_;
  std::unique_ptr<ForgetfulFs> fs_;
};

TEST_F(ForgetfulFsTest, WhatTheLiveFolderHeldAtTheStartIsDurable) {
  fs_.reset();
  std::filesystem::create_directories(store_ + "/live/d");
  std::ofstream(store_ + "/live/d/f") << "before";
  Reopen();
  const CutReport report = Cut();
  EXPECT_EQ(Contents("/d/f"), "before");
  EXPECT_EQ(report.files, 1);
  EXPECT_EQ(report.entries_lost, 0);
}

TEST_F(ForgetfulFsTest, SyncedDataSurvivesAndWhatCameAfterTheSyncIsLost) {
  Write("/f", "aaaa", 0, /*sync=*/true);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  Write("/f", "bbbb", 4);
  Write("/f", "cc", 0);
  EXPECT_EQ(Contents("/f"), "ccaabbbb");  // the live view has everything
  const CutReport report = Cut();
  EXPECT_EQ(Contents("/f"), "aaaa");
  EXPECT_EQ(report.unsynced_writes, 2);
  EXPECT_EQ(report.pieces_dropped, 2);
  // After the cut, what survived is durable: a second cut keeps it.
  Cut();
  EXPECT_EQ(Contents("/f"), "aaaa");
}

TEST_F(ForgetfulFsTest, AFileWhoseDirectoryWasNeverSyncedIsLostEvenIfItsDataWas) {
  Write("/new", "data", 0, /*sync=*/true);
  const CutReport report = Cut();
  EXPECT_EQ(Contents("/new"), "<absent>");
  EXPECT_EQ(report.entries_lost, 1);
}

TEST_F(ForgetfulFsTest, AFileWhoseDirectoryWasSyncedButNotItsDataSurvivesEmpty) {
  Write("/new", "data");
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  Cut();
  EXPECT_EQ(Contents("/new"), "");
}

// The atomic replace as lockd does it: a temporary file written and synced, renamed over the
// old one, the directory synced. Each step left out loses what a power cut shows.
TEST_F(ForgetfulFsTest, AnAtomicReplaceNeedsTheFileSyncTheRenameAndTheDirectorySync) {
  Write("/SNAP", "old", 0, /*sync=*/true);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);

  Write("/SNAP.tmp", "new", 0, /*sync=*/true);
  ASSERT_EQ(fs_->Rename("/SNAP.tmp", "/SNAP", 0), 0);
  Cut();  // the directory was not synced: the rename is lost
  EXPECT_EQ(Contents("/SNAP"), "old");
  EXPECT_EQ(Contents("/SNAP.tmp"), "<absent>");

  Write("/SNAP.tmp", "new");  // not synced before the rename: a planted bug's shape
  ASSERT_EQ(fs_->Rename("/SNAP.tmp", "/SNAP", 0), 0);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  Cut();
  EXPECT_EQ(Contents("/SNAP"), "");  // the new name, with none of its data

  Write("/SNAP.tmp", "new", 0, /*sync=*/true);
  ASSERT_EQ(fs_->Rename("/SNAP.tmp", "/SNAP", 0), 0);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  Cut();
  EXPECT_EQ(Contents("/SNAP"), "new");
}

TEST_F(ForgetfulFsTest, AnUnlinkIsUndoneUnlessTheDirectoryWasSynced) {
  Write("/f", "kept", 0, /*sync=*/true);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  ASSERT_EQ(fs_->Unlink("/f"), 0);
  Cut();
  EXPECT_EQ(Contents("/f"), "kept");
  ASSERT_EQ(fs_->Unlink("/f"), 0);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  Cut();
  EXPECT_EQ(Contents("/f"), "<absent>");
}

TEST_F(ForgetfulFsTest, ATruncationIsUndoneUnlessSynced) {
  Write("/seg", std::string(8192, 'x'), 0, /*sync=*/true);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  ASSERT_EQ(fs_->Truncate("/seg", 0), 0);
  Cut();
  EXPECT_EQ(Contents("/seg"), std::string(8192, 'x'));
  uint64_t h = 0;
  ASSERT_EQ(fs_->Open("/seg", O_WRONLY | O_TRUNC, &h), 0);  // O_TRUNC is a truncation too
  ASSERT_EQ(fs_->Release(h), 0);
  Cut();
  EXPECT_EQ(Contents("/seg"), std::string(8192, 'x'));
  ASSERT_EQ(fs_->Truncate("/seg", 100), 0);
  Sync("/seg");
  Cut();
  EXPECT_EQ(Contents("/seg"), std::string(100, 'x'));
}

TEST_F(ForgetfulFsTest, ADirectoryMadeButNotSyncedInItsParentIsLostWithWhatItHeld) {
  ASSERT_EQ(fs_->Mkdir("/d", 0755), 0);
  Write("/d/f", "x", 0, /*sync=*/true);
  ASSERT_EQ(fs_->FsyncDir("/d"), 0);
  Cut();
  EXPECT_FALSE(std::filesystem::exists(store_ + "/live/d"));
  ASSERT_EQ(fs_->Mkdir("/d", 0755), 0);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  Cut();
  EXPECT_TRUE(std::filesystem::is_directory(store_ + "/live/d"));
}

// Directories are kept by inode: one removed and made again under its old name starts empty,
// whatever the old one held durably.
TEST_F(ForgetfulFsTest, ADirectoryMadeAgainUnderAnOldNameDoesNotGetTheOldOnesEntries) {
  ASSERT_EQ(fs_->Mkdir("/d", 0755), 0);
  Write("/d/x", "old", 0, /*sync=*/true);
  ASSERT_EQ(fs_->FsyncDir("/d"), 0);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  ASSERT_EQ(fs_->Unlink("/d/x"), 0);
  ASSERT_EQ(fs_->Rmdir("/d"), 0);
  ASSERT_EQ(fs_->Mkdir("/d", 0755), 0);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  Cut();
  EXPECT_TRUE(std::filesystem::is_directory(store_ + "/live/d"));
  EXPECT_EQ(Contents("/d/x"), "<absent>");
}

TEST_F(ForgetfulFsTest, KeepSomeKeepsPagesAtRandomAndMayApplyThemOutOfOrder) {
  Write("/f", std::string(4096, '0'), 0, /*sync=*/true);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  std::set<std::string> seen;
  for (uint64_t seed = 1; seed <= 64; ++seed) {
    Write("/f", std::string(4096, 'A'));
    Write("/f", std::string(4096, 'B'));
    const CutReport report = Cut(Unsynced::kKeepSome, seed);
    EXPECT_EQ(report.pieces_kept + report.pieces_dropped, 2);
    seen.insert(Contents("/f").substr(0, 1));
    // Back to the durable zeros for the next seed.
    Write("/f", std::string(4096, '0'), 0, /*sync=*/true);
  }
  // Neither kept ('0'), the first only or the later one applied last ('A' — a reorder when both
  // were kept), the second ('B').
  EXPECT_EQ(seen, (std::set<std::string>{"0", "A", "B"}));
}

TEST_F(ForgetfulFsTest, ATearKeepsAPrefixOfTheNewestWriteAtASectorOrPageBoundary) {
  Write("/f", "", 0, /*sync=*/true);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  for (const uint64_t unit : {512, 4096}) {
    std::set<size_t> sizes;
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      Write("/f", std::string(100, 'a'));            // an older unsynced write: always lost
      Write("/f", std::string(10000, 'b'), 100);    // the newest: torn
      Cut(Unsynced::kTear, seed, unit);
      const std::string got = Contents("/f");
      if (!got.empty()) {
        EXPECT_EQ(got.substr(0, 100), std::string(100, '\0'));
        EXPECT_EQ(got.find_first_not_of('b', 100), std::string::npos);
        EXPECT_EQ(got.size() % unit, 0u) << got.size();
      }
      sizes.insert(got.size());
      ASSERT_EQ(fs_->Truncate("/f", 0), 0);
      Sync("/f");
    }
    EXPECT_GE(sizes.size(), 3u) << "unit " << unit;
  }
  EXPECT_FALSE(fs_->Cut({.unsynced = Unsynced::kTear, .tear_unit = 1000}).ok());
}

TEST_F(ForgetfulFsTest, ACutWaitsForEveryFileToBeClosed) {
  uint64_t h = 0;
  ASSERT_EQ(fs_->Create("/f", 0644, O_WRONLY | O_CREAT, &h), 0);
  auto refused = fs_->Cut({});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("1 files are still open"));
  ASSERT_EQ(fs_->Release(h), 0);
  EXPECT_TRUE(fs_->Cut({}).ok());
}

// An armed cut: the power goes with the N-th write in flight. That write reaches the live
// folder as unsynced; everything after it waits, and fails once the cut comes.
TEST_F(ForgetfulFsTest, AnArmedCutFreezesEverythingAtTheNthWrite) {
  Write("/f", "", 0, /*sync=*/true);
  ASSERT_EQ(fs_->FsyncDir("/"), 0);
  fs_->Arm(2);
  uint64_t h = 0;
  ASSERT_EQ(fs_->Open("/f", O_WRONLY, &h), 0);
  ASSERT_EQ(fs_->Write(h, "one", 3, 0), 3);
  ASSERT_EQ(fs_->Fsync(h), 0);
  int second = 0, later = 0;
  std::thread writer([&] { second = fs_->Write(h, "two", 3, 3); });
  while (!fs_->Stats().frozen) absl::SleepFor(absl::Milliseconds(1));
  std::thread reader([&] {
    struct stat st;
    later = fs_->GetAttr("/f", &st);
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(Contents("/f"), "onetwo");  // the write in flight is in the live folder
  // The first try thaws what waited (the files are still open); the process is "dead".
  EXPECT_FALSE(fs_->Cut({}).ok());
  writer.join();
  reader.join();
  EXPECT_EQ(second, -EIO);
  EXPECT_EQ(later, -EIO);
  ASSERT_EQ(fs_->Release(h), 0);
  ASSERT_TRUE(fs_->Cut({}).ok());
  EXPECT_EQ(Contents("/f"), "one");
  EXPECT_EQ(fs_->Stats().freezes, 1);
  EXPECT_FALSE(fs_->Stats().frozen);
}

TEST_F(ForgetfulFsTest, WhatItDoesNotModelIsRefusedAndLogged) {
  ASSERT_EQ(fs_->Mkdir("/a", 0755), 0);
  ASSERT_EQ(fs_->Mkdir("/b", 0755), 0);
  Write("/a/f", "x");
  EXPECT_EQ(fs_->Rename("/a/f", "/b/f", 0), -EPERM);
  EXPECT_EQ(fs_->Rename("/a", "/c", 0), -EPERM);
  EXPECT_EQ(fs_->Rename("/a/f", "/a/g", RENAME_EXCHANGE), -EPERM);
  EXPECT_EQ(fs_->Refuse("symlink /x"), -EPERM);
  EXPECT_EQ(fs_->Stats().refused, 4);
  EXPECT_THAT(log_, HasSubstr("refused: rename /a/f to /b/f (only a file's, within its directory)"));
  EXPECT_EQ(Contents("/a/f"), "x");
}

TEST_F(ForgetfulFsTest, AnUnlinkedFileStaysWritableThroughItsHandle) {
  uint64_t h = 0;
  ASSERT_EQ(fs_->Create("/f", 0644, O_RDWR | O_CREAT, &h), 0);
  ASSERT_EQ(fs_->Unlink("/f"), 0);
  ASSERT_EQ(fs_->Write(h, "abc", 3, 0), 3);
  char buf[4] = {};
  ASSERT_EQ(fs_->Read(h, buf, 3, 0), 3);
  EXPECT_EQ(std::string(buf), "abc");
  ASSERT_EQ(fs_->Fsync(h), 0);
  ASSERT_EQ(fs_->Release(h), 0);
  Cut();
  EXPECT_EQ(Contents("/f"), "<absent>");
}

TEST_F(ForgetfulFsTest, StatsCountWhatIsNotDurable) {
  Write("/f", "abc");
  ASSERT_EQ(fs_->Mkdir("/d", 0755), 0);
  const FsStats s = fs_->Stats();
  EXPECT_EQ(s.files, 1);
  EXPECT_EQ(s.unsynced_writes, 1);
  EXPECT_EQ(s.unsynced_bytes, 3);
  EXPECT_EQ(s.unsynced_dirs, 1);  // the root, which gained f and d
  EXPECT_EQ(s.open_handles, 0);
}

}  // namespace
}  // namespace fencelock::powercut
