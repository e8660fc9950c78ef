// lockd's core on simulated time and the real local commit log over an in-memory disk: the
// reply gate, expiry on the injected clock, the stall watch, the Hello timeout, and the quiet
// state after a disk fault. Nothing here sleeps or opens a socket.
#include "lock-server/server_core.h"

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "clock/time_source.h"
#include "fencelock/wire.pb.h"
#include "gtest/gtest.h"
#include "lock-server/local_commit_log.h"
#include "lock-server/storage.h"
#include "lock-server/testing/legacy_state.h"
#include "lock-server/testing/test_envs.h"
#include "protocol/frame.h"
#include "protocol/requests.h"
#include "protocol/session.h"

namespace fencelock::server {
namespace {

using namespace ::fencelock::id_literals;
namespace req = protocol::request;

constexpr char kDir[] = "/state";
constexpr absl::Duration kSyncTime = absl::Milliseconds(5);

class Sink : public ConnectionSink {
 public:
  void Send(std::string_view frames) override { decoder_.Feed(frames); }
  void CloseAfterSend() override { closed_ = true; }
  // Every response received since the last call.
  std::vector<wire::Response> Take() {
    std::vector<wire::Response> out;
    std::string payload;
    while (decoder_.Next(&payload) == protocol::FrameDecoder::Result::kFrame) {
      wire::Response r;
      EXPECT_TRUE(r.ParseFromString(payload));
      out.push_back(r);
    }
    return out;
  }
  bool closed() const { return closed_; }

 private:
  protocol::FrameDecoder decoder_;
  bool closed_ = false;
};

class ServerCoreTest : public ::testing::Test {
 protected:
  void Start(Env* env, CoreOptions options = {}) {
    ASSERT_TRUE(InitDataDir(&mem_, kDir, 1 << 20).ok());
    Open(env, options, absl::ZeroDuration());
  }
  // Stops the core and restores its directory, as a restarted lockd does; the restored core
  // begins to serve `wait` later (a standby's wait for the prefix, a slow restore).
  void Restart(absl::Duration wait) {
    core_->Stop();
    core_.reset();
    writer_steps_.clear();
    Open(&mem_, CoreOptions{.stall_threshold = absl::ZeroDuration()}, wait);
  }
  void Open(Env* env, CoreOptions options, absl::Duration wait) {
    // Every disk step of the log takes kSyncTime of simulated time.
    LocalCommitLogOptions log_options{.env = env, .dir = kDir, .inline_sync_max_records = 0};
    log_options.now = [this] { return time_.Now(); };
    if (mark_when_idle_) log_options.time = &time_;
    log_options.schedule_writer = [this](std::function<void()> step) {
      writer_steps_.push_back(time_.NewTimer());
      writer_steps_.back()->ArmAt(time_.Now() + kSyncTime, std::move(step));
    };
    auto opened = OpenLocalCommitLog(log_options, time_.Now(),
                                     [this](std::function<void()> f) { time_.Post(std::move(f)); });
    ASSERT_TRUE(opened.ok()) << opened.status();
    options.log = [this](const std::string& line) { log_.push_back(line); };
    core_ = std::make_unique<ServerCore>(options, &time_, std::move(*opened));
    time_.Advance(wait);
    core_->Start();
  }
  void TearDown() override {
    if (core_) core_->Stop();
    core_.reset();
    writer_steps_.clear();
  }

