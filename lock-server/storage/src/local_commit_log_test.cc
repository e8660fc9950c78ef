// Group commit, rotation with snapshots, reservations, torn-tail repair and disk faults, on the
// in-memory Env, with the lock service producing the records as it does in lockd.
#include "lock-server/local_commit_log.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-server/lock_service.h"
#include "lock-server/storage.h"
#include "lock-server/testing/test_envs.h"

namespace fencelock::server {
namespace {

using namespace ::fencelock::id_literals;
using ::testing::HasSubstr;

constexpr char kDir[] = "/state";
const MonoTime kNow = MonoTime::FromNanos(900'000'000'000);

// Stands in for lockd's I/O thread: callbacks posted by the log run when the test asks.
class OwnerLoop {
 public:
  void Post(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(f));
    cv_.notify_all();
  }
  // Runs posted callbacks until `done` holds; fails the test after 10 s.
  void RunUntil(const std::function<bool()>& done) {
    while (!done()) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return !queue_.empty(); })) {
          ADD_FAILURE() << "timed out waiting for the log";
          return;
        }
        f = std::move(queue_.front());
        queue_.pop_front();
      }
      f();
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

class DurableLogTest : public ::testing::Test, public CommitLogListener {
 protected:
  void Start(Env* env, uint64_t segment_bytes = 4096, uint64_t block = 100,
             std::function<void(LocalCommitLogOptions&)> adjust = nullptr) {
    env_ = env;
    LocalCommitLogOptions options{
        .env = env, .dir = dir_, .segment_bytes = segment_bytes, .reservation_block = block};
    if (adjust) adjust(options);
    auto opened = OpenLocalCommitLog(
        options, kNow, [this](std::function<void()> f) { loop_.Post(std::move(f)); });
    ASSERT_TRUE(opened.ok()) << opened.status();
    service_ = std::make_unique<LockService>(ServiceOptions{}, std::move(opened->state));
    log_ = std::move(opened->log);
    log_->SetListener(this);
    service_->set_record_observer([this](const Record& r) {
      log_->ReserveFor(service_->state().last_token(), service_->state().last_session_id());
      log_->Append(r);
    });
  }
  void OnCommitted(uint64_t batch) override {
    if (on_committed_) on_committed_(batch);
  }
  void OnCommitFault(const absl::Status& status) override { fault_ = status; }
  void OnSnapshotDue() override { log_->Snapshot(service_->state()); }

  void WaitDurable() {
    log_->Flush();
    loop_.RunUntil(
        [&] { return log_->committed_batch() >= log_->newest_batch() || !fault_.ok(); });
  }
  void Stop() {
    log_.reset();
    service_.reset();
  }
  // One session that takes and releases `n` locks, leaving every third one held.
  void Workload(int n, int at_ms = 0) {
    auto session = service_->OpenSession(absl::Seconds(20), kNow);
    ASSERT_TRUE(session.ok());
    for (int i = 0; i < n; ++i) {
      auto g = service_->Acquire(session->first, absl::StrCat("lock-", at_ms, "-", i),
                                 absl::Seconds(40), {}, 0, kNow);
      ASSERT_TRUE(g.ok());
      if (i % 3 != 0) {
        ASSERT_TRUE(service_->Release(session->first, absl::StrCat("lock-", at_ms, "-", i),
                                      g->token, kNow)
                        .ok());
      }
    }
  }

  // Start() with the writer's steps queued in steps_ (RunStep() runs the next) instead of run
  // on a thread, and every committed batch recorded in committed_.
  void StartWithManualWriter(uint64_t block, uint64_t inline_sync_max_records) {
    Start(&mem_, 1 << 20, block, [this, inline_sync_max_records](LocalCommitLogOptions& o) {
      o.inline_sync_max_records = inline_sync_max_records;
      o.schedule_writer = [this](std::function<void()> step) { steps_.push_back(std::move(step)); };
    });
    on_committed_ = [this](uint64_t batch) { committed_.push_back(batch); };
  }
  void RunStep() {
    auto step = std::move(steps_.front());
    steps_.pop_front();
    step();
  }
  void RunSteps() {
    while (!steps_.empty()) RunStep();
  }

