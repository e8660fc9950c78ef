// ADR-006 D4, FR-13, the configuration refusals and the margin-revisit trigger (6.5), on a
// simulated client clock against a real lockd, with a fault proxy to stall replies.
#include <thread>

#include "harness/fault_proxy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"

namespace fencelock {
namespace {

using ::testing::HasSubstr;
using Dir = harness::FaultProxy::Direction;
using Mode = harness::FaultProxy::Mode;

double Abandoned(Client& client, const std::string& step, const std::string& reason) {
  return client.metrics()
      ->GetCounter("lock_steps_abandoned_total", "", {{"step", step}, {"reason", reason}})
      .value();
}

class ClientSafetyTest : public ::testing::Test {
 protected:
  ClientSafetyTest() : proxy_(lockd_.port()) {}

  // Once an answer is held at the proxy, moves the client's clock by `d`: timeouts run on the
  // client's clock, like every other time the client counts.
  std::thread AdvanceWhenHeld(absl::Duration d) {
    return std::thread([this, d] {
      while (proxy_.bytes_held(Dir::kToClient) == 0) absl::SleepFor(absl::Milliseconds(1));
      clock_.Advance(d);
    });
  }
  ClientOptions Options() {
    ClientOptions options;
    options.server = "127.0.0.1:" + std::to_string(proxy_.port());
    options.clock = &clock_;
    options.session_ttl = absl::Seconds(60);
    options.default_lock_ttl = absl::Seconds(30);  // usable: 21 s
    options.heartbeat_interval = absl::Hours(1);   // the test drives every heartbeat
    options.log = [this](LogLevel level, const std::string& m) {
      if (m.find("heartbeat RTT p99") != std::string::npos) {
        EXPECT_EQ(level, LogLevel::kWarning);
        warnings_.push_back(m);
      }
    };
    return options;
  }
  std::unique_ptr<Client> NewClient(ClientOptions options) {
    auto client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  testing::LockdProcess lockd_;
  harness::FaultProxy proxy_;
  SimulatedClock clock_;
  std::vector<std::string> warnings_;
};

TEST_F(ClientSafetyTest, D4RefusesAStepTheLeaseCannotCoverAndCountsIt) {
  auto client = NewClient(Options());
  const MonoTime t0 = clock_.Now();
  auto lock = client->acquire("payout-1", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  const StepCost submit = StepCost::RailSubmit(absl::Seconds(3));  // 5 s worst case
  EXPECT_EQ(submit.worst_case, absl::Seconds(5));

  clock_.Set(t0 + absl::Seconds(16) - absl::Nanoseconds(1));  // 5 s + 1 ns left: allowed
  EXPECT_NO_THROW(client->beginIrreversibleStep(*lock, submit));
  EXPECT_EQ(Abandoned(*client, "rail_submit", "insufficient_lease"), 0);

  clock_.Set(t0 + absl::Seconds(16));  // exactly 5 s left: not strictly larger, refused
  try {
    client->beginIrreversibleStep(*lock, submit);
    FAIL() << "the step was allowed with exactly its cost left";
  } catch (const StepRefusedException& e) {
    EXPECT_EQ(e.reason(), LossReason::kInsufficientLease);
    EXPECT_EQ(e.remaining(), absl::Seconds(5));
    EXPECT_EQ(e.cost(), absl::Seconds(5));
    EXPECT_THAT(e.what(), HasSubstr("step \"rail_submit\" refused before it started"));
  }
  EXPECT_EQ(Abandoned(*client, "rail_submit", "insufficient_lease"), 1);
  // The refusal is a LockLostException too: one handler abandons the critical section.
  EXPECT_THROW(client->beginIrreversibleStep(*lock, StepCost::Hop("store", absl::Seconds(9))),
               LockLostException);
  EXPECT_EQ(Abandoned(*client, "store", "insufficient_lease"), 1);
  // The lock itself is still held: a short step is fine.
  EXPECT_NO_THROW(client->beginIrreversibleStep(*lock, StepCost::Hop("store", absl::Seconds(1))));

  clock_.Set(t0 + absl::Seconds(21));  // the deadline: lost, and a step is refused as such
  EXPECT_THROW(client->beginIrreversibleStep(*lock, submit), LockLostException);
  EXPECT_EQ(Abandoned(*client, "rail_submit", "deadline_passed"), 1);
}

TEST_F(ClientSafetyTest, Fr13ConfirmationCostsOneHopThatCountsAgainstTheLease) {
  auto client = NewClient(Options());
  const MonoTime t0 = clock_.Now();
  auto lock = client->acquire("payout-2", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_NO_THROW(client->checkStillHeld(*lock, Confirm::kWithServer));

  // A Validate hop that takes 3 s (its reply is held while the clock moves): the lease left
  // afterwards is 3 s shorter, and D4 sees it.
  clock_.Set(t0 + absl::Seconds(10));
  proxy_.Set(Dir::kToClient, Mode::kHold);
  std::thread confirm([&] { EXPECT_NO_THROW(client->checkStillHeld(*lock, Confirm::kWithServer)); });
  while (proxy_.bytes_held(Dir::kToClient) == 0) absl::SleepFor(absl::Milliseconds(1));
  clock_.Advance(absl::Seconds(3));
  proxy_.Release(Dir::kToClient);
  confirm.join();
  EXPECT_EQ(client->remaining(*lock), absl::Seconds(8));
  EXPECT_THROW(client->beginIrreversibleStep(*lock, StepCost::Hop("submit", absl::Seconds(8))),
               StepRefusedException);

  // A hop that outlasts the lease ends in LockLostException although lockd answered OK.
  proxy_.Set(Dir::kToClient, Mode::kHold);
  LossReason reason = LossReason::kNone;
  std::thread late([&] {
    try {
      client->checkStillHeld(*lock, Confirm::kWithServer);
    } catch (const LockLostException& e) {
      reason = e.reason();
    }
  });
  while (proxy_.bytes_held(Dir::kToClient) == 0) absl::SleepFor(absl::Milliseconds(1));
  clock_.Advance(absl::Seconds(9));
  proxy_.Release(Dir::kToClient);
  late.join();
  EXPECT_EQ(reason, LossReason::kDeadlinePassed);
}

TEST_F(ClientSafetyTest, Fr13ConfirmationCatchesAFencedOutToken) {
  ClientOptions options = Options();
  options.confirm_with_server = true;  // checkStillHeld(handle) confirms every time
  auto client = NewClient(options);
  auto lock = client->acquire("payout-3", absl::Seconds(5), absl::Milliseconds(300));
  ASSERT_TRUE(lock.ok()) << lock.status();
  ClientOptions direct;
  direct.server = lockd_.tcp_address();
  auto other = Client::Create(direct);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->acquire("payout-3", absl::Seconds(10)).ok());  // after the 300 ms lease
  // The simulated clock stood still, so a local check would pass; the server says no.
  try {
    client->checkStillHeld(*lock);
    FAIL() << "a fenced-out token was confirmed";
  } catch (const LockLostException& e) {
    EXPECT_EQ(e.reason(), LossReason::kFencedOut);
  }
  EXPECT_EQ(client->metrics()->GetCounter("lock_client_fenced_out_total", "").value(), 1);
  // The client's count has its own name: lockd's lock_fenced_out_total is fence 1's.
  const std::string exposed = client->metrics()->TextExposition();
  EXPECT_THAT(exposed, ::testing::HasSubstr("\nlock_client_fenced_out_total 1"));
  EXPECT_THAT(exposed, ::testing::Not(::testing::HasSubstr("\nlock_fenced_out_total ")));
  EXPECT_EQ(client->metrics()
                ->GetCounter("lock_lease_lost_total", "", {{"reason", "fenced_out"}})
                .value(),
            1);
}

TEST_F(ClientSafetyTest, Fr13UnreachableServerIsNotAConfirmation) {
  ClientOptions options = Options();
  // Long enough for the durable OpenSession and Acquire on a loaded machine; the confirmation
  // below waits it out.
  options.request_timeout = absl::Seconds(2);
  auto client = NewClient(options);
  auto lock = client->acquire("payout-4", absl::Seconds(5));
  ASSERT_TRUE(lock.ok());
  proxy_.Set(Dir::kToClient, Mode::kHold);
  std::thread timeout = AdvanceWhenHeld(options.request_timeout);
  try {
    client->checkStillHeld(*lock, Confirm::kWithServer);
    ADD_FAILURE() << "confirmed without an answer";
  } catch (const LockLostException& e) {
    EXPECT_EQ(e.reason(), LossReason::kUnconfirmed);
  }
  timeout.join();
  proxy_.Release(Dir::kToClient);
  EXPECT_NO_THROW(client->checkStillHeld(*lock));  // not lost: only unconfirmed
}

TEST_F(ClientSafetyTest, ConfigurationsThatCannotMakeProgressAreRefused) {
  ClientOptions margin = Options();
  margin.safety_margin = 0;
  EXPECT_THAT(Client::Create(margin).status().message(), HasSubstr("must be in (0, 1), got 0"));
  margin.safety_margin = 1.5;
  EXPECT_THAT(Client::Create(margin).status().message(), HasSubstr("got 1.5"));

  ClientOptions slow_step = Options();  // usable: min(60 s, 30 s) x 0.7 = 21 s
  slow_step.steps = {StepCost::Hop("store", absl::Seconds(2)), StepCost::RailSubmit(absl::Seconds(19))};
  auto refused = Client::Create(slow_step);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("no \"rail_submit\" step could ever start: the usable lease min("
                        "lock.session.ttl 1m, lock.default.ttl 30s) x (1 - "
                        "lock.client.safety-margin 0.3) = 21s is not larger than its worst-case "
                        "cost 21s"));

  ClientOptions big_margin = Options();
  big_margin.safety_margin = 0.9;  // usable 3 s
  big_margin.steps = {StepCost::RailSubmit(absl::Seconds(1))};  // 3 s: not larger
  EXPECT_EQ(Client::Create(big_margin).status().code(), absl::StatusCode::kInvalidArgument);

  ClientOptions short_session = Options();
  short_session.session_ttl = absl::Seconds(5);  // usable 3.5 s, bounded by the session
  short_session.steps = {StepCost::Hop("store", absl::Seconds(4))};
  EXPECT_THAT(Client::Create(short_session).status().message(), HasSubstr("= 3.5s"));

  ClientOptions fine = Options();
  fine.steps = {StepCost::RailSubmit(absl::Seconds(18))};  // 20 s < 21 s
  EXPECT_TRUE(Client::Create(fine).ok());
}

TEST_F(ClientSafetyTest, SlowHeartbeatsRaiseTheRevisitGaugeAndWarnOnce) {
  ClientOptions options = Options();
  options.session_ttl = absl::Seconds(15);  // lease 15 s x margin 0.3 / 3 = 1.5 s threshold
  auto client = NewClient(options);
  auto revisit = [&] { return client->metrics()->GetGauge("lock_margin_revisit", "").value(); };
  ASSERT_TRUE(client->renewNow().ok());  // fast: simulated time does not move
  EXPECT_EQ(revisit(), 0);
  EXPECT_TRUE(warnings_.empty());
  for (int i = 0; i < 3; ++i) {
    proxy_.Set(Dir::kToClient, Mode::kHold);
    absl::Status renewed;
    std::thread heartbeat([&] { renewed = client->renewNow(); });
    while (proxy_.bytes_held(Dir::kToClient) == 0) absl::SleepFor(absl::Milliseconds(1));
    clock_.Advance(absl::Seconds(2));  // a 2 s round trip
    proxy_.Release(Dir::kToClient);
    heartbeat.join();
    ASSERT_TRUE(renewed.ok()) << renewed;
  }
  EXPECT_EQ(client->heartbeatRttP99(), absl::Seconds(2));
  EXPECT_EQ(revisit(), 1);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_THAT(warnings_[0], HasSubstr("heartbeat RTT p99 2s exceeds a third of lease x margin (1.5s)"));
}

// A heartbeat that times out took at least its timeout: it counts in the RTT figures as that
// much, so that the slow tail the margin's revisit trigger watches is not hidden by failures.
TEST_F(ClientSafetyTest, ATimedOutHeartbeatCountsAsAnRttOfItsTimeout) {
  ClientOptions options = Options();
  options.request_timeout = absl::Milliseconds(300);
  auto client = NewClient(options);
  ASSERT_TRUE(client->renewNow().ok());
  EXPECT_EQ(client->heartbeatRttP99(), absl::ZeroDuration());  // simulated time stood still
  proxy_.Set(Dir::kToClient, Mode::kHold);
  std::thread timeout = AdvanceWhenHeld(absl::Milliseconds(300));
  EXPECT_EQ(client->renewNow().code(), absl::StatusCode::kDeadlineExceeded);
  timeout.join();
  EXPECT_EQ(client->heartbeatRttP99(), absl::Milliseconds(300));
  EXPECT_EQ(client->metrics()->GetCounter("lock_heartbeat_failures_total", "").value(), 1);
}

}  // namespace
}  // namespace fencelock
