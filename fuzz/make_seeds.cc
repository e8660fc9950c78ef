// Writes the seed corpora in fuzz/corpus/ and the hand-made regression inputs in
// fuzz/regressions/ (committed; re-run only to regenerate them):
//   make_seeds <fuzz-dir>
// Each seed is a well-formed input built with the real encoders, so the fuzzers start from
// frames, conversations, records and snapshots that lockd actually produces.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fencelock/wire.pb.h"
#include "protocol/frame.h"
#include "protocol/requests.h"
#include "protocol/session.h"
#include "protocol/version.h"
#include "lock-server/state_machine.h"
#include "lock-server/storage.h"

namespace {

using namespace fencelock;
using namespace fencelock::server;
using namespace fencelock::id_literals;
namespace request = fencelock::protocol::request;

void Write(const std::filesystem::path& dir, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string Framed(const wire::Request& r) {
  std::string out;
  (void)protocol::AppendFrame(r.SerializeAsString(), &out);
  return out;
}

// One dispatch_fuzz step: a clock step (in 20 ms units, at most 127) and the connection (0 or
// 1) in one byte, then the frame's bytes with their length.
std::string Step(uint8_t clock_step, const wire::Request& r, int connection = 0) {
  const std::string frame = Framed(r);
  std::string out(1, static_cast<char>((std::min<uint8_t>(clock_step, 127) << 1) | connection));
  out += static_cast<char>(frame.size() & 0xff);
  out += static_cast<char>(frame.size() >> 8);
  return out + frame;
}

wire::Request WithId(uint64_t id, wire::Request r) {
  r.set_request_id(id);
  return r;
}

wire::Request Hello() { return WithId(1, protocol::HelloRequest("seed")); }

wire::Request Open(uint64_t id, uint64_t ttl_ms) {
  return WithId(id, request::OpenSession(absl::Milliseconds(ttl_ms)));
}

wire::Request Acquire(uint64_t id, uint64_t session, const std::string& lock, uint64_t wait_ms) {
  return WithId(id, request::Acquire(session, lock, absl::Milliseconds(wait_ms), absl::Seconds(2)));
}

wire::Request KeepAlive(uint64_t id, uint64_t session, const std::string& lock, uint64_t token) {
  return WithId(id, request::KeepAlive(session, lock, token));
}

wire::Request Release(uint64_t id, uint64_t session, const std::string& lock, uint64_t token) {
  return WithId(id, request::Release(session, lock, token));
}

wire::Request Resume(uint64_t id, uint64_t session, const std::string& secret) {
  return WithId(id, request::Resume(session, secret));
}

std::string RecordPayload(const Record& r) {
  return EncodeRecordFrame(1, r).substr(kRecordHeaderBytes);  // the serialized LogRecord
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <fuzz-dir>\n");
    return 2;
  }
  const std::filesystem::path root = std::filesystem::path(argv[1]) / "corpus";
  const std::filesystem::path regressions = std::filesystem::path(argv[1]) / "regressions";
  const MonoTime t0 = MonoTime::FromNanos(1'000'000'000'000);

  // frame_decoder_fuzz: [max-frame byte][chunk byte] then a byte stream of frames.
  std::string frames = Framed(Hello()) + Framed(Open(2, 5000)) + Framed(Acquire(3, 1, "a", 0));
  Write(root / "frame_decoder_fuzz", "requests", std::string("\x10\x07", 2) + frames);
  Write(root / "frame_decoder_fuzz", "oversize",
        std::string("\x00\x03", 2) + std::string("\xff\xff\x00\x00", 4) + "tail");

  // dispatch_fuzz: a conversation, and one with a queued waiter and a stale token.
  const wire::Request stats = WithId(9, request::GetStats());
  const wire::Request list = WithId(10, request::ListLocks({.include_sessions = true}));
  const wire::Request validate = WithId(11, request::Validate("a", 1));
  const wire::Request close = WithId(12, request::Close(1));
  Write(root / "dispatch_fuzz", "conversation",
        Step(0, Hello()) + Step(0, Open(2, 5000)) + Step(1, Acquire(3, 1, "a", 0)) +
            Step(5, KeepAlive(4, 1, "a", 1)) + Step(1, validate) + Step(1, list) + Step(1, stats) +
            Step(1, Release(5, 1, "a", 1)) + Step(1, close));
  Write(root / "dispatch_fuzz", "waiters",
        Step(0, Hello()) + Step(0, Open(2, 3000)) + Step(0, Open(3, 3000)) +
            Step(0, Acquire(4, 1, "q", 0)) + Step(0, Acquire(5, 2, "q", 4000)) +
            Step(200, KeepAlive(6, 2, "q", 1)) + Step(1, Release(7, 1, "q", 1)));
  Write(root / "dispatch_fuzz", "no-hello", Step(0, Open(1, 1000)));
  // ADR 0006: two readers, a writer queued behind them and a reader behind the writer; a holder
  // with a 500 ms lease and a 1 s delay lost to its expiry, an acquire held back by the delay,
  // and the listing of both.
  {
    auto shared = [](uint64_t id, uint64_t session, const std::string& lock, uint64_t wait_ms) {
      return WithId(id, request::Acquire(session, lock, absl::Milliseconds(wait_ms),
                                         absl::Seconds(2), wire::SHARED));
    };
    const wire::Request delayed =
        WithId(9, request::Acquire(3, "d", absl::ZeroDuration(), absl::Milliseconds(500),
                                   wire::EXCLUSIVE, absl::Seconds(1)));
    Write(root / "dispatch_fuzz", "shared-and-delay",
          Step(0, Hello()) + Step(0, Open(2, 60000)) + Step(0, Open(3, 60000)) +
              Step(0, Open(4, 60000)) + Step(0, shared(5, 1, "r", 0)) +
              Step(0, shared(6, 2, "r", 0)) + Step(0, Acquire(7, 3, "r", 4000)) +
              Step(0, shared(8, 1, "s", 0)) + Step(0, delayed) + Step(1, list) +
              Step(30, Acquire(10, 2, "d", 3000)) + Step(1, Release(11, 1, "r", 1)) +
              Step(1, Release(12, 2, "r", 2)) + Step(1, list) + Step(60, stats));
  }
  // Withdrawals: session 2 queues on "q" (request 5) and withdraws it; connection 1 names the
  // same request id for session 2 (not its session) and for a session of its own, which it has
  // no such Acquire for; then a withdrawal of an Acquire already granted.
  auto withdraw = [](uint64_t id, uint64_t session, uint64_t acquire_id) {
    return WithId(id, request::WithdrawAcquire(session, acquire_id));
  };
  Write(root / "dispatch_fuzz", "withdraw",
        Step(0, Hello()) + Step(0, Open(2, 3000)) + Step(0, Open(3, 3000)) +
            Step(0, Acquire(4, 1, "q", 0)) + Step(0, Acquire(5, 2, "q", 4000)) +
            Step(0, Hello(), 1) + Step(0, Open(2, 3000), 1) + Step(1, withdraw(3, 2, 5), 1) +
            Step(1, withdraw(4, 3, 5), 1) + Step(1, withdraw(6, 2, 5)) +
            Step(1, withdraw(7, 2, 5)) + Step(1, Acquire(8, 2, "q", 4000)) +
            Step(1, Release(9, 1, "q", 1)) + Step(1, withdraw(10, 2, 8)));
  // Connection 1 drives connection 0's session: refused until it resumes it with its secret
  // (dispatch_fuzz's first is "fuzz-secret-0001"), after which connection 0 is refused.
  const wire::Request validate_as_holder = WithId(11, request::Validate("a", 1, 1));
  Write(root / "dispatch_fuzz", "resume",
        Step(0, Hello()) + Step(0, Open(2, 5000)) + Step(0, Acquire(3, 1, "a", 0)) +
            Step(0, Hello(), 1) + Step(1, KeepAlive(4, 1, "a", 1), 1) +
            Step(1, Release(5, 1, "a", 1), 1) + Step(1, validate_as_holder, 1) +
            Step(1, Resume(6, 1, "fuzz-secret-0002"), 1) + Step(1, Resume(7, 1, "fuzz-secret-0001"), 1) +
            Step(1, KeepAlive(8, 1, "a", 1), 1) + Step(1, KeepAlive(9, 1, "a", 1)) +
            Step(1, validate_as_holder, 1) + Step(1, Release(10, 1, "a", 1), 1) + Step(1, close));
  // ADR 0014: a Renew confirming one grant of two (the other is left to run out), a Renew
  // naming nothing, one naming a session of another connection and an unknown one, and a
  // KeepAlive that names the lock after it.
  {
    wire::Request confirm = WithId(6, request::Renew({1}));
    auto* ref = confirm.mutable_renew()->mutable_sessions(0)->add_confirm();
    ref->set_lock("a");
    ref->set_token(1);
    Write(root / "dispatch_fuzz", "renew",
          Step(0, Hello()) + Step(0, Open(2, 5000)) + Step(0, Acquire(3, 1, "a", 0)) +
              Step(0, Acquire(4, 1, "b", 0)) + Step(1, confirm) +
              Step(250, WithId(7, request::Renew({1}))) + Step(0, Hello(), 1) +
              Step(1, WithId(2, request::Renew({1, 99})), 1) + Step(250, KeepAlive(8, 1, "a", 1)) +
              Step(1, list));
  }
  // Admission pools: publish, claim, demand, acquire, activate, release, a stranger's owner,
  // recover, drain, stop, status.
  {
    wire::PoolProfile a;
    a.set_id("a");
    a.set_cost(1);
    wire::PoolProfile b;
    b.set_id("b");
    b.set_cost(2);
    b.set_reserved(2);
    b.set_lendable(true);
    const wire::Request publish = WithId(20, request::PoolPublish("p", 1, 4, {a, b}));
    const wire::Request claim = WithId(21, request::PoolClaim("p", "a", 1));
    const wire::PoolOwnerRef owner = request::Owner(1, "fuzz-secret-0001");
    const wire::Request demand = WithId(22, request::PoolSetDemand("p", "a", owner, 3));
    const wire::Request acquire =
        WithId(23, request::PoolAcquire("p", "a", "s1", owner, absl::Milliseconds(500)));
    const wire::Request activate = WithId(24, request::PoolActivate("p", "a", "s1", 1, owner));
    const wire::Request renew = WithId(25, request::PoolRenew("p", "a", "s1", 1, owner));
    const wire::Request release = WithId(26, request::PoolRelease("p", "a", "s1", 1, owner));
    const wire::Request stranger =
        WithId(27, request::PoolRelease("p", "a", "s1", 1, request::Owner(1, "guess")));
    const wire::Request recover = WithId(28, request::PoolRecover("p", "a", "s1", 1, "gone"));
    const wire::Request drain = WithId(29, request::PoolDrain("p", true));
    const wire::Request status = WithId(30, request::PoolStatus("p"));
    const wire::Request stop = WithId(31, request::PoolStop());
    Write(root / "dispatch_fuzz", "pools",
          Step(0, Hello()) + Step(0, publish) + Step(0, claim) + Step(0, demand) +
              Step(0, acquire) + Step(1, renew) + Step(1, activate) + Step(1, stranger) +
              Step(1, status) + Step(1, recover) + Step(1, acquire) + Step(40, status) +
              Step(1, release) + Step(1, drain) + Step(1, stop) + Step(1, status));
  }

  // The first input dispatch_fuzz stopped on (its check, not lockd, was wrong): a lease runs
  // out while a waiter queues, and the next Acquire of another lock first hands the expired
  // lock to the waiter (token 2) and then takes token 3 itself.
  Write(regressions / "dispatch_fuzz", "waiter-granted-before-the-reply-grant",
        Step(0, Hello()) + Step(0, Open(2, 60000)) + Step(0, Open(3, 60000)) +
            Step(0, Acquire(4, 1, "q", 0)) + Step(0, Acquire(5, 2, "q", 60000)) +
            Step(150, Acquire(6, 1, "r", 0)));

  // permissions_fuzz: a file as an operator would write it, and one with an error.
  Write(root / "permissions_fuzz", "file",
        "# payout workers\nuid:1000  acquire payout/ refunds/\nuid:1000 list\n"
        "uid:0 acquire *\nuid:0 operator\nanonymous acquire public/\n* acquire shared/\n");
  Write(root / "permissions_fuzz", "error", "uid:1 acquire a/\nuid:1 aquire b/\n");

  // wal_record_fuzz: even first byte, then [u16 length][LogRecord payload]...
  std::string records(1, '\0');
  for (const Record& r : std::vector<Record>{
           record::SessionOpened{1_session, absl::Seconds(10)},
           record::LockGranted{"a", 1_session, 1_token, absl::Seconds(10)},
           record::LockReleased{"a", 1_token, ReleaseReason::kReleased},
           record::LockGranted{"b", 1_session, 2_token, absl::Seconds(10)},
           record::LockReleased{"b", 2_token, ReleaseReason::kReleased},
           record::SessionEnded{1_session, EndReason::kExpired},
           record::PoolPolicyPublished{
               "p", 1, 4, {{"a", 1, 0, false, true}, {"b", 2, 2, true, false}}, 1},
           record::PoolProfileClaimed{"p", "a", 1, "key", 1},
           record::PoolLeaseGranted{"p", "a", "s1", 3_token, 1, 1, absl::Seconds(5), 2},
           record::PoolLeaseActivated{"p", "a", "s1", 3_token, 3},
           record::PoolLeaseRecovered{"p", "a", "s1", 3_token, "gone", 4},
           record::PoolDrainSet{"p", true},
           record::SessionOpened{2_session, absl::Seconds(10)},
           record::LockGranted{"r", 2_session, 4_token, absl::Seconds(10), LockMode::kShared,
                               absl::Seconds(1)},
           record::LockReleased{"r", 4_token, ReleaseReason::kLeaseExpired}}) {
    const std::string p = RecordPayload(r);
    records += static_cast<char>(p.size() & 0xff);
    records += static_cast<char>(p.size() >> 8);
    records += p;
  }
  Write(root / "wal_record_fuzz", "records", records);
  std::string raw(1, '\x01');
  raw += EncodeRecordFrame(1, record::SessionOpened{1_session, absl::Seconds(10)});
  raw += EncodeRecordFrame(2, record::LockGranted{"a", 1_session, 1_token, absl::Seconds(10)});
  raw += EncodeSealFrame(2);
  Write(root / "wal_record_fuzz", "raw-sealed", raw);

  // snapshot_fuzz: a state with sessions and holders, wrapped and raw.
  StateMachine state;
  state.Apply(record::SessionOpened{1_session, absl::Seconds(10)}, t0);
  state.Apply(record::SessionOpened{2_session, absl::Seconds(5)}, t0);
  state.Apply(record::LockGranted{"a", 1_session, 1_token, absl::Seconds(10)}, t0);
  state.Apply(record::LockGranted{"b", 2_session, 2_token, absl::Seconds(3)}, t0);

  state.Apply(record::PoolPolicyPublished{"p", 1, 4, {{"a", 1, 0, false, true}}, 1}, t0);
  state.Apply(record::PoolProfileClaimed{"p", "a", 1, "key", 1}, t0);
  state.Apply(record::PoolLeaseGranted{"p", "a", "s1", 3_token, 1, 1, absl::Seconds(5), 2}, t0);
  state.Apply(record::PoolLeaseActivated{"p", "a", "s1", 3_token, 3}, t0);
  state.Apply(record::PoolLeaseGranted{"p", "a", "s2", 4_token, 1, 1, absl::Seconds(5), 4}, t0);
  state.Apply(record::LockGranted{"r", 1_session, 5_token, absl::Seconds(3), LockMode::kShared},
              t0);
  state.Apply(record::LockGranted{"r", 2_session, 6_token, absl::Seconds(3), LockMode::kShared,
                                  absl::Seconds(2)},
              t0);
  state.Apply(record::LockReleased{"r", 6_token, ReleaseReason::kLeaseExpired}, t0);
  const std::string snapshot = EncodeSnapshot(state, 0);
  Write(root / "snapshot_fuzz", "payload", std::string(1, '\0') + snapshot.substr(24));
  Write(root / "snapshot_fuzz", "raw", std::string(1, '\x01') + snapshot);
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