  MemEnv mem_;
  std::string dir_ = kDir;
  Env* env_ = nullptr;
  std::deque<std::function<void()>> steps_;
  std::vector<uint64_t> committed_;
  OwnerLoop loop_;
  std::unique_ptr<LockService> service_;
  std::unique_ptr<CommitLog> log_;
  std::function<void(uint64_t)> on_committed_;
  absl::Status fault_;
};

TEST_F(DurableLogTest, WhatIsDurableRecoversExactly) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  Start(&mem_, 1 << 20);
  Workload(10);
  WaitDurable();
  const std::string before = service_->state().DebugString();
  Stop();
  auto r = Recover(&mem_, kDir, kNow);
  ASSERT_TRUE(r.ok()) << r.status();
  // Same sessions and holders. The floors come from SEQUENCES, reserved a block (100) ahead
  // when the log was opened, so they are above every token the log holds.
  EXPECT_EQ(r->state.DebugString(), before);
  EXPECT_EQ(r->report.token_floor, 100_token);
  EXPECT_EQ(r->report.records_replayed, 17u);  // 1 session, 10 grants, 6 releases
}

TEST_F(DurableLogTest, ConcurrentMutationsShareOneSync) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  Start(&mem_, 1 << 20);
  auto session = service_->OpenSession(absl::Seconds(20), kNow);
  log_->Flush();  // batch 1 (the session) is now being written
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(service_->Acquire(session->first, absl::StrCat("l", i), {}, {}, 0, kNow).ok());
  }
  log_->Flush();  // a batch is in flight: the 50 grants wait and then go together
  loop_.RunUntil([&] { return log_->committed_batch() >= log_->newest_batch(); });
  EXPECT_EQ(log_->stats().commits, 2u);
  EXPECT_EQ(log_->stats().records, 51u);
}

// The writer's steps run when the test says: one batch syncs while three more are flushed;
// the next step writes those three with one sync, and each is committed, in order.
TEST_F(DurableLogTest, BatchesQueuedDuringASyncShareTheNextOne) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  StartWithManualWriter(100, 0);
  auto session = service_->OpenSession(absl::Seconds(20), kNow);
  ASSERT_TRUE(session.ok());
  log_->Flush();  // batch 1
  ASSERT_EQ(steps_.size(), 1u);
  RunStep();  // batch 1 is written and synced; its completion waits in the owner's loop
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(service_->Acquire(session->first, absl::StrCat("l", i), {}, {}, 0, kNow).ok());
    log_->Flush();  // batches 2, 3, 4: each handed over at once
  }
  EXPECT_EQ(log_->newest_batch(), 4u);
  ASSERT_EQ(steps_.size(), 1u);
  RunStep();
  EXPECT_TRUE(steps_.empty());
  loop_.RunUntil([&] { return log_->committed_batch() >= 4; });
  EXPECT_EQ(committed_, (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(log_->stats().commits, 2u);
  EXPECT_EQ(log_->stats().records, 4u);
  // Recovery reads the merged write as the four batches' records.
  const std::string before = service_->state().DebugString();
  Stop();
  auto r = Recover(&mem_, kDir, kNow);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state.DebugString(), before);
}

// A small batch may be synced on the owner's thread when the writer is idle, but never ahead
// of a batch the writer has synced whose completion the owner has not run yet: completions
// (and the replies they release) stay in batch order, and the committed batch never goes back.
TEST_F(DurableLogTest, AnInlineSyncNeverOvertakesACompletionStillOnItsWay) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  StartWithManualWriter(100, 4);
  auto session = service_->OpenSession(absl::Seconds(20), kNow);
  ASSERT_TRUE(session.ok());
  log_->Flush();  // batch 1: the writer is idle, so it is synced here, inline
  ASSERT_EQ(log_->committed_batch(), 1u);
  RunSteps();  // its commit queued the first COMMITTED mark: written now, emptying the queue
  loop_.RunUntil([&] { return true; });
  for (int i = 0; i < 5; ++i) {  // batch 2: more than 4 records, for the writer
    ASSERT_TRUE(service_->Acquire(session->first, absl::StrCat("l", i), {}, {}, 0, kNow).ok());
  }
  log_->Flush();
  ASSERT_EQ(steps_.size(), 1u);
  RunStep();  // batch 2 is synced; its completion waits in the owner's loop
  ASSERT_TRUE(service_->Acquire(session->first, "l9", {}, {}, 0, kNow).ok());
  log_->Flush();  // batch 3, one record, with the writer idle again
  EXPECT_EQ(committed_, (std::vector<uint64_t>{1}));  // not synced ahead of 2's completion
  RunSteps();
  loop_.RunUntil([&] { return committed_.size() >= 3; });
  EXPECT_EQ(committed_, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(log_->committed_batch(), 3u);
}

