// lockd's request dispatch (lock-server/src/dispatch.h) against a fresh in-memory lock service:
// the input is a stream of frames, as one connection would send them, with the service's clock
// moving between them. Whatever arrives, every request gets an answer (or is queued), the
// connection is closed only on a protocol error, and grants carry strictly increasing tokens.
#include <cstdio>
#include <cstdlib>


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
  void CountProtocolError() override {}
  void FillStats(wire::StatsReply* stats) const override {
    stats->set_sessions(service_->state().session_count());
    stats->set_last_token(service_->state().last_token());
  }
  size_t max_sessions_per_connection() const override { return 4; }
  size_t max_frame_bytes() const override { return 4096; }

 private:
  LockService* service_;
  WaiterId waiters_ = 0;
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
  ConnectionState conn;
  protocol::FrameDecoder decoder(4096);
  MonoTime now = MonoTime::FromNanos(1'000'000'000'000);
  FenceToken last_token = 0;
  auto granted = [&](FenceToken token) {
    if (token <= last_token) {  // tokens only ever increase
      Fail("token " + std::to_string(token) + " granted after " + std::to_string(last_token));
    }
    last_token = token;
  };
  std::string payload;
  while (!in.empty()) {
    now = now + absl::Milliseconds(in.Byte() * 20);
    decoder.Feed(in.Bytes(in.U16() % 512));
    for (;;) {
      const auto r = decoder.Next(&payload);
      if (r != protocol::FrameDecoder::Result::kFrame) {
        if (r == protocol::FrameDecoder::Result::kTooLarge) return 0;  // the server closes
        break;
      }
      Dispatched d = Dispatch(payload, conn, host, now);
      if (d.then != Dispatched::Then::kQueued && d.response.code() == wire::CODE_UNSPECIFIED) {
        Fail("answer without a code to: " + d.response.DebugString());
      }
      // Waiters granted while the request was applied (its expiries come first) got their
      // tokens before a grant in the reply itself.
      for (const WaiterOutcome& o : service.TakeWaiterOutcomes()) {
        if (o.status.ok()) granted(o.token);
      }
      if (d.response.has_acquire() && d.response.acquire().granted()) {
        granted(d.response.acquire().token());
      }
      if (d.then == Dispatched::Then::kReplyAndClose) return 0;
    }
    service.Advance(now);
    for (const WaiterOutcome& o : service.TakeWaiterOutcomes()) {
      if (o.status.ok()) granted(o.token);
    }
  }
  return 0;
}
