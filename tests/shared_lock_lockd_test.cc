// Shared locks and the lock delay (ADR 0006) against a real lockd over real sockets: eight
// readers at once while a writer waits, readers queued behind a waiting writer, tokens rising
// across modes and the resource fence refusing a stale writer after newer grants, a client of
// protocol version 4 on a lock that others take shared, and the lock delay after a holder that
// stopped renewing (measured), after a clean release (none), and across a lockd restart.
#include <map>
#include <string>
#include <thread>

#include "fence/fence.h"
#include "fencelock/wire.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "raw_connection.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using testing::LockdProcess;
using testing::RawConnection;
namespace request = testing::request;

class SharedLockLockdTest : public ::testing::Test {
 protected:
  explicit SharedLockLockdTest(LockdProcess::Options options = {}) : lockd_(std::move(options)) {}

  std::unique_ptr<Client> NewClient() {
    auto client = Client::Create({.server = lockd_.tcp_address()});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }
  wire::StatsReply Stats() {
    RawConnection admin = RawConnection::Tcp(lockd_.port());
    admin.Hello();
    return admin.Call(request::GetStats()).stats();
  }
  wire::LockInfo Listed(const std::string& lock) {
    RawConnection admin = RawConnection::Tcp(lockd_.port());
    admin.Hello();
    wire::Request list;
    list.mutable_list_locks()->set_prefix(lock);
    const wire::Response reply = admin.Call(list);
    for (const wire::LockInfo& info : reply.list().locks()) {
      if (info.lock() == lock) return info;
    }
    return {};
  }
  void WaitForWaiters(uint64_t n) {
    for (int i = 0; i < 2000 && Stats().waiters() != n; ++i) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_EQ(Stats().waiters(), n);
  }

  LockdProcess lockd_;
};

