// A small real state directory, written by a real lockd under a real client workload, damaged
// at every byte offset of every file: truncated there, and separately with a bit flipped there.
// Every case must either restore every acknowledged record (a torn tail of the final segment
// may be dropped, nothing else) or refuse with a message naming the damaged file; and no case
// may restart the token or session sequence lower than the intact directory would.
//
// Recovery runs in-process on an in-memory copy of the directory (the same code lockd serve
// runs), so the ~17,000 cases take a second; a few cases also go through the real binary.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lock-client/pool_client.h"
#include "lock-server/testing/recovery.h"
#include "lock-server/testing/test_envs.h"
#include "lockd_process.h"
#include "raw_connection.h"
#include "lock-server/storage.h"

namespace fencelock {
namespace {

using server::MemEnv;
using server::Recover;
using server::StateMachine;
using testing::LockdProcess;
using testing::TempDir;

constexpr char kDir[] = "/state";
const MonoTime kNow = MonoTime::FromNanos(77'000'000'000);

// Runs a workload against a real lockd with 4 KiB segments and returns the directory's files.
// Besides locks, an admission pool's records: its policy, a claim, and leases granted,
// activated and released, some kept active (issue 35: the sweep wrote no pool record before).
std::map<std::string, std::string> MakeRealStateDirectory(const std::string& dir) {
  EXPECT_EQ(testing::InitDataDir(dir, 4096), 0);
  std::vector<std::unique_ptr<Client>> clients;
  {
    LockdProcess lockd(
        LockdProcess::Options{.unix_socket = true, .data_dir = dir, .segment_bytes = 4096});
    auto pools = PoolClient::Create({.server = "unix:" + lockd.unix_path()});
    EXPECT_TRUE(pools.ok()) << pools.status();
    EXPECT_TRUE((*pools)->publish("hosts", 1, 64, {{.id = "build"}, {.id = "test", .cost = 2}}).ok());
    auto owner = (*pools)->claim("hosts", "build", 1);
    EXPECT_TRUE(owner.ok()) << owner.status();
    for (int c = 0; c < 3; ++c) {
      ClientOptions options;
      options.server = lockd.tcp_address();
      auto client = Client::Create(options);
      EXPECT_TRUE(client.ok()) << client.status();
      clients.push_back(std::move(*client));
    }
    for (int i = 0; i < 60; ++i) {
      Client& client = *clients[i % 3];
      auto h = client.acquire(absl::StrCat("payout-", i % 25), absl::Seconds(5));
      EXPECT_TRUE(h.ok()) << h.status();
      if (h.ok()) {
        EXPECT_TRUE(client.release(*h).ok());
      }
      // Every fourth round also takes a lock and keeps it, so the state has holders.
      if (i % 4 == 0) {
        EXPECT_TRUE(client.acquire(absl::StrCat("kept-", i), absl::Seconds(5)).ok());
      }
      // Every third, a pool slot granted and activated; every other one released again.
      if (i % 3 == 0 && owner.ok()) {
        const std::string slot = absl::StrCat("b", i);
        auto g = (*pools)->acquire("hosts", "build", slot, *owner, absl::Seconds(30));
        EXPECT_TRUE(g.ok() && g->granted) << g.status();
        if (g.ok() && g->granted) {
          EXPECT_TRUE((*pools)->activate("hosts", "build", slot, g->token, *owner).ok());
          if (i % 2 == 0) {
            EXPECT_TRUE((*pools)->release("hosts", "build", slot, g->token, *owner).ok());
          }
        }
      }
    }
  }  // lockd stops here (SIGTERM); the clients' sessions and held locks stay in the state
  clients.clear();
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream data;
    data << in.rdbuf();
    files[entry.path().filename().string()] = data.str();
  }
  return files;
}

TEST(CorruptionTest, EveryTruncationAndBitFlipRestoresAcknowledgedStateOrRefuses) {
  TempDir tmp;
  const auto files = MakeRealStateDirectory(tmp.path() + "/state");
  // FORMAT, SEQUENCES, the snapshot taken after the last rotation, and the segments it does
  // not cover (sealed segments and seals are exercised in lock-server/storage/src/storage_test.cc).
  std::vector<std::string> names;
  for (const auto& [name, data] : files) names.push_back(absl::StrCat(name, " (", data.size(), " bytes)"));
  std::printf("state directory: %s\n", absl::StrJoin(names, ", ").c_str());
  ASSERT_GE(files.size(), 4u);

  MemEnv env;
  for (const auto& [name, data] : files) env.PutFile(absl::StrCat(kDir, "/", name), data);
  auto intact = Recover(&env, kDir, kNow);
  ASSERT_TRUE(intact.ok()) << intact.status();
  ASSERT_TRUE(intact->report.warnings.empty());
  ASSERT_GT(intact->report.snapshot_lsn, 0u) << "the workload should have produced a snapshot";
  ASSERT_GT(intact->state.held_lock_count(), 0u);
  ASSERT_EQ(intact->state.pools().size(), 1u);
  ASSERT_GT(intact->state.pools().begin()->second.leases.size(), 0u);
  const uint64_t last = intact->report.last_lsn;
  // The state after each of the last few records, to compare a restore that dropped a tail.
  std::map<uint64_t, std::string> state_at;
  for (uint64_t lsn = last >= 3 ? last - 3 : 0; lsn <= last; ++lsn) {
    auto r = server::testing::RecoverThrough(&env, kDir, kNow, lsn);
    if (r.ok()) state_at[lsn] = r->state.DebugString();
  }

  // Damages every byte of every file in `damaged`, one case at a time, and checks recovery.
  auto run_cases = [&](const std::map<std::string, std::string>& damaged, const char* label,
                       int* torn_restores_out) {
  int cases = 0, refused = 0, intact_restores = 0, torn_restores = 0;
  std::vector<std::string> failures;
  auto check = [&](const std::string& name, const std::string& what) {
    ++cases;
    auto r = Recover(&env, kDir, kNow);
    if (!r.ok()) {
      ++refused;
      if (r.status().message().find(name) == std::string_view::npos) {
        failures.push_back(absl::StrCat(what, ": refusal does not name the file: ",
                                        r.status().ToString()));
      }
      return;
    }
    if (r->report.token_floor < intact->report.token_floor ||
        r->report.session_floor < intact->report.session_floor) {
      failures.push_back(absl::StrCat(what, ": sequence restarts lower (token floor ",
                                      r->report.token_floor, " < ",
                                      intact->report.token_floor, ")"));
    }
    const uint64_t got = r->report.last_lsn;
    if (got == last && r->state.DebugString() == state_at[last]) {
      ++intact_restores;
      return;
    }
    // Only the final record may be lost, and only as a reported torn tail.
    if (r->report.torn_tail_bytes > 0 && got + 1 >= last && state_at.count(got) &&
        r->state.DebugString() == state_at[got]) {
      ++torn_restores;
      return;
    }
    failures.push_back(absl::StrCat(what, ": restored lsn ", got, " of ", last,
                                    " with a state that is not an acknowledged prefix"));
  };

  for (const auto& [name, original] : damaged) {
    const std::string path = absl::StrCat(kDir, "/", name);
    for (size_t offset = 0; offset < original.size(); ++offset) {
      env.PutFile(path, original.substr(0, offset));
      check(name, absl::StrCat(name, " truncated at ", offset));
      std::string flipped = original;
      flipped[offset] ^= static_cast<char>(1 << (offset % 8));
      env.PutFile(path, flipped);
      check(name, absl::StrCat(name, " bit ", offset % 8, " flipped at ", offset));
    }
    env.PutFile(path, original);
  }
  std::printf("%s: %d corruption cases (refused %d, restored intact %d, restored minus a torn "
              "tail %d)\n",
              label, cases, refused, intact_restores, torn_restores);
  EXPECT_TRUE(failures.empty()) << label << ": " << failures.size() << " bad cases, first: "
                                << failures[0];
  EXPECT_GT(refused, 0) << label;
  *torn_restores_out = torn_restores;
  };

  // As lockd left it after a clean stop: COMMITTED holds the last lsn, so losing any committed
  // record is refused, the newest included (issue 13, finding 3).
  int torn = -1;
  run_cases(files, "with COMMITTED", &torn);
  EXPECT_EQ(torn, 0) << "a committed record was dropped as a torn tail despite COMMITTED";
  // As after a crash before the newest records were marked: a damaged final record is
  // indistinguishable from an interrupted append, and is dropped with a warning.
  std::map<std::string, std::string> unmarked = files;
  unmarked.erase(server::kCommittedFile);
  env.RemoveFile(absl::StrCat(kDir, "/", server::kCommittedFile)).IgnoreError();
  run_cases(unmarked, "without COMMITTED", &torn);
  EXPECT_GT(torn, 0);
}


TEST(CorruptionTest, RealLockdRefusesDamageNamingTheFileAndExitsNonZero) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/state";
  MakeRealStateDirectory(dir);
  // Flip a bit in the middle of the first segment that still exists.
  std::string first_segment;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("wal-", 0) == 0 && (first_segment.empty() || name < first_segment)) {
      first_segment = name;
    }
  }
  {
    std::fstream f(dir + "/" + first_segment, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(40);
    char c;
    f.get(c);
    f.seekp(40);
    f.put(static_cast<char>(c ^ 0x10));
  }
  auto [status, err] = testing::RunLockdToExit({"serve", "--data-dir=" + dir, "--port=0"});
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(err, ::testing::HasSubstr(first_segment));
  EXPECT_THAT(err, ::testing::HasSubstr("offset"));

  auto [missing_status, missing_err] =
      testing::RunLockdToExit({"serve", "--data-dir=" + tmp.path() + "/nothing", "--port=0"});
  EXPECT_EQ(WEXITSTATUS(missing_status), 1);
  EXPECT_THAT(missing_err, ::testing::HasSubstr("does not exist"));

  std::filesystem::create_directory(tmp.path() + "/empty");
  auto [empty_status, empty_err] =
      testing::RunLockdToExit({"serve", "--data-dir=" + tmp.path() + "/empty", "--port=0"});
  EXPECT_EQ(WEXITSTATUS(empty_status), 1);
  EXPECT_THAT(empty_err, ::testing::HasSubstr("is empty"));

  {
    std::ofstream format(dir + "/FORMAT", std::ios::trunc);
    format << "fencelock-lockd-state\nformat 9\n";
  }
  auto [version_status, version_err] =
      testing::RunLockdToExit({"serve", "--data-dir=" + dir, "--port=0"});
  EXPECT_EQ(WEXITSTATUS(version_status), 1);
  EXPECT_THAT(version_err, ::testing::HasSubstr("unsupported format version \"9\""));
}

