// The payout worker: for each unpaid payout it takes the payout's lock from lockd, claims the
// payout in the store under the lock's fencing token, and pays it through the rail, abandoning
// the moment its lease may no longer cover what it is about to do (docs/payout-flow.md).
//
// Every event is one line on standard output, "<name> <event> payout/<id> token <t> ...", for
// the demo's log. With --history it also appends timed records (process/history.h) for the
// harness's history checker. Both are made by the wrappers in worker_recording.h, so that Pay()
// reads as the payment flow alone.
#include "absl/strings/str_format.h"
#include "logging/logging.h"
#include "worker.h"

#include <signal.h>

#include <atomic>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "lock-client/client.h"
#include "metrics_flags.h"
#include "metrics/metrics.h"
#include "payout-demo/rail.h"
#include "payout-demo/store.h"
#include "process/flags.h"
#include "process/history.h"
#include "worker_recording.h"
#include "process/process.h"
#include "protocol/defaults.h"

ABSL_FLAG(std::string, name, "", "this worker's name, as recorded on its claims; required");
ABSL_FLAG(std::string, lockd, "127.0.0.1:7420", "lockd: host:port or unix:/path");
ABSL_FLAG(std::string, tls_ca, "", "TLS to lockd: the CA certificate lockd's chains to (PEM)");
ABSL_FLAG(std::string, tls_cert, "", "TLS to lockd: this worker's certificate (PEM)");
ABSL_FLAG(std::string, tls_key, "", "TLS to lockd: the private key of --tls-cert (PEM)");
ABSL_FLAG(std::string, tls_server_name, "",
          "TLS to lockd: the name its certificate must carry; default: the host of --lockd");
ABSL_FLAG(std::string, rail, "", "the rail: host:port; required");
ABSL_FLAG(std::string, store, "", "the payout store (SQLite file); required");
ABSL_FLAG(absl::Duration, session_ttl, fencelock::defaults::kSessionTtl, "lock.session.ttl");
ABSL_FLAG(absl::Duration, lock_ttl, fencelock::defaults::kLockTtl,
          "the TTL of each payout's lock (lock.default.ttl)");
ABSL_FLAG(double, margin, fencelock::defaults::kSafetyMargin,
          "lock.client.safety-margin, in (0, 1)");
ABSL_FLAG(absl::Duration, poll, absl::Milliseconds(20),
          "pause when every unpaid payout is locked by another worker");
ABSL_FLAG(bool, wait_for_work, false,
          "when no payout is left unpaid, poll the store (every --poll) for new ones instead of "
          "exiting; the worker then runs until a stop signal");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(30),
          "keep trying to reach lockd at startup for this long before giving up");
ABSL_FLAG(std::string, history, "", "append timed event records to this file (harness)");

namespace fencelock::payout {
namespace {

std::atomic<bool> g_stop{false};

class Worker {
 public:
  Worker(std::string name, std::unique_ptr<Client> client, std::unique_ptr<RailClient> rail,
         std::unique_ptr<PayoutStore> store, std::unique_ptr<history::Writer> history,
         FaultPoints* faults)
      : rec_(std::move(name), std::move(history)),
        faults_(faults),
        client_(std::move(client)),
        checks_(client_.get(), &rec_, faults != nullptr && faults->client_checks_off()),
        rail_(std::move(rail), &rec_),
        store_(std::move(store), &rec_),
        submit_cost_(StepCost::RailSubmit(rail_.read_timeout())),
        backlog_(client_->metrics()->GetGauge(
            "payout_backlog_age_seconds", "how long the oldest unpaid payout has waited")),
        paid_(client_->metrics()->GetCounter("payouts_paid_total",
                                             "payouts this worker saw paid (by it or found paid)")) {}

  // Works until no payout is left unpaid (0; with --wait-for-work it waits for more instead) or
  // a stop signal arrives (1 if work was left).
  int Run() {
    PayoutStore& store = store_.store();
    size_t offset = std::hash<std::string>()(rec_.name());
    while (!g_stop.load()) {
      auto unpaid = store.Unpaid(1000);
      if (!unpaid.ok()) {
        rec_.Log(absl::StrCat("store error: ", unpaid.status().ToString()));
        absl::SleepFor(absl::Milliseconds(100));
        continue;
      }
      if (auto age = store.OldestUnpaidAge(); age.ok()) {
        backlog_.Set(absl::ToDoubleSeconds(*age));
      }
      if (unpaid->empty()) {
        if (!absl::GetFlag(FLAGS_wait_for_work)) return 0;
        absl::SleepFor(absl::GetFlag(FLAGS_poll));
        continue;
      }
      bool worked = false;
      // Workers start at different places in the list so that they rarely race for a lock.
      for (size_t i = 0; i < unpaid->size() && !g_stop.load(); ++i) {
        const int64_t id = (*unpaid)[(offset + i) % unpaid->size()];
        // The list ages as the other workers pay: a payout they paid meanwhile is skipped on a
        // read, which takes no write lock, instead of being locked and claimed only to find it
        // paid. The read decides nothing: the claim under the lock checks again.
        if (auto now = store.Get(id); now.ok() && now->state == PayoutState::kPaid) continue;
        const int64_t sent = history::NowNanos();
        auto lock = client_->tryAcquire(PayoutKey(id), absl::GetFlag(FLAGS_lock_ttl));
        if (!lock.ok()) {
          rec_.Log(absl::StrCat("lockd error: ", lock.status().ToString()));
          absl::SleepFor(absl::Milliseconds(100));
          break;
        }
        if (!lock->has_value()) continue;  // another worker holds it
        rec_.Record(sent, "acquire", id, (*lock)->token());
        Process(id, **lock);
        worked = true;
      }
      ++offset;
      if (!worked) absl::SleepFor(absl::GetFlag(FLAGS_poll));
    }
    return 1;
  }