// StartIfIdle() hands a batch too large to sync inline to an idle writer at once, so the disk
// works while the owner goes on; a small batch, or one behind a batch in flight, waits for
// Flush().
TEST_F(DurableLogTest, AnIdleWriterTakesALargeBatchBeforeTheFlush) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  StartWithManualWriter(100, 4);
  auto session = service_->OpenSession(absl::Seconds(20), kNow);
  ASSERT_TRUE(session.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(service_->Acquire(session->first, absl::StrCat("l", i), {}, {}, 0, kNow).ok());
  }
  log_->StartIfIdle();  // 4 records, the inline limit: left for the flush, which may sync inline
  EXPECT_TRUE(steps_.empty());
  ASSERT_TRUE(service_->Acquire(session->first, "l3", {}, {}, 0, kNow).ok());
  EXPECT_EQ(log_->newest_batch(), 1u);  // still pending: the fifth record joined it
  log_->StartIfIdle();  // 5 records, the writer idle: batch 1 goes now
  ASSERT_EQ(steps_.size(), 1u);
  ASSERT_TRUE(service_->Acquire(session->first, "l4", {}, {}, 0, kNow).ok());
  EXPECT_EQ(log_->newest_batch(), 2u);  // the next record joins batch 2
  for (int i = 5; i < 10; ++i) {
    ASSERT_TRUE(service_->Acquire(session->first, absl::StrCat("l", i), {}, {}, 0, kNow).ok());
  }
  log_->StartIfIdle();  // batch 1 is in flight: batch 2 stays pending
  ASSERT_TRUE(service_->Acquire(session->first, "l10", {}, {}, 0, kNow).ok());
  EXPECT_EQ(log_->newest_batch(), 2u);  // had batch 2 been handed over, this would be batch 3
  log_->Flush();  // behind batch 1, for the writer's next step
  RunSteps();
  loop_.RunUntil([&] { return committed_.size() >= 2; });
  EXPECT_EQ(committed_, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(log_->stats().records, 12u);
}

// A reservation queued between two batches is written between them: the batch after it is not
// merged into the one before.
TEST_F(DurableLogTest, BatchesAreNotMergedAcrossAReservation) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  StartWithManualWriter(/*block=*/1, 0);
  auto session = service_->OpenSession(absl::Seconds(20), kNow);
  ASSERT_TRUE(session.ok());
  log_->Flush();
  // Reserved up to token 1 at open: token 1 needs nothing, token 2 reserves up to 3 (a job
  // queued before its batch), token 3 needs nothing. The queue: batches 1 and 2, the
  // reservation, batches 3 and 4.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(service_->Acquire(session->first, absl::StrCat("l", i), {}, {}, 0, kNow).ok());
    log_->Flush();
  }
  RunSteps();
  loop_.RunUntil([&] { return log_->committed_batch() >= 4; });
  EXPECT_EQ(log_->stats().reservations, 1u);
  EXPECT_EQ(log_->stats().commits, 2u);  // 1+2, then 3+4: not one sync across the reservation
  EXPECT_EQ(log_->stats().records, 4u);
}