// Issue 13, finding 1: two lockd on one state directory both served, granted the same lock
// with two tokens, and left a directory that no longer recovered.
TEST(StateDirectoryTest, ASecondLockdOnTheSameDirectoryIsRefusedNamingTheFirst) {
  testing::LockdProcess first;
  auto [status, err] = testing::RunLockdToExit(
      {"serve", "--data-dir=" + first.data_dir(), "--port=0", "--metrics-port=-1"});
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(err, ::testing::HasSubstr(absl::StrCat("lockd pid ", first.pid())));
  EXPECT_THAT(err, ::testing::HasSubstr("one state directory has exactly one server"));
  testing::RawConnection still = testing::RawConnection::Tcp(first.port());
  EXPECT_EQ(still.Hello().code(), wire::OK);  // the first keeps serving
  // Issue 33: removing the LOCK file let a second lockd serve the same directory. The
  // directory itself is locked: the second is still refused, naming the first if it can.
  ASSERT_TRUE(std::filesystem::remove(first.data_dir() + "/LOCK"));
  auto [unlocked_status, unlocked_err] = testing::RunLockdToExit(
      {"serve", "--data-dir=" + first.data_dir(), "--port=0", "--metrics-port=-1"});
  EXPECT_EQ(WEXITSTATUS(unlocked_status), 1);
  EXPECT_THAT(unlocked_err, ::testing::HasSubstr("LOCK is missing or empty"));
  EXPECT_THAT(unlocked_err, ::testing::HasSubstr("one state directory has exactly one server"));
  EXPECT_EQ(testing::RawConnection::Tcp(first.port()).Hello().code(), wire::OK);
  // A killed lockd holds nothing: the directory can be served again at once.
  first.Kill();
  first.Restart();
  testing::RawConnection again = testing::RawConnection::Tcp(first.port());
  EXPECT_EQ(again.Hello().code(), wire::OK);
}