TEST_F(SharedLockLockdTest, EightReadersHoldAtOnceAndTheWaitingWriterIsGrantedWhenTheyRelease) {
  std::vector<std::unique_ptr<Client>> readers;
  std::vector<LockHandle> held;
  for (int i = 0; i < 8; ++i) {
    readers.push_back(NewClient());
    auto h = readers.back()->acquireShared("doc", absl::Seconds(5));
    ASSERT_TRUE(h.ok()) << "reader " << i << ": " << h.status();
    EXPECT_EQ(h->mode(), LockMode::kShared);
    if (!held.empty()) {
      EXPECT_GT(h->token(), held.back().token());
    }
    held.push_back(*h);
  }
  wire::LockInfo info = Listed("doc");
  EXPECT_EQ(info.mode(), wire::SHARED);
  EXPECT_EQ(info.holders_size(), 8);
  EXPECT_EQ(Stats().locks_held(), 1u);

  auto writer = NewClient();
  std::atomic<uint64_t> writer_token{0};
  std::thread w([&] {
    auto h = writer->acquire("doc", absl::Seconds(30));
    ASSERT_TRUE(h.ok()) << h.status();
    writer_token = h->token();
  });
  WaitForWaiters(1);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(readers[i]->release(held[i]).ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(writer_token.load(), 0u) << "granted while a reader still held";
  ASSERT_TRUE(readers[7]->release(held[7]).ok());
  w.join();
  EXPECT_GT(writer_token.load(), held.back().token());
  EXPECT_EQ(Listed("doc").mode(), wire::EXCLUSIVE);
  // GetStats: the named field is the locks' count (not the pools' counter of the same field
  // name), and every counter is in `counters` by its Prometheus name.
  const wire::StatsReply stats = Stats();
  EXPECT_EQ(stats.grants_total(), 9u);
  std::map<std::string, uint64_t> counters;
  for (const wire::CounterValue& c : stats.counters()) counters[c.name()] = c.value();
  EXPECT_EQ(counters["lockd_grants_total"], 9u);
  EXPECT_EQ(counters["lockd_shared_grants_total"], 8u);
  EXPECT_EQ(counters["lockd_pool_grants_total"], 0u);
}

TEST_F(SharedLockLockdTest, NewReadersQueueBehindAWaitingWriter) {
  auto r1 = NewClient(), writer = NewClient(), r2 = NewClient();
  auto first = r1->acquireShared("q", absl::Seconds(5));
  ASSERT_TRUE(first.ok()) << first.status();
  std::atomic<uint64_t> writer_token{0}, reader_token{0};
  std::thread w([&] {
    auto h = writer->acquireScoped("q", absl::Seconds(30));
    ASSERT_TRUE(h.ok()) << h.status();
    writer_token = h->token();
    absl::SleepFor(absl::Milliseconds(200));  // released at the end of the scope
  });
  WaitForWaiters(1);
  // Held shared, but a writer waits: a new reader is not granted at once...
  auto busy = r2->tryAcquireShared("q");
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_FALSE(busy->has_value());
  // ...and one that waits is granted after the writer, not before.
  std::thread r([&] {
    auto h = r2->acquireSharedScoped("q", absl::Seconds(30));
    ASSERT_TRUE(h.ok()) << h.status();
    reader_token = h->token();
  });
  WaitForWaiters(2);
  ASSERT_TRUE(r1->release(*first).ok());
  w.join();
  r.join();
  EXPECT_GT(writer_token.load(), first->token());
  EXPECT_GT(reader_token.load(), writer_token.load());
}

// Tokens from lockd, fenced by the resource (fence 2 with its read and write registers): a
// writer that lost its lock is refused once newer holders of either mode touched the resource,
// and readers holding together never refuse each other.
TEST_F(SharedLockLockdTest, TheFenceRefusesAStaleWriterAfterNewerGrants) {
  auto a = NewClient(), b = NewClient(), c = NewClient();
  auto fence = fence::TokenFence::InMemory();
  auto w1 = a->acquire("acct", absl::Seconds(5));
  ASSERT_TRUE(w1.ok());
  ASSERT_TRUE(fence->Admit("acct", w1->token()).ok());
  ASSERT_TRUE(a->release(*w1).ok());  // as if lost: a still has its token
  auto r1 = b->acquireShared("acct", absl::Seconds(5));
  auto r2 = c->acquireShared("acct", absl::Seconds(5));
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_GT(r1->token(), w1->token());
  // The later reader reads first; the earlier one is still admitted.
  EXPECT_TRUE(fence->AdmitRead("acct", r2->token()).ok());
  EXPECT_TRUE(fence->AdmitRead("acct", r1->token()).ok());
  const absl::Status stale_write = fence->Admit("acct", w1->token());
  EXPECT_EQ(stale_write.code(), absl::StatusCode::kAborted) << stale_write;
  ASSERT_TRUE(b->release(*r1).ok());
  ASSERT_TRUE(c->release(*r2).ok());
  auto w2 = a->acquire("acct", absl::Seconds(5));
  ASSERT_TRUE(w2.ok());
  EXPECT_GT(w2->token(), r2->token());
  EXPECT_TRUE(fence->Admit("acct", w2->token()).ok());
  // A reader whose lock ended before that write is refused too.
  EXPECT_EQ(fence->AdmitRead("acct", r2->token()).code(), absl::StatusCode::kAborted);
}

TEST_F(SharedLockLockdTest, AClientOfProtocolFourKeepsWorkingOnALockOthersTakeShared) {
  RawConnection old = RawConnection::Tcp(lockd_.port());
  wire::Request hello = request::Hello();
  hello.mutable_hello()->set_max_version(4);
  ASSERT_EQ(old.Call(hello).hello().version(), 4u);
  wire::Response opened = old.Call(request::OpenSession(absl::Seconds(60)));
  ASSERT_EQ(opened.code(), wire::OK);
  const uint64_t session = opened.open_session().session_id();

  auto reader = NewClient();
  auto shared = reader->acquireShared("mixed", absl::Seconds(5));
  ASSERT_TRUE(shared.ok());
  // Its Acquire carries no mode: it asks for exclusive and waits behind the reader.
  wire::Request acquire = request::Acquire(session, "mixed", absl::Seconds(30));
  acquire.set_request_id(41);
  ASSERT_TRUE(old.SendRequest(acquire));
  EXPECT_FALSE(old.ReadResponse(absl::Milliseconds(200)).has_value());
  ASSERT_TRUE(reader->release(*shared).ok());
  auto granted = old.ReadResponse(absl::Seconds(10));
  ASSERT_TRUE(granted.has_value());
  EXPECT_EQ(granted->code(), wire::OK) << granted->message();
  EXPECT_GT(granted->acquire().token(), shared->token());
  // While it holds, a reader of version 5 cannot get in.
  auto busy = reader->tryAcquireShared("mixed");
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE(busy->has_value());
  // Asking for shared on version 4 is refused, not read as exclusive.
  wire::Request shared_on_four = request::Acquire(session, "other", absl::ZeroDuration(),
                                                  absl::ZeroDuration(), wire::SHARED);
  wire::Response refused = old.Call(shared_on_four);
  EXPECT_NE(refused.code(), wire::OK);
  EXPECT_THAT(refused.message(), HasSubstr("5"));
}

// What a stranger or a broken client might send: a mode no version knows, an absurd delay.
TEST_F(SharedLockLockdTest, AnUnknownModeAndAnAbsurdDelayAreRefusedAndHoldNothing) {
  RawConnection c = RawConnection::Tcp(lockd_.port());
  const uint64_t session = c.HelloAndOpenSession(absl::Seconds(60));
  wire::Request odd = request::Acquire(session, "odd");
  odd.mutable_acquire()->set_mode(static_cast<wire::LockMode>(7));
  wire::Response refused = c.Call(odd);
  EXPECT_EQ(refused.code(), wire::INVALID_ARGUMENT);
  EXPECT_THAT(refused.message(), HasSubstr("unknown lock mode 7"));
  wire::Request forever = request::Acquire(session, "odd");
  forever.mutable_acquire()->set_lock_delay_ms(UINT64_MAX);
  refused = c.Call(forever);
  EXPECT_EQ(refused.code(), wire::INVALID_ARGUMENT);
  EXPECT_THAT(refused.message(), HasSubstr("--max-lock-delay"));
  EXPECT_EQ(Stats().locks_held(), 0u);
  EXPECT_EQ(c.Call(request::Acquire(session, "odd")).code(), wire::OK);  // the connection works
}

// 1,200 sessions hold one lock shared: each is its own lease, and the listing stays one frame
// (the first 1,000 holders, and the count of all).
TEST_F(SharedLockLockdTest, ALockHeldByMoreReadersThanAListingShowsStillLists) {
  constexpr int kReaders = 1200;
  std::vector<RawConnection> conns;
  int granted = 0;
  for (int c = 0; c * 60 < kReaders; ++c) {
    conns.push_back(RawConnection::Tcp(lockd_.port()));
    conns.back().Hello();
    std::vector<wire::Request> opens(60, request::OpenSession(absl::Seconds(60)));
    std::vector<wire::Request> acquires;
    for (const wire::Response& r : conns.back().Pipeline(opens)) {
      acquires.push_back(request::Acquire(r.open_session().session_id(), "many",
                                          absl::ZeroDuration(), absl::ZeroDuration(),
                                          wire::SHARED));
    }
    for (const wire::Response& r : conns.back().Pipeline(acquires)) {
      if (r.code() == wire::OK && r.acquire().granted()) ++granted;
    }
  }
  EXPECT_EQ(granted, kReaders);
  const wire::LockInfo info = Listed("many");
  EXPECT_EQ(info.holder_count(), static_cast<uint32_t>(kReaders));
  EXPECT_EQ(info.holders_size(), 1000);
  EXPECT_EQ(info.mode(), wire::SHARED);
}

class LockDelayLockdTest : public SharedLockLockdTest {
 protected:
  LockDelayLockdTest()
      : SharedLockLockdTest(LockdProcess::Options{.extra_args = {"--max-lock-delay=5s"}}) {}

  // A holder that renews nothing after its grant (a frozen process, as far as lockd can tell):
  // a raw session with a long TTL whose lock has a short one. Returns the time just before the
  // Acquire was written.
  MonoTime HoldAndFreeze(RawConnection& conn, const std::string& lock, absl::Duration ttl,
                         absl::Duration delay) {
    const uint64_t session = conn.HelloAndOpenSession(absl::Seconds(60));
    const MonoTime sent = Clock::Real()->Now();
    wire::Response r = conn.Call(request::Acquire(session, lock, absl::ZeroDuration(), ttl,
                                                  wire::EXCLUSIVE, delay));
    EXPECT_EQ(r.code(), wire::OK) << r.message();
    return sent;
  }
};

TEST_F(LockDelayLockdTest, AHolderFrozenPastItsLeaseDelaysTheNextGrantByItsDelay) {
  constexpr absl::Duration kTtl = absl::Milliseconds(300);
  constexpr absl::Duration kDelay = absl::Seconds(1);
  RawConnection frozen = RawConnection::Tcp(lockd_.port());
  const MonoTime sent = HoldAndFreeze(frozen, "d", kTtl, kDelay);
  auto next = NewClient();
  auto h = next->acquire("d", absl::Seconds(10));
  const MonoTime granted = Clock::Real()->Now();
  ASSERT_TRUE(h.ok()) << h.status();
  // Never before the lease and the delay have both run from the moment lockd could have
  // received the Acquire.
  const absl::Duration after_send = granted - sent;
  EXPECT_GE(after_send, kTtl + kDelay);
  std::printf("lock delay %s after a lease of %s: granted %s after the frozen holder's Acquire "
              "was sent (%s past lease + delay)\n",
              absl::FormatDuration(kDelay).c_str(), absl::FormatDuration(kTtl).c_str(),
              absl::FormatDuration(after_send).c_str(),
              absl::FormatDuration(after_send - kTtl - kDelay).c_str());
  const wire::StatsReply stats = Stats();
  EXPECT_EQ(stats.lock_delays_started_total(), 1u);
  EXPECT_GE(stats.lock_delay_blocked_acquires_total(), 1u);
}

TEST_F(LockDelayLockdTest, ACleanReleaseStartsNoDelay) {
  RawConnection holder = RawConnection::Tcp(lockd_.port());
  const uint64_t session = holder.HelloAndOpenSession(absl::Seconds(60));
  wire::Response r = holder.Call(request::Acquire(session, "c", absl::ZeroDuration(),
                                                  absl::Seconds(30), wire::EXCLUSIVE,
                                                  absl::Seconds(5)));
  ASSERT_EQ(r.code(), wire::OK);
  ASSERT_EQ(holder.Call(request::Release(session, "c", r.acquire().token())).code(), wire::OK);
  auto next = NewClient();
  auto h = next->tryAcquire("c");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->has_value());
  EXPECT_EQ(Stats().lock_delays_started_total(), 0u);
}