TEST_F(DurableLogTest, RotationTakesASnapshotAndDropsWhatItCovers) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  Start(&mem_, 4096);
  for (int round = 0; round < 40; ++round) {
    Workload(9, round);
    WaitDurable();
  }
  // A snapshot is read, written and applied while the log goes on: wait until none is.
  loop_.RunUntil([&] {
    return log_->stats().snapshots >= 2 && !log_->stats().snapshot_in_progress;
  });
  WaitDurable();
  const std::string before = service_->state().DebugString();
  const uint64_t segment = log_->stats().segment;
  Stop();
  EXPECT_GT(segment, 3u);
  int snapshots = 0, segments = 0;
  for (const auto& [path, data] : mem_.Files()) {
    if (path.find("/snapshot-") != std::string::npos) ++snapshots;
    if (path.find("/wal-") != std::string::npos) ++segments;
  }
  EXPECT_EQ(snapshots, 1);
  EXPECT_LE(segments, 2);
  auto r = Recover(&mem_, kDir, kNow);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->report.snapshot_lsn, 0u);
  EXPECT_EQ(r->state.DebugString(), before);  // the floors may only be higher
}

// A MemEnv whose next `n` file creations fail as when the process is out of descriptors.
class DescriptorStarvedEnv final : public MemEnv {
 public:
  void Starve(int n) { starved_ = n; }
  int refused() const { return refused_; }
  absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) override {
    if (absl::Status s = Refuse(path); !s.ok()) return s;
    return MemEnv::WriteFileAtomically(path, contents);
  }
  absl::StatusOr<std::unique_ptr<SegmentFile>> CreateSegment(const std::string& path,
                                                             std::string_view header,
                                                             uint64_t size) override {
    if (absl::Status s = Refuse(path); !s.ok()) return s;
    return MemEnv::CreateSegment(path, header, size);
  }

 private:
  absl::Status Refuse(const std::string& path) {
    if (starved_.load() <= 0) return absl::OkStatus();
    --starved_;
    ++refused_;
    return absl::UnavailableError(absl::StrCat("create ", path, ".tmp: Too many open files"));
  }
  std::atomic<int> starved_{0};
  std::atomic<int> refused_{0};
};

// Issue 33: a flood of connections took every descriptor, lockd's next COMMITTED write failed
// with EMFILE, and lockd entered its disk-fault state for good. Running out of descriptors
// is not a disk fault: the write is tried again, and nothing is lost or refused.
TEST_F(DurableLogTest, RunningOutOfDescriptorsIsWaitedOutNotAFault) {
  DescriptorStarvedEnv env;
  ASSERT_TRUE(InitDataDir(&env, kDir, 4096).ok());
  std::vector<std::string> said;
  Start(&env, 4096, 100, [&said](LocalCommitLogOptions& o) {
    o.log = [&said](const std::string& line) { said.push_back(line); };
  });
  env.Starve(6);  // segments, snapshots and marks alike
  for (int round = 0; round < 10; ++round) {
    Workload(9, round);
    WaitDurable();
  }
  EXPECT_TRUE(fault_.ok()) << fault_;
  EXPECT_EQ(env.refused(), 6);
  EXPECT_GT(log_->stats().segment, 1u) << "no segment was created: the test shows nothing";
  ASSERT_FALSE(said.empty());
  EXPECT_THAT(said[0], HasSubstr("out of file descriptors"));
  const std::string before = service_->state().DebugString();
  Stop();
  auto r = Recover(&env, kDir, kNow);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state.DebugString(), before);
}

TEST_F(DurableLogTest, ReservationIsDurableBeforeTheGrantItCovers) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  Start(&mem_, 1 << 20, /*block=*/5);
  // Whenever a batch becomes durable, the disk must already hold a reservation covering every
  // token in the log: otherwise a crash right then could reissue one.
  int checks = 0;
  on_committed_ = [&](uint64_t) {
    auto r = Recover(&mem_, kDir, kNow);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GE(r->report.reserved.token_hwm, r->report.logged_token);
    ++checks;
  };
  for (int round = 0; round < 6; ++round) {
    Workload(4, round);  // 24 tokens in all: several blocks of 5
    WaitDurable();
  }
  Stop();
  EXPECT_GE(checks, 6);
  auto r = Recover(&mem_, kDir, kNow);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->report.logged_token, 24_token);
  EXPECT_GE(r->report.reserved.token_hwm, 24_token);
}