// Issue 13, finding 6: each of these crashed lockd or was accepted; now each is a clear message
// and exit status 1.
TEST(StateDirectoryTest, BadPathsAndSizesAreClearErrors) {
  testing::TempDir tmp;
  EXPECT_EQ(WEXITSTATUS(testing::InitDataDir(tmp.path() + "/tiny", 10)), 1);
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/tiny/FORMAT"));

  const std::string dir = tmp.path() + "/state";
  ASSERT_EQ(testing::InitDataDir(dir), 0);
  const std::string long_path = tmp.path() + "/" + std::string(200, 's');
  auto [status, err] = testing::RunLockdToExit({"serve", "--data-dir=" + dir, "--port=0",
                                                "--metrics-port=-1", "--unix-socket=" + long_path});
  EXPECT_TRUE(WIFEXITED(status)) << "lockd died of a signal: " << err;
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(err, ::testing::HasSubstr("a socket path may have at most 107"));

  auto [seg_status, seg_err] = testing::RunLockdToExit(
      {"serve", "--data-dir=" + dir, "--port=0", "--metrics-port=-1", "--wal-segment-bytes=10"});
  EXPECT_EQ(WEXITSTATUS(seg_status), 1);
  EXPECT_THAT(seg_err, ::testing::HasSubstr("--wal-segment-bytes"));
}

}  // namespace
}  // namespace fencelock