  ConnectionId Connect(Sink* sink) { return core_->Connect(sink); }
  void Send(ConnectionId c, wire::Request request) {
    request.set_request_id(++request_id_);
    const std::string payload = request.SerializeAsString();
    core_->Receive(c, std::span<const std::string>(&payload, 1));
  }
  void Hello(ConnectionId c) {
    Send(c, protocol::HelloRequest("server_core_test", {.min = 1, .max = 1}));
  }
  void OpenSession(ConnectionId c, absl::Duration ttl) { Send(c, req::OpenSession(ttl)); }
  void Acquire(ConnectionId c, uint64_t session, const std::string& lock, absl::Duration ttl,
               absl::Duration wait = absl::ZeroDuration()) {
    Send(c, req::Acquire(session, lock, wait, ttl));
  }
  void Resume(ConnectionId c, uint64_t session, const std::string& secret) {
    Send(c, req::Resume(session, secret));
  }
  // Acquires `lock` for `session`, lets its batch commit, and returns the granted token.
  uint64_t Hold(ConnectionId c, Sink* sink, uint64_t session, const std::string& lock) {
    Acquire(c, session, lock, absl::Seconds(30));
    time_.Advance(kSyncTime * 4);
    auto granted = sink->Take();
    EXPECT_EQ(granted.size(), 1u);
    return granted.empty() ? 0 : granted[0].acquire().token();
  }
  // Every file of the state directory that holds `bytes`.
  std::vector<std::string> FilesHolding(const std::string& bytes) {
    std::vector<std::string> out;
    for (const auto& [path, contents] : mem_.Files()) {
      if (contents.find(bytes) != std::string::npos) out.push_back(path);
    }
    return out;
  }
  // Connects, says Hello and opens a session; returns the session id.
  uint64_t Session(Sink* sink, ConnectionId* c, absl::Duration ttl) {
    *c = Connect(sink);
    Hello(*c);
    OpenSession(*c, ttl);
    time_.Advance(kSyncTime * 4);
    auto replies = sink->Take();
    EXPECT_EQ(replies.size(), 2u);
    return replies.empty() ? 0 : replies.back().open_session().session_id();
  }

  bool mark_when_idle_ = false;  // LocalCommitLogOptions::time
  MemEnv mem_;
  ManualTimeSource time_;
  std::deque<std::unique_ptr<Timer>> writer_steps_;
  std::unique_ptr<ServerCore> core_;
  std::vector<std::string> log_;
  uint64_t request_id_ = 0;
};

TEST_F(ServerCoreTest, AGrantIsAnsweredOnlyOnceItsRecordIsCommitted) {
  Start(&mem_);
  Sink sink;
  ConnectionId c;
  const uint64_t session = Session(&sink, &c, absl::Seconds(10));
  Acquire(c, session, "payout/1", absl::Seconds(30));
  time_.RunDue();  // the flush is posted; the write takes kSyncTime
  EXPECT_TRUE(sink.Take().empty()) << "a grant left before its record was committed";
  time_.Advance(kSyncTime * 2);  // the reservation, then the batch
  time_.Advance(kSyncTime * 2);
  auto replies = sink.Take();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].acquire().granted());
  // And what was answered is what recovery finds.
  auto recovered = Recover(&mem_, kDir, time_.Now());
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_NE(recovered->state.FindHolder("payout/1"), nullptr);
}

// Issue 37: acquiring a lock the session holds is refused, and the refusal names the grant, so
// that a client whose first Acquire was granted but never answered can take it up.
TEST_F(ServerCoreTest, AnAcquireOfALockTheSessionHoldsNamesTheGrant) {
  Start(&mem_);
  Sink sink;
  ConnectionId c;
  const uint64_t session = Session(&sink, &c, absl::Seconds(10));
  const uint64_t token = Hold(c, &sink, session, "payout/1");
  ASSERT_GT(token, 0u);
  Acquire(c, session, "payout/1", absl::Seconds(5));
  time_.Advance(kSyncTime * 4);
  auto replies = sink.Take();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].code(), wire::INVALID_ARGUMENT);
  EXPECT_FALSE(replies[0].acquire().granted());
  EXPECT_EQ(replies[0].acquire().token(), token);
  EXPECT_EQ(replies[0].acquire().ttl_ms(), 30000u);  // the grant's TTL, not this request's
  EXPECT_EQ(replies[0].acquire().lock(), "payout/1");
  // Another session's lock is not named: a stranger learns no token this way.
  Sink other_sink;
  ConnectionId other;
  const uint64_t stranger = Session(&other_sink, &other, absl::Seconds(10));
  Acquire(other, stranger, "payout/1", absl::Seconds(5));
  time_.Advance(kSyncTime * 4);
  auto busy = other_sink.Take();
  ASSERT_EQ(busy.size(), 1u);
  EXPECT_FALSE(busy[0].acquire().granted());
  EXPECT_EQ(busy[0].acquire().token(), 0u);
}