TEST_F(DurableLogTest, TornTailIsZeroedSoNewAppendsRecover) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  Start(&mem_, 1 << 20);
  Workload(3);
  WaitDurable();
  Stop();
  // A torn append: garbage right after the last good record.
  auto first = Recover(&mem_, kDir, kNow);
  ASSERT_TRUE(first.ok());
  const std::string path = std::string(kDir) + "/" + SegmentName(first->report.last_segment);
  std::string data = *mem_.ReadFile(path);
  data.replace(first->report.append_offset, 7, "FLR1\x09\x00\x00", 7);
  mem_.PutFile(path, data);

  Start(&mem_, 1 << 20);  // recovers (dropping the tear) and zeroes it
  Workload(3, 1);
  WaitDurable();
  const std::string before = service_->state().DebugString();
  Stop();
  auto again = Recover(&mem_, kDir, kNow);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->report.warnings.empty());
  EXPECT_EQ(again->state.DebugString(), before);
}

TEST_F(DurableLogTest, DiskFaultStopsTheLogAndNothingAfterItIsAcknowledged) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  FaultInjectingEnv faulty(&mem_);
  Start(&faulty, 1 << 20);
  Workload(3);
  WaitDurable();
  const uint64_t durable = log_->committed_batch();
  faulty.SetDiskFull(true);
  Workload(3, 1);
  WaitDurable();
  EXPECT_EQ(fault_.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(log_->fault(), nullptr);
  EXPECT_EQ(log_->committed_batch(), durable);
  // Space comes back, but the log stays stopped until a restart recovers from disk.
  faulty.SetDiskFull(false);
  Workload(1, 2);
  log_->Flush();
  EXPECT_EQ(log_->committed_batch(), durable);
  Stop();
  auto r = Recover(&mem_, kDir, kNow);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state.held_lock_count(), 1u);  // lock-0-0 from the first workload only
}

// Issue 13, finding 1: one state directory, one server.
TEST_F(DurableLogTest, ASecondLogOnTheSameDirectoryIsRefusedNamingTheFirst) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  auto post = [this](std::function<void()> f) { loop_.Post(std::move(f)); };
  auto first = OpenLocalCommitLog({.env = &mem_, .dir = kDir, .owner = "lockd pid 4242"}, kNow,
                                  post);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = OpenLocalCommitLog({.env = &mem_, .dir = kDir, .owner = "lockd pid 99"}, kNow,
                                   post);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("lockd pid 4242"));
  EXPECT_THAT(second.status().message(), HasSubstr("exactly one server"));
  first->log.reset();  // the first server stops: the directory is free again
  auto third = OpenLocalCommitLog({.env = &mem_, .dir = kDir}, kNow, post);
  EXPECT_TRUE(third.ok()) << third.status();
}

// Issue 60: once a snapshot was durable, the writer removed what it covers (unlinking 168 MB
// took 38.9 ms on the benchmark machine) and every WAL sync queued behind it. The writer now
// only forgets those files; they go in a step of their own, and a batch is committed while
// that step still waits.
TEST_F(DurableLogTest, WhatASnapshotCoversIsRemovedWhileTheWalGoesOn) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 4096).ok());
  StartWithManualWriter(100, 0);
  const auto has = [this](const std::string& name) {
    return mem_.Files().contains(std::string(kDir) + "/" + name);
  };
  auto session = service_->OpenSession(absl::Seconds(20), kNow);
  ASSERT_TRUE(session.ok());
  log_->Flush();
  RunSteps();
  loop_.RunUntil([&] { return log_->committed_batch() >= log_->newest_batch(); });
  RunSteps();  // the COMMITTED mark that commit queued
  log_->Snapshot(service_->state());
  loop_.RunUntil([&] { return !steps_.empty(); });  // read; its write waits as a step
  RunStep();                                        // written
  loop_.RunUntil([&] { return !steps_.empty(); });  // the writer's part, queued
  RunStep();
  loop_.RunUntil([&] { return !steps_.empty(); });  // the removal, queued
  EXPECT_EQ(log_->stats().snapshots, 1u);
  EXPECT_TRUE(log_->stats().snapshot_in_progress);
  ASSERT_TRUE(has(SnapshotName(0))) << "removed on the writer";
  // A batch behind it is written, synced and committed first.
  ASSERT_TRUE(service_->Acquire(session->first, "after", {}, {}, 0, kNow).ok());
  log_->Flush();
  ASSERT_EQ(steps_.size(), 2u);
  auto batch = std::move(steps_.back());
  steps_.pop_back();
  batch();
  loop_.RunUntil([&] { return log_->committed_batch() >= log_->newest_batch(); });
  EXPECT_TRUE(has(SnapshotName(0)));
  RunSteps();
  loop_.RunUntil([&] { return !log_->stats().snapshot_in_progress; });
  EXPECT_FALSE(has(SnapshotName(0)));
  EXPECT_TRUE(fault_.ok()) << fault_;
}

