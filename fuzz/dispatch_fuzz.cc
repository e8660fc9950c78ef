// lockd's request dispatch (lock-server/rules/include/lock-server/dispatch.h) against a fresh in-memory lock service:
// the input is a stream of frames, as two connections would send them, with the service's
// clock moving between them. Each step's first byte moves the clock (its upper seven bits, in
// 20 ms units) and picks the connection (its low bit). Whatever arrives, every request gets an
// answer (or is queued), a connection is closed only on a protocol error, grants carry
// strictly increasing tokens, and a request refused PERMISSION_DENIED (a session that is not
// its connection's, a wrong secret on ResumeSession) changes nothing. Session secrets are
// "fuzz-secret-0001", "-0002", ... so that inputs can resume the other connection's session.
#include <cstdio>
#include <cstdlib>
#include <string>


#include "lock-server/dispatch.h"
#include "fuzz_support.h"
#include "lock-server/lock_service.h"
#include "protocol/frame.h"

namespace {

using namespace fencelock;
using namespace fencelock::server;

class Host : public DispatchHost {
 public:
  explicit Host(LockService* service) : service_(service) {}
  LockService& service() override { return *service_; }
  const absl::Status* fault() const override { return nullptr; }
  WaiterId NextWaiterId() override { return ++waiters_; }
  std::string NewSessionSecret() override {
    std::string number = std::to_string(++secrets_ % 10000);
    return "fuzz-secret-" + std::string(4 - number.size(), '0') + number;
  }
  void CountProtocolError() override {}
  void FillStats(wire::StatsReply* stats) const override {
    stats->set_sessions(service_->state().session_count());
    stats->set_last_token(service_->state().last_token().value());
  }
  size_t max_sessions_per_connection() const override { return 4; }
  const Permissions& permissions() const override { return permissions_; }
  size_t max_frame_bytes() const override { return 4096; }

 private:
  LockService* service_;
  WaiterId waiters_ = 0;
  int secrets_ = 0;
  Permissions permissions_ = Permissions::WithoutFile("uid:1");
};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "dispatch_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  LockService service(ServiceOptions{.min_ttl = absl::Milliseconds(1),
                                     .max_ttl = absl::Seconds(60),
                                     .max_wait = absl::Seconds(60),
                                     .max_lock_name_bytes = 64,
                                     .max_locks_per_session = 8,
                                     .max_waiters_per_lock = 4});
  Host host(&service);
  struct Connection {
    ConnectionState state;
    protocol::FrameDecoder decoder{4096};
    bool closed = false;
  };
  Connection conns[2];
  // One peer on the Unix socket, which owns the state (the operator of pools, ADR 0004), and
  // one on plaintext TCP, to which pools are closed.
  conns[0].state.caller = Caller{1, "uid:1"};
  conns[1].state.caller = Caller{2, ""};
  MonoTime now = MonoTime::FromNanos(1'000'000'000'000);
  FenceToken last_token;
  auto granted = [&](FenceToken token) {
    if (token <= last_token) {  // tokens only ever increase
      Fail("token " + std::to_string(token.value()) + " granted after " +
           std::to_string(last_token.value()));
    }
    last_token = token;
  };
  std::string payload;
  while (!in.empty() && !(conns[0].closed && conns[1].closed)) {
    const uint8_t step = in.Byte();
    now = now + absl::Milliseconds((step >> 1) * 20);
    Connection& c = conns[step & 1];
    const std::string_view bytes = in.Bytes(in.U16() % 512);
    if (c.closed) continue;
    c.decoder.Feed(bytes);
    for (;;) {
      const auto r = c.decoder.Next(&payload);
      if (r != protocol::FrameDecoder::Result::kFrame) {
        if (r == protocol::FrameDecoder::Result::kTooLarge) c.closed = true;  // the server closes
        break;
      }
      // What a refused request must leave as it was (expiries due by now happen first anyway).
      service.Advance(now);
      for (const WaiterOutcome& o : service.TakeWaiterOutcomes()) {
        if (o.status.ok()) granted(o.token);
      }
      const std::string before = service.state().DebugString();
      const FenceToken tokens_before = service.state().last_token();
      Dispatched d = Dispatch(payload, c.state, host, now);
      if (d.then != Dispatched::Then::kQueued && d.response.code() == wire::CODE_UNSPECIFIED) {
        Fail("answer without a code to: " + d.response.DebugString());
      }
      if (d.response.code() == wire::PERMISSION_DENIED &&
          (service.state().DebugString() != before ||
           service.state().last_token() != tokens_before)) {
        Fail("a refused request changed the state: " + before + " -> " +
             service.state().DebugString());
      }
      // Waiters granted while the request was applied (its expiries come first) got their
      // tokens before a grant in the reply itself.
      for (const WaiterOutcome& o : service.TakeWaiterOutcomes()) {
        if (o.status.ok()) granted(o.token);
      }
      if (d.response.has_acquire() && d.response.acquire().granted()) {
        granted(FenceToken(d.response.acquire().token()));
      }
      if (d.then == Dispatched::Then::kReplyAndClose) {
        c.closed = true;
        break;
      }
    }
    service.Advance(now);
    for (const WaiterOutcome& o : service.TakeWaiterOutcomes()) {
      if (o.status.ok()) granted(o.token);
    }
  }
  return 0;
}