TEST_F(ServerCoreTest, AKeepAliveWaitsOnlyForTheRecordsItReflects) {
  Start(&mem_);
  Sink a_sink, b_sink;
  ConnectionId a, b;
  const uint64_t sa = Session(&a_sink, &a, absl::Seconds(10));
  const uint64_t sb = Session(&b_sink, &b, absl::Seconds(10));
  const uint64_t token = Hold(a, &a_sink, sa, "held");
  auto keep_alive = [&](uint64_t session, std::vector<std::pair<std::string, uint64_t>> locks) {
    wire::Request r = req::KeepAlive(session);
    for (const auto& [lock, t] : locks) req::AddLock(r, lock, t);
    return r;
  };

  // Another session's grant is on its way to the disk. A's renewal of its committed session
  // and grant reflects neither, and is answered at once, before that batch is synced.
  Acquire(b, sb, "pending", absl::Seconds(30));
  time_.RunDue();
  Send(a, keep_alive(sa, {{"held", token}}));
  auto renewed = a_sink.Take();
  ASSERT_EQ(renewed.size(), 1u) << "a renewal of committed facts waited for another's batch";
  EXPECT_EQ(renewed[0].keep_alive().lock_codes(0), wire::OK);
  EXPECT_TRUE(b_sink.Take().empty()) << "the grant left before its batch was committed";

  // B's renewal of its committed session alone passes B's own grant, still held; a renewal
  // naming that grant (tokens are consecutive: the next one) waits for its batch.
  Send(b, keep_alive(sb, {}));
  auto passed = b_sink.Take();
  ASSERT_EQ(passed.size(), 1u);
  EXPECT_TRUE(passed[0].has_keep_alive());
  const uint64_t pending_token = token + 1;
  Send(b, keep_alive(sb, {{"pending", pending_token}}));
  EXPECT_TRUE(b_sink.Take().empty()) << "a renewal of a pending grant left before the grant";
  time_.Advance(kSyncTime * 4);
  auto replies = b_sink.Take();
  ASSERT_EQ(replies.size(), 2u);  // the grant, and the renewal after it
  EXPECT_EQ(replies[0].acquire().token(), pending_token);
  EXPECT_EQ(replies[1].keep_alive().lock_codes(0), wire::OK);

  // The releaser's own OK reflects only its session and the grant it ended, both committed:
  // it leaves before the release is durable (ADR 0003). A renewal that answers FENCED_OUT
  // reflects the release itself: it waits for every record applied before it.
  Send(b, req::Release(sb, "pending", pending_token));
  time_.RunDue();
  replies = b_sink.Take();
  ASSERT_EQ(replies.size(), 1u) << "the releaser's OK waited for its release's batch";
  EXPECT_EQ(replies[0].code(), wire::OK);
  Send(b, keep_alive(sb, {{"pending", pending_token}}));
  EXPECT_TRUE(b_sink.Take().empty()) << "a FENCED_OUT left before the release was committed";
  time_.Advance(kSyncTime * 4);
  replies = b_sink.Take();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].keep_alive().lock_codes(0), wire::FENCED_OUT);
}

// ADR 0003: a release is acknowledged to its sender before it is durable, and nothing that
// shows the lock free to anyone else is: a waiter's grant waits for the release's batch. A
// crash before that batch finds the lock with its releaser's session, and no grant was
// acknowledged on the lost release.
TEST_F(ServerCoreTest, AReleaseIsAcknowledgedAtOnceAndTheLockShownFreeOnlyOnceDurable) {
  Start(&mem_);
  Sink a_sink, b_sink;
  ConnectionId a, b;
  const uint64_t sa = Session(&a_sink, &a, absl::Seconds(10));
  const uint64_t sb = Session(&b_sink, &b, absl::Seconds(10));
  const uint64_t token = Hold(a, &a_sink, sa, "payout/1");
  Acquire(b, sb, "payout/1", absl::Seconds(30), absl::Seconds(30));  // queued behind A
  time_.Advance(kSyncTime * 4);
  ASSERT_TRUE(b_sink.Take().empty());

  const wire::Request release = req::Release(sa, "payout/1", token);
  Send(a, release);
  auto released = a_sink.Take();
  ASSERT_EQ(released.size(), 1u) << "the release waited for its own batch";
  EXPECT_EQ(released[0].code(), wire::OK);
  EXPECT_TRUE(b_sink.Take().empty()) << "the waiter's grant left before the release was durable";
  // A crash now finds the lock held by its releaser's session, under the same token.
  {
    auto recovered = Recover(&mem_, kDir, time_.Now());
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    const HolderState* holder = recovered->state.FindHolder("payout/1");
    ASSERT_NE(holder, nullptr);
    EXPECT_EQ(holder->session, SessionId(sa));
    EXPECT_EQ(holder->token, FenceToken(token));
  }

  // A release of a lock the session does not hold (here, the same one again) is refused, and
  // the refusal reflects the release: it waits as every other reply does.
  Send(a, release);
  EXPECT_TRUE(a_sink.Take().empty()) << "a FENCED_OUT left before the release was committed";
  time_.Advance(kSyncTime * 4);
  auto pushed = b_sink.Take();
  ASSERT_EQ(pushed.size(), 1u);
  EXPECT_TRUE(pushed[0].acquire().granted());
  EXPECT_GT(pushed[0].acquire().token(), token);
  auto refused = a_sink.Take();
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].code(), wire::OK);
}