// Issue 60: a rotation wrote its new segment's zeros (64 MiB by default) on the WAL's writer,
// and every grant waited behind them: 39 to 43 ms at each rotation, beside a snapshot or not.
// On the real file system the next segment is now made ahead under a temporary name, and the
// rotation only writes its header and renames it.
TEST_F(DurableLogTest, OnTheRealFileSystemTheNextSegmentIsMadeAheadAndTakenAtTheRotation) {
  char made[] = "/tmp/fencelock-log-XXXXXX";
  ASSERT_NE(mkdtemp(made), nullptr);
  dir_ = made;
  Env* env = Env::Posix();
  constexpr uint64_t kSegment = 1 << 20;
  ASSERT_TRUE(InitDataDir(env, dir_, kSegment).ok());
  Start(env, kSegment);
  const auto size_of = [](const std::string& path) -> int64_t {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
  };
  const std::string second = dir_ + "/" + SegmentName(2);
  for (int i = 0; i < 1000 && size_of(second + ".tmp") != int64_t{kSegment}; ++i) {
    usleep(10'000);
  }
  EXPECT_EQ(size_of(second + ".tmp"), int64_t{kSegment}) << "segment 2 was not made ahead";
  EXPECT_EQ(size_of(second), -1) << "a segment made ahead is there before its rotation";
  // A second name for the file made ahead: the rotation must put that very file in place (a
  // segment made again at the rotation is a new file).
  const std::string probe = dir_ + "/probe";
  ASSERT_EQ(link((second + ".tmp").c_str(), probe.c_str()), 0) << std::strerror(errno);
  const auto inode_of = [](const std::string& path) -> ino_t {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
  };
  for (int round = 0; round < 40 && log_->stats().segment < 3; ++round) {
    Workload(2000, round);
    WaitDurable();
  }
  ASSERT_TRUE(fault_.ok()) << fault_;
  ASSERT_GE(log_->stats().segment, 3u);
  EXPECT_NE(inode_of(probe), ino_t{0});
  EXPECT_EQ(inode_of(second), inode_of(probe)) << "segment 2 was made again at its rotation";
  ASSERT_EQ(unlink(probe.c_str()), 0);
  loop_.RunUntil([&] { return !log_->stats().snapshot_in_progress; });
  WaitDurable();
  // Taken whole: its own name, its size, no temporary file left of it.
  EXPECT_EQ(size_of(dir_ + "/" + SegmentName(3)), int64_t{kSegment});
  EXPECT_EQ(size_of(dir_ + "/" + SegmentName(3) + ".tmp"), -1);
  const std::string before = service_->state().DebugString();
  Stop();
  // The segment made ahead and never taken is a stale temporary file to recovery, which the
  // next open removes before it makes its own.
  auto r = Recover(env, dir_, kNow);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state.DebugString(), before);
  // That open removed segment 4's file made ahead, which this process's Env still counts as
  // made: the rotation to it finds it gone and makes it itself (or takes it, if the thread
  // making it created it only after that open).
  Start(env, kSegment);
  for (int round = 100; round < 140 && log_->stats().segment < 4; ++round) {
    Workload(2000, round);
    WaitDurable();
  }
  ASSERT_TRUE(fault_.ok()) << fault_;
  ASSERT_GE(log_->stats().segment, 4u);
  EXPECT_EQ(size_of(dir_ + "/" + SegmentName(4)), int64_t{kSegment});
  loop_.RunUntil([&] { return !log_->stats().snapshot_in_progress; });
  WaitDurable();
  const std::string after = service_->state().DebugString();
  Stop();
  auto again = Recover(env, dir_, kNow);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state.DebugString(), after);
  std::filesystem::remove_all(dir_);
}

}  // namespace
}  // namespace fencelock::server