 private:
  // Pays payout `id` under `lock`, or abandons it, then releases the lock.
  void Process(int64_t id, const LockHandle& lock) {
    const uint64_t token = lock.token();
    rec_.Event("acquired", id, token);
    bool claimed = false;
    std::string abandon;  // the reason, when the payout is given up
    try {
      abandon = Pay(id, lock, &claimed);
    } catch (const LockLostException& e) {
      abandon = LossReasonName(e.reason());
      rec_.Record(history::NowNanos(), "lost", id, token, abandon);
    }
    if (!abandon.empty()) {
      rec_.Step(history::NowNanos(), "abandoned", id, token, abandon);
      absl::Status s = claimed ? store_.store().Abandon(id, token, rec_.name(), abandon)
                               : store_.store().RecordAbandon(id, token, rec_.name(), abandon);
      if (!s.ok()) rec_.Event("abandon-refused", id, token, std::string(s.message()));
      client_->metrics()
          ->GetCounter("payouts_abandoned_total", "payouts given up, by reason",
                       {{"reason", abandon}})
          .Increment();
    }
    const int64_t release_sent = history::NowNanos();
    absl::Status released = client_->release(lock);
    rec_.Step(release_sent, "released", id, token,
              released.ok() ? "" : std::string(released.message()));
  }

  // The payment flow: returns "" when the payout ended PAID, else why it was abandoned. Every
  // store transition and rail request carries the lock's token; the fences in the store and
  // the rail refuse a stale one. (Each step records itself: worker_recording.h.)
  std::string Pay(int64_t id, const LockHandle& lock, bool* claimed) {
    const uint64_t token = lock.token();
    auto before = store_.Claim(id, token);
    if (!before.ok()) return StoreFailure(before.status());
    *claimed = true;
    if (before->state == PayoutState::kPaid) {
      paid_.Increment();
      return "";
    }
    if (faults_ != nullptr) faults_->AfterClaim(id, FaultRecord(id, token));
    checks_.CheckStillHeld(lock);
    if (before->state == PayoutState::kSubmitted) {
      // An earlier holder may have reached the rail: ask before paying. The question is fenced
      // too, so that holder's submit, should it still arrive, is now refused.
      auto status = rail_.Status(id, token);
      if (!status.ok()) return "rail_unavailable";
      if (status->kind == RailReply::Kind::kFenced) return "rail_fenced_out";
      if (status->kind == RailReply::Kind::kPaid) return MarkPaid(id, token, status->txn);
      if (status->kind != RailReply::Kind::kUnpaid) return "rail_error";
    } else if (absl::Status s = store_.MarkSubmitted(id, token); !s.ok()) {
      return StoreFailure(s);
    }
    if (faults_ != nullptr) faults_->BeforeSubmit(id, FaultRecord(id, token));
    // D4: the submit cannot be undone, so it starts only if the lease covers its worst case.
    checks_.BeginIrreversibleStep(id, lock, submit_cost_);
    auto reply = rail_.Submit(id, token, before->amount_cents);
    if (!reply.ok()) return "rail_unavailable";  // stays SUBMITTED: the next holder asks first
    switch (reply->kind) {
      case RailReply::Kind::kPaid:
      case RailReply::Kind::kDuplicate:
        return MarkPaid(id, token, reply->txn);
      case RailReply::Kind::kFenced:
        return "rail_fenced_out";
      default:
        return "rail_error";
    }
  }

  std::string MarkPaid(int64_t id, uint64_t token, int64_t txn) {
    // Refused, the rail still has the payment; a later holder will find it there and record it.
    if (absl::Status s = store_.MarkPaid(id, token, txn); !s.ok()) return StoreFailure(s);
    paid_.Increment();
    return "";
  }

  static std::string StoreFailure(const absl::Status& s) {
    return s.code() == absl::StatusCode::kAborted ? "store_fenced_out" : "store_error";
  }

  // What a fault point records: the event on the log and in the history.
  FaultPoints::Record FaultRecord(int64_t id, uint64_t token) {
    return [this, id, token](const char* event, const std::string& detail) {
      rec_.Record(history::NowNanos(), event, id, token, detail);
      rec_.Event(event, id, token, detail);
    };
  }