// What no reply waits for (a release answered early) waits a moment for the next request's
// records, so that a release and the acquire after it share one sync; alone, it is synced
// within that moment.
TEST_F(ServerCoreTest, AReleaseSharesItsSyncWithTheNextAcquireOrIsSyncedAlone) {
  Start(&mem_);
  Sink sink;
  ConnectionId c;
  const uint64_t session = Session(&sink, &c, absl::Seconds(10));
  const uint64_t first = Hold(c, &sink, session, "payout/1");
  const uint64_t syncs = core_->log().stats().commits;
  Send(c, req::Release(session, "payout/1", first));
  time_.RunDue();
  ASSERT_EQ(sink.Take().size(), 1u);
  time_.Advance(absl::Microseconds(100));  // the worker's next request, a round trip later
  Acquire(c, session, "payout/2", absl::Seconds(30));
  time_.Advance(kSyncTime * 4);
  ASSERT_EQ(sink.Take().size(), 1u);
  EXPECT_EQ(core_->log().stats().commits, syncs + 1) << "the release had a sync of its own";

  // Nothing follows this release: it is on the disk a moment later all the same.
  Send(c, req::Release(session, "payout/2", first + 1));
  time_.RunDue();
  auto released = sink.Take();
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].code(), wire::OK);
  time_.Advance(absl::Milliseconds(2) + kSyncTime * 4);
  auto recovered = Recover(&mem_, kDir, time_.Now());
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->state.FindHolder("payout/2"), nullptr);
  EXPECT_EQ(core_->log().stats().commits, syncs + 2);
}

TEST_F(ServerCoreTest, LeasesExpireOnTheInjectedClockAndTheWaiterIsPushed) {
  Start(&mem_, CoreOptions{.stall_threshold = absl::ZeroDuration()});
  Sink holder_sink, waiter_sink;
  ConnectionId holder, waiter;
  const uint64_t s1 = Session(&holder_sink, &holder, absl::Seconds(2));
  const uint64_t s2 = Session(&waiter_sink, &waiter, absl::Seconds(60));
  Acquire(holder, s1, "payout/7", absl::Seconds(30));
  time_.Advance(absl::Milliseconds(100));
  ASSERT_EQ(holder_sink.Take().size(), 1u);
  Acquire(waiter, s2, "payout/7", absl::Seconds(30), absl::Seconds(30));
  time_.Advance(absl::Milliseconds(100));
  EXPECT_TRUE(waiter_sink.Take().empty());  // queued
  // Session 1 is never renewed: it expires 2 s after it was opened, on simulated time only.
  time_.Advance(absl::Seconds(2));
  auto pushed = waiter_sink.Take();
  ASSERT_EQ(pushed.size(), 1u);
  EXPECT_TRUE(pushed[0].acquire().granted());
  EXPECT_EQ(core_->stats().service.session_expiries_total, 1u);
}