TEST_F(LockDelayLockdTest, ADelayAboveTheServersBoundIsRefusedNamingTheFlag) {
  auto client = NewClient();
  auto h = client->acquire("b", absl::Seconds(1),
                           AcquireOptions{.lock_delay = absl::Seconds(6)});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status().message(), HasSubstr("--max-lock-delay"));
}

// lockd killed during a delay: the restarted lockd gives the delay its full length from
// recovery, never shorter, and lockctl's listing shows it.
TEST_F(LockDelayLockdTest, ADelaySurvivesARestartInFull) {
  constexpr absl::Duration kDelay = absl::Seconds(2);
  RawConnection frozen = RawConnection::Tcp(lockd_.port());
  HoldAndFreeze(frozen, "r", absl::Milliseconds(200), kDelay);
  // The lease ends at about 200 ms; the delay would end about 2.2 s after the grant.
  absl::SleepFor(absl::Milliseconds(700));
  EXPECT_GT(Listed("r").delay_left_ms(), 0u);
  // The restarted lockd begins to serve after this: its delay ends at least kDelay later.
  const MonoTime killed = Clock::Real()->Now();
  lockd_.Kill();
  lockd_.Restart();
  const wire::LockInfo info = Listed("r");
  EXPECT_EQ(info.holders_size(), 0);
  EXPECT_TRUE(info.delay_blocks_shared());
  EXPECT_GE(absl::Milliseconds(info.delay_left_ms()),
            kDelay - (Clock::Real()->Now() - killed) - absl::Milliseconds(1));
  auto next = NewClient();
  auto h = next->acquire("r", absl::Seconds(10));
  ASSERT_TRUE(h.ok()) << h.status();
  // The delay as first started would have ended about 1.5 s after the kill.
  EXPECT_GE(Clock::Real()->Now() - killed, kDelay);
}

}  // namespace
}  // namespace fencelock