  Recorder rec_;
  FaultPoints* const faults_;  // nullptr in the worker users run
  const std::unique_ptr<Client> client_;
  RecordedChecks checks_;
  RecordedRail rail_;
  RecordedStore store_;
  const StepCost submit_cost_;
  metrics::Gauge& backlog_;
  metrics::Counter& paid_;
};

// Client::Create, tried again while lockd cannot be reached (it is restarting, or the network
// between is cut) for up to --connect-timeout, with a backoff from 100 ms to 1 s. A refusal
// for any other reason (bad options, a session lockd will not open) is returned at once.
absl::StatusOr<std::unique_ptr<Client>> ConnectToLockd(const std::string& name,
                                                       const ClientOptions& options) {
  const absl::Time give_up = absl::Now() + absl::GetFlag(FLAGS_connect_timeout);
  absl::Duration backoff = absl::Milliseconds(100);
  for (int attempt = 1;; ++attempt) {
    auto client = Client::Create(options);
    const absl::StatusCode code = client.status().code();
    if (client.ok() ||
        (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded)) {
      return client;
    }
    if (g_stop.load() || absl::Now() + backoff > give_up) {
      return absl::Status(
          code, absl::StrCat(client.status().message(), " (gave up after ", attempt,
                             attempt == 1 ? " attempt" : " attempts", ", --connect-timeout=",
                             absl::FormatDuration(absl::GetFlag(FLAGS_connect_timeout)), ")"));
    }
    std::printf("%s cannot reach lockd yet (attempt %d): %s; again in %s\n", name.c_str(), attempt,
                std::string(client.status().message()).c_str(), absl::FormatDuration(backoff).c_str());
    std::fflush(stdout);
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

int Main(FaultPoints* faults) {
  const std::string name = absl::GetFlag(FLAGS_name);
  for (const auto& [flag, value] : {std::pair{"--name", name},
                                    std::pair{"--rail", absl::GetFlag(FLAGS_rail)},
                                    std::pair{"--store", absl::GetFlag(FLAGS_store)}}) {
    if (value.empty()) {
      logging::Program().Error(absl::StrFormat("%s is required", flag));
      return 2;
    }
  }
  auto history = history::Writer::Open(absl::GetFlag(FLAGS_history), name);
  if (!history.ok()) {
    logging::Program().Error(history.status().ToString());
    return 1;
  }
  auto rail = RailClient::Connect(absl::GetFlag(FLAGS_rail), absl::Seconds(5));
  if (!rail.ok()) {
    logging::Program().Error(absl::StrFormat("rail: %s", rail.status().ToString().c_str()));
    return 1;
  }
  auto store = PayoutStore::Open(absl::GetFlag(FLAGS_store));
  if (!store.ok()) {
    logging::Program().Error(absl::StrFormat("store: %s", store.status().ToString().c_str()));
    return 1;
  }
  ClientOptions options;
  options.server = absl::GetFlag(FLAGS_lockd);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  options.session_ttl = absl::GetFlag(FLAGS_session_ttl);
  options.default_lock_ttl = absl::GetFlag(FLAGS_lock_ttl);
  options.safety_margin = absl::GetFlag(FLAGS_margin);
  options.client_name = "payout-worker " + name;
  // Create() refuses a lease too short for even one submit (D4 would refuse every payout).
  options.steps = {StepCost::RailSubmit((*rail)->read_timeout())};
  auto client = ConnectToLockd(name, options);
  if (!client.ok()) {
    logging::Program().Error(client.status().ToString());
    return client.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  auto exposer = ServeMetricsFromFlags("127.0.0.1", (*client)->metrics());
  if (!exposer.ok()) {
    logging::Program().Error(exposer.status().ToString());
    return 1;
  }
  std::printf("%s started session %lu, rail read timeout %s, submit needs %s of lease\n", name.c_str(),
              static_cast<unsigned long>((*client)->sessionId()),
              absl::FormatDuration((*rail)->read_timeout()).c_str(),
              absl::FormatDuration(StepCost::RailSubmit((*rail)->read_timeout()).worst_case).c_str());
  std::fflush(stdout);
  Worker worker(name, std::move(*client), std::move(*rail), std::move(*store), std::move(*history),
                faults);
  const int code = worker.Run();
  std::printf("%s %s\n", name.c_str(), code == 0 ? "done: no payout left unpaid" : "stopped");
  return code;
}

}  // namespace

int WorkerMain(int argc, char** argv, std::unique_ptr<FaultPoints> (*make_faults)()) {
  signal(SIGPIPE, SIG_IGN);
  struct sigaction stop = {};
  stop.sa_handler = [](int) { g_stop.store(true); };
  sigaction(SIGINT, &stop, nullptr);
  sigaction(SIGTERM, &stop, nullptr);
  absl::SetProgramUsageMessage(
      "pays the payout store's unpaid payouts under locks from lockd\n"
      "  payout-worker --name=w1 --rail=host:port --store=payouts.db [--lockd=host:port]");
  process::ParseFlags(argc, argv);
  const std::string name = absl::GetFlag(FLAGS_name);
  logging::InitProgram(name.empty() ? "payout-worker" : absl::StrCat("payout-worker ", name));
  std::unique_ptr<FaultPoints> faults = make_faults != nullptr ? make_faults() : nullptr;
  return Main(faults.get());
}

}  // namespace fencelock::payout