// Issue 33: a standby that had waited 8 s restored every lease as of the start of its wait and
// expired a 6 s session the moment it served, granting its lock to another. Restored leases
// run their full TTL from when the core begins to serve.
TEST_F(ServerCoreTest, RestoredLeasesRunTheirFullTtlFromWhenTheCoreBeginsToServe) {
  Start(&mem_, CoreOptions{.stall_threshold = absl::ZeroDuration()});
  Sink sink;
  ConnectionId c;
  const uint64_t session = Session(&sink, &c, absl::Seconds(6));
  Acquire(c, session, "payout/1", absl::Seconds(6));
  time_.Advance(kSyncTime * 4);
  ASSERT_EQ(sink.Take().size(), 1u);

  // Restored now, served 8 s later: longer than both TTLs.
  Restart(absl::Seconds(8));
  ASSERT_NE(core_->service().state().FindHolder("payout/1"), nullptr)
      << "a restored lock was freed the moment the core began to serve";
  Sink other_sink;
  ConnectionId other;
  const uint64_t other_session = Session(&other_sink, &other, absl::Seconds(60));
  Acquire(other, other_session, "payout/1", absl::Seconds(6));
  time_.Advance(kSyncTime * 4);
  auto refused = other_sink.Take();
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_FALSE(refused[0].acquire().granted()) << "a held lock was granted to another";
  // Held until 6 s after the core began to serve (the session's last renewal), not before.
  time_.Advance(absl::Seconds(6) - kSyncTime * 4 * 2 - absl::Milliseconds(1));
  EXPECT_NE(core_->service().state().FindSession(SessionId(session)), nullptr);
  EXPECT_NE(core_->service().state().FindHolder("payout/1"), nullptr);
  time_.Advance(absl::Milliseconds(2));
  EXPECT_EQ(core_->service().state().FindSession(SessionId(session)), nullptr);
  EXPECT_EQ(core_->service().state().FindHolder("payout/1"), nullptr);
}

// Issue 33: the log held each session's secret in clear, so whoever could read the state (a
// state directory, etcd's keys) resumed another's session and released its lock. Only a
// digest is kept, and it still resumes the session after a restart.
TEST_F(ServerCoreTest, NoSessionSecretIsKeptInClear) {
  Start(&mem_);
  Sink sink;
  const ConnectionId c = Connect(&sink);
  Hello(c);
  OpenSession(c, absl::Seconds(60));
  time_.Advance(kSyncTime * 4);
  auto replies = sink.Take();
  ASSERT_EQ(replies.size(), 2u);
  const uint64_t session = replies[1].open_session().session_id();
  const std::string secret = replies[1].open_session().secret();
  ASSERT_EQ(secret.size(), 16u);
  EXPECT_EQ(FilesHolding(secret), std::vector<std::string>{});
  EXPECT_EQ(core_->service().state().FindSession(SessionId(session))->secret_digest,
            SessionSecretDigest(SessionId(session), secret));

  Restart(absl::ZeroDuration());
  Sink again_sink;
  const ConnectionId again = Connect(&again_sink);
  Hello(again);
  Resume(again, session, std::string(16, 'x'));
  Resume(again, session, secret);
  time_.Advance(kSyncTime * 4);
  replies = again_sink.Take();
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[1].code(), wire::PERMISSION_DENIED);
  EXPECT_EQ(replies[2].code(), wire::OK) << replies[2].message();
  EXPECT_EQ(FilesHolding(secret), std::vector<std::string>{});
}

// The upgrade: a state whose snapshot holds a secret in clear is read (the digest computed as
// it is read), and lockd writes a snapshot at once that keeps only digests, replacing it.
TEST_F(ServerCoreTest, AStateWithASecretInClearIsRewrittenWithItsDigest) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 1 << 20).ok());
  const std::string secret = "an-old-secret-16";
  mem_.PutFile(absl::StrCat(kDir, "/", SnapshotName(0)),
               SnapshotWithASecretInClear(1_session, absl::Seconds(60), secret));
  ASSERT_EQ(FilesHolding(secret).size(), 1u);
  Open(&mem_, CoreOptions{}, absl::ZeroDuration());
  time_.Advance(kSyncTime * 4);
  EXPECT_EQ(FilesHolding(secret), std::vector<std::string>{});
  ASSERT_FALSE(log_.empty());
  EXPECT_NE(log_[0].find("1 secret (a session's or a pool manager's) was stored in clear"),
            std::string::npos)
      << log_[0];
  Sink sink;
  const ConnectionId c = Connect(&sink);
  Hello(c);
  Resume(c, 1, secret);
  time_.Advance(kSyncTime * 4);
  auto replies = sink.Take();
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[1].code(), wire::OK) << replies[1].message();
  // Restarted on the rewritten state, nothing is left to upgrade.
  Restart(absl::ZeroDuration());
  EXPECT_EQ(core_->service().state().secrets_read_in_clear(), 0u);
}

// The same for a pool manager's owner key (ADR 0002, rule 4): kept only as a digest, an older
// lockd's key in clear rewritten at once, and the manager's key still proves it.
TEST_F(ServerCoreTest, APoolOwnerKeyInClearIsRewrittenWithItsDigest) {
  ASSERT_TRUE(InitDataDir(&mem_, kDir, 1 << 20).ok());
  const std::string key = "an-old-owner-key";
  mem_.PutFile(absl::StrCat(kDir, "/", SnapshotName(0)),
               SnapshotWithAPoolOwnerKeyInClear("hosts", "build", key));
  ASSERT_EQ(FilesHolding(key).size(), 1u);
  Open(&mem_, CoreOptions{}, absl::ZeroDuration());
  time_.Advance(kSyncTime * 4);
  EXPECT_EQ(FilesHolding(key), std::vector<std::string>{});
  Sink sink;
  // A manager on the Unix socket (ADR 0004). The claim is older than claimers' identities: any
  // identity the rights admit may act for it.
  const ConnectionId c = core_->Connect(&sink, "uid:1000");
  Send(c, protocol::HelloRequest("server_core_test", {.min = 1, .max = 3}));
  auto ack = [&](const std::string& with) {
    return req::PoolAck("hosts", "build", req::Owner(1, with), 1);
  };
  Send(c, ack(std::string(16, 'x')));
  Send(c, ack(key));
  time_.Advance(kSyncTime * 4);
  auto replies = sink.Take();
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[1].code(), wire::PERMISSION_DENIED) << replies[1].message();
  EXPECT_EQ(replies[2].code(), wire::OK) << replies[2].message();
  EXPECT_EQ(FilesHolding(key), std::vector<std::string>{});
}

// Issue 33: the COMMITTED mark was written only by a later commit, so on an idle lockd a grant
// acknowledged seconds before a crash stayed above it, and a damaged record of it was dropped
// silently at recovery. With timers, the mark follows the last commit within its interval.
TEST_F(ServerCoreTest, TheCommittedMarkFollowsTheLastCommitWhenIdle) {
  mark_when_idle_ = true;
  Start(&mem_, CoreOptions{.stall_threshold = absl::ZeroDuration()});
  Sink sink;
  ConnectionId c;
  // The session's commit writes the first mark; the grant's, 20 ms later, is left for later.
  const uint64_t session = Session(&sink, &c, absl::Seconds(60));
  Acquire(c, session, "payout/1", absl::Seconds(60));
  time_.Advance(kSyncTime * 4);
  ASSERT_EQ(sink.Take().size(), 1u);
  const uint64_t granted_lsn = core_->log().last_lsn();
  const std::string mark_path = absl::StrCat(kDir, "/", kCommittedFile);
  EXPECT_NE(mem_.Files()[mark_path], EncodeCommittedMark(granted_lsn))
      << "the grant's commit was marked at once: the test shows nothing";
  // Nothing else happens: within the interval (1 s) the mark covers the grant.
  time_.Advance(absl::Seconds(1) + kSyncTime * 2);
  EXPECT_EQ(mem_.Files()[mark_path], EncodeCommittedMark(granted_lsn));
}

TEST_F(ServerCoreTest, AFreezeOfTheCoreExtendsLeasesButBusyTimeDoesNot) {
  Start(&mem_, CoreOptions{.stall_threshold = absl::Seconds(1)});
  Sink sink;
  ConnectionId c;
  const uint64_t session = Session(&sink, &c, absl::Seconds(3));
  // The core's thread does not run for 5 s: longer than the session's TTL.
  time_.Freeze(absl::Seconds(5));
  time_.RunDue();
  EXPECT_EQ(core_->stats().stalls_total, 1u);
  EXPECT_EQ(core_->stats().service.session_expiries_total, 0u);
  ASSERT_NE(core_->service().state().FindSession(SessionId(session)), nullptr);
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_NE(log_[0].find("did not run for 5"), std::string::npos) << log_[0];
  // Running normally, the session then expires about its TTL after the stall.
  time_.Advance(absl::Seconds(4));
  EXPECT_EQ(core_->stats().service.session_expiries_total, 1u);
  EXPECT_EQ(core_->stats().stalls_total, 1u);
}

TEST_F(ServerCoreTest, TimeTheCoreSpentServingIsNotAStall) {
  Start(&mem_, CoreOptions{.stall_threshold = absl::Seconds(1)});
  Sink sink;
  ConnectionId c;
  const uint64_t session = Session(&sink, &c, absl::Seconds(3));
  // One handler keeps the core's thread busy for 5 s: it ran the whole time, so the gap is
  // not time lost to a freeze, and the session (never renewed) expires.
  time_.Busy(absl::Seconds(5));
  time_.RunDue();
  EXPECT_EQ(core_->stats().stalls_total, 0u);
  EXPECT_EQ(core_->service().state().FindSession(SessionId(session)), nullptr);
  EXPECT_EQ(core_->stats().service.session_expiries_total, 1u);
  // Busy for 2 s, then frozen for 3 s: only the 3 s not run are owed.
  const uint64_t second = Session(&sink, &c, absl::Seconds(10));
  time_.Busy(absl::Seconds(2));
  time_.Freeze(absl::Seconds(3));
  time_.RunDue();
  EXPECT_EQ(core_->stats().stalls_total, 1u);
  ASSERT_FALSE(log_.empty());
  EXPECT_NE(log_.back().find("did not run for 3"), std::string::npos) << log_.back();
  EXPECT_NE(core_->service().state().FindSession(SessionId(second)), nullptr);
}

TEST_F(ServerCoreTest, NoHelloWithinTheTimeoutClosesTheConnection) {
  Start(&mem_, CoreOptions{.connections = {.hello_timeout = absl::Seconds(3)}});
  Sink silent, polite;
  const ConnectionId quiet = Connect(&silent);
  const ConnectionId talker = Connect(&polite);
  Hello(talker);
  time_.Advance(absl::Seconds(2));
  EXPECT_FALSE(silent.closed());
  time_.Advance(absl::Seconds(2));
  EXPECT_TRUE(silent.closed());
  EXPECT_FALSE(polite.closed());
  auto replies = silent.Take();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].code(), wire::HELLO_REQUIRED);
  core_->Disconnect(quiet);
  EXPECT_EQ(core_->stats().protocol_errors_total, 1u);
}

TEST_F(ServerCoreTest, AConnectionIdleAfterHelloIsClosedUnlessItHasASession) {
  Start(&mem_, CoreOptions{.connections = {.idle_timeout = absl::Seconds(30)},
                           .stall_threshold = absl::ZeroDuration()});
  Sink idle_sink, busy_sink;
  const ConnectionId idle = Connect(&idle_sink);
  Hello(idle);
  ConnectionId busy;
  const uint64_t session = Session(&busy_sink, &busy, absl::Seconds(100));
  ASSERT_NE(session, 0u);
  time_.Advance(absl::Seconds(20));
  Hello(idle);  // a request (refused: a second Hello) keeps it from being idle for now
  time_.Advance(absl::Seconds(29));
  EXPECT_FALSE(idle_sink.closed());
  time_.Advance(absl::Seconds(2));
  EXPECT_TRUE(idle_sink.closed());
  auto replies = idle_sink.Take();
  ASSERT_FALSE(replies.empty());
  EXPECT_EQ(replies.back().code(), wire::UNAVAILABLE);
  EXPECT_NE(replies.back().message().find("--idle-timeout"), std::string::npos);
  EXPECT_EQ(core_->stats().connections_closed_idle_total, 1u);
  core_->Disconnect(idle);
  // The other connection sent nothing for as long, but its session is open (it would renew
  // it before the session's TTL): it stays until the session ends.
  EXPECT_FALSE(busy_sink.closed());
  time_.Advance(absl::Seconds(100));  // the session expires unrenewed
  EXPECT_TRUE(busy_sink.closed());
  EXPECT_EQ(core_->stats().connections_closed_idle_total, 2u);
}

TEST_F(ServerCoreTest, AfterADiskFaultNothingIsAcknowledgedAndNoTimerSpins) {
  FaultInjectingEnv faulty(&mem_);
  Start(&faulty, CoreOptions{.stall_threshold = absl::ZeroDuration()});
  Sink sink;
  ConnectionId c;
  const uint64_t session = Session(&sink, &c, absl::Seconds(2));
  faulty.SetDiskFull(true);
  Acquire(c, session, "payout/9", absl::Seconds(30));
  time_.Advance(absl::Milliseconds(100));
  auto replies = sink.Take();
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].code(), wire::UNAVAILABLE);
  ASSERT_NE(core_->log().fault(), nullptr);
  // The session's expiry is due in 2 s, but expiries are mutations: after the fault the core
  // arms nothing for it, so nothing wakes again and again. Only the connection's idle check
  // (it still has an open session) looks once per idle timeout.
  time_.Advance(absl::Seconds(5));
  EXPECT_GE(time_.NextEventAt(), time_.Now() + absl::Seconds(50));
  EXPECT_LE(time_.Advance(absl::Minutes(10)), 12);  // about one a minute
  EXPECT_EQ(core_->stats().service.session_expiries_total, 0u);
}


// The leader a standby names is read from the serving replica's P/owner value.
TEST(LeadershipTest, TheServingReplicasAddressIsReadFromItsOwnerValue) {
  EXPECT_EQ(LeaderOfOwner("lockd pid 7 on host h (tcp 10.0.0.1:7420)").address, "10.0.0.1:7420");
  EXPECT_EQ(LeaderOfOwner("lockd pid 7 on host h (tcp 10.0.0.1:7420)").description,
            "lockd pid 7 on host h (tcp 10.0.0.1:7420)");
  EXPECT_EQ(LeaderOfOwner("lockd pid 7 on host h (tcp 0.0.0.0:0)").address, "");  // no port yet
  EXPECT_EQ(LeaderOfOwner("lockd pid 7 on host h (unix socket only)").address, "");
  EXPECT_EQ(LeaderOfOwner("lockd pid 7 (tcp 10.0.0.1:7420").address, "");  // cut short
  const std::unique_ptr<Leadership> sole = SoleLeadership();
  EXPECT_EQ(sole->role(), Role::kServing);
  EXPECT_EQ(sole->ServesUntil(), MonoTime::Max());
  EXPECT_FALSE(sole->leased());
}

// A core whose leadership is StandingBy answers NOT_LEADER and closes: first saying no replica
// serves, then naming the one it was told of, with its address in the Hello reply.
TEST(LeadershipTest, AStandbysCoreNamesTheServingReplicaOnceToldOfIt) {
  ManualTimeSource time;
  OpenedCommitLog nothing;
  nothing.log = StandbyCommitLog("/p");
  auto standing_by = std::make_unique<StandingBy>();
  StandingBy* leader = standing_by.get();
  nothing.leadership = std::move(standing_by);
  ServerCore core(CoreOptions{.stall_threshold = absl::ZeroDuration()}, &time, std::move(nothing));
  core.Start();
  auto ask = [&core](Sink* sink) {
    const ConnectionId c = core.Connect(sink);
    wire::Request hello = protocol::HelloRequest("server_core_test", {.min = 1, .max = 1});
    std::string payload;
    EXPECT_TRUE(hello.SerializeToString(&payload));
    core.Receive(c, std::span<const std::string>(&payload, 1));
    std::vector<wire::Response> got = sink->Take();
    EXPECT_TRUE(sink->closed());
    core.Disconnect(c);
    return got.size() == 1 ? got[0] : wire::Response();
  };
  Sink before;
  wire::Response r = ask(&before);
  EXPECT_EQ(r.code(), wire::NOT_LEADER) << r.ShortDebugString();
  EXPECT_NE(r.message().find("no replica serves the prefix just now"), std::string::npos);
  leader->SetLeader(LeaderOfOwner("lockd pid 7 on host h (tcp 10.0.0.1:7420)"));
  Sink after;
  r = ask(&after);
  EXPECT_EQ(r.code(), wire::NOT_LEADER) << r.ShortDebugString();
  EXPECT_NE(r.message().find("the serving replica is lockd pid 7"), std::string::npos);
  EXPECT_EQ(r.hello().leader(), "10.0.0.1:7420");
  core.Stop();
}

}  // namespace
}  // namespace fencelock::server
