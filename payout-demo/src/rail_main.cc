// payout-rail: the payment rail simulator. A separate process that serves the rail protocol
// (payout-demo/rail.h) on loopback TCP, one request at a time per connection, with a durable
// ledger and its own per-payout fence. Every submit waits --latency (plus up to --jitter) before
// it is applied, as a remote rail would; --read-timeout is what clients are told to wait at most.
//
//   payout-rail --db=rail.db --port=0 --port-file=rail.port --latency=20ms --read-timeout=500ms
#include <signal.h>

#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logging/logging.h"
#include "metrics_flags.h"
#include "metrics/metrics.h"
#include "net/asio.h"
#include "payout-demo/rail.h"
#include "process/flags.h"
#include "process/history.h"
#include "process/process.h"

ABSL_FLAG(std::string, db, "", "the rail's ledger (SQLite file, created if missing); required");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int, port, 0, "TCP port; 0 picks a free one");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file");
ABSL_FLAG(absl::Duration, latency, absl::Milliseconds(20), "time each SUBMIT/STATUS takes");
ABSL_FLAG(absl::Duration, jitter, absl::ZeroDuration(), "extra latency, uniform in [0, jitter]");
ABSL_FLAG(absl::Duration, read_timeout, absl::Milliseconds(500),
          "how long clients wait for an answer at most (announced in HELLO)");
ABSL_FLAG(uint64_t, seed, 1, "seed for the latency jitter");
ABSL_FLAG(std::string, history, "",
          "append one timed record per fence decision (admit/refuse) to this file (harness)");

namespace fencelock::payout {
namespace {

using asio::ip::tcp;

class Rail {
 public:
  Rail(std::unique_ptr<RailLedger> ledger, std::shared_ptr<metrics::Registry> registry,
       std::unique_ptr<history::Writer> history)
      : ledger_(std::move(ledger)),
        history_(std::move(history)),
        submits_(registry->GetCounter("rail_submits_total", "SUBMIT requests answered")),
        payments_(registry->GetCounter("rail_payments_total", "payouts paid (irreversible)")),
        duplicates_(registry->GetCounter(
            "rail_duplicate_attempted_total",
            "SUBMITs for a payout already paid (not paid again); must be zero")),
        fenced_(registry->GetCounter("rail_fenced_out_total",
                                     "SUBMIT/STATUS refused by the rail's fence (stale token)")) {}

  // Counters continue from the ledger's history across restarts.
  absl::Status LoadCounters() {
    auto stats = ledger_->Stats();
    if (!stats.ok()) return stats.status();
    submits_.Increment(stats->submits);
    payments_.Increment(stats->paid);
    duplicates_.Increment(stats->duplicate_attempted);
    fenced_.Increment(stats->fenced_out);
    return absl::OkStatus();
  }

  RailReply Handle(const RailRequest& request) {
    const int64_t begin = history::NowNanos();
    absl::StatusOr<RailReply> reply;
    switch (request.kind) {
      case RailRequest::Kind::kHello: {
        RailReply hello{.kind = RailReply::Kind::kHello};
        hello.read_timeout_ms = absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_read_timeout));
        return hello;
      }
      case RailRequest::Kind::kStats: {
        auto stats = ledger_->Stats();
        if (!stats.ok()) return Error(stats.status());
        RailReply r{.kind = RailReply::Kind::kStats};
        r.stats = {{"submits", stats->submits},
                   {"paid", stats->paid},
                   {"duplicate_attempted", stats->duplicate_attempted},
                   {"fenced_out", stats->fenced_out},
                   {"status_queries", stats->status_queries}};
        return r;
      }
      case RailRequest::Kind::kSubmit:
        reply = ledger_->Submit(request.payout, request.token, request.amount_cents);
        if (reply.ok()) submits_.Increment();
        break;
      case RailRequest::Kind::kStatus:
        reply = ledger_->Status(request.payout, request.token);
        break;
    }
    if (!reply.ok()) return Error(reply.status());
    // The rail serves one request at a time, so the file's order is the fence's order.
    history_->Append(begin, reply->kind == RailReply::Kind::kFenced ? "refuse" : "admit",
                     request.payout, request.token,
                     absl::StrCat(request.kind == RailRequest::Kind::kSubmit ? "SUBMIT " : "STATUS ",
                                  FormatRailReply(*reply)));
    if (reply->kind == RailReply::Kind::kPaid && request.kind == RailRequest::Kind::kSubmit) {
      payments_.Increment();
    }
    if (reply->kind == RailReply::Kind::kDuplicate) {
      duplicates_.Increment();
      logging::Program().Error(absl::StrFormat(
          "DUPLICATE submit of %s under token %lu (paid as txn %ld)", request.payout.c_str(),
          static_cast<unsigned long>(request.token), static_cast<long>(reply->txn)));
    }
    if (reply->kind == RailReply::Kind::kFenced) {
      fenced_.Increment();
      logging::Program().Error(absl::StrFormat(
          "fenced out %s token %lu (highest %lu)", FormatRailRequest(request).c_str(),
          static_cast<unsigned long>(request.token), static_cast<unsigned long>(reply->highest)));
    }
    return *reply;
  }

 private:
  static RailReply Error(const absl::Status& s) {
    logging::Program().Error(absl::StrFormat("ledger error: %s", s.ToString().c_str()));
    return RailReply{.kind = RailReply::Kind::kError, .error = std::string(s.message())};
  }

  std::unique_ptr<RailLedger> ledger_;
  std::unique_ptr<history::Writer> history_;
  metrics::Counter& submits_;
  metrics::Counter& payments_;
  metrics::Counter& duplicates_;
  metrics::Counter& fenced_;
};

asio::awaitable<void> Serve(tcp::socket socket, Rail& rail, std::mt19937_64& rng) {
  asio::streambuf in(kMaxRailLine + 1);
  asio::steady_timer timer(socket.get_executor());
  const absl::Duration latency = absl::GetFlag(FLAGS_latency);
  const absl::Duration jitter = absl::GetFlag(FLAGS_jitter);
  for (;;) {
    boost::system::error_code ec;
    const size_t n = co_await asio::async_read_until(socket, in, '\n',
                                                     asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::not_found) {
      co_await asio::async_write(socket, asio::buffer(std::string("ERROR line longer than 512 bytes\n")),
                                 asio::redirect_error(asio::use_awaitable, ec));
      co_return;  // the stream cannot be resynchronized
    }
    if (ec) co_return;
    std::string line(asio::buffers_begin(in.data()), asio::buffers_begin(in.data()) + n - 1);
    in.consume(n);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    RailReply reply;
    auto request = ParseRailRequest(line);
    if (!request.ok()) {
      reply = RailReply{.kind = RailReply::Kind::kError, .error = std::string(request.status().message())};
    } else {
      if (request->kind == RailRequest::Kind::kSubmit || request->kind == RailRequest::Kind::kStatus) {
        absl::Duration delay = latency;
        if (jitter > absl::ZeroDuration()) {
          delay += absl::Nanoseconds(rng() % (absl::ToInt64Nanoseconds(jitter) + 1));
        }
        timer.expires_after(absl::ToChronoNanoseconds(delay));
        co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      }
      reply = rail.Handle(*request);
    }
    co_await asio::async_write(socket, asio::buffer(FormatRailReply(reply) + "\n"),
                               asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return;
  }
}

asio::awaitable<void> Accept(tcp::acceptor& acceptor, Rail& rail, std::mt19937_64& rng) {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) continue;
    socket.set_option(tcp::no_delay(true), ec);
    asio::co_spawn(acceptor.get_executor(), Serve(std::move(socket), rail, rng), asio::detached);
  }
}

int Main() {
  const std::string db = absl::GetFlag(FLAGS_db);
  if (db.empty()) {
    logging::Program().Error("--db is required (the ledger's SQLite file)");
    return 2;
  }
  if (absl::GetFlag(FLAGS_read_timeout) <= absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_latency) < absl::ZeroDuration() ||
      absl::GetFlag(FLAGS_jitter) < absl::ZeroDuration()) {
    logging::Program().Error("--read-timeout must be > 0, --latency and --jitter >= 0");
    return 2;
  }
  if (absl::GetFlag(FLAGS_latency) + absl::GetFlag(FLAGS_jitter) >= absl::GetFlag(FLAGS_read_timeout)) {
    logging::Program().Warning(absl::StrFormat(
        "latency + jitter (%s) reaches the read timeout (%s): clients will time out on submits",
        absl::FormatDuration(absl::GetFlag(FLAGS_latency) + absl::GetFlag(FLAGS_jitter)).c_str(),
        absl::FormatDuration(absl::GetFlag(FLAGS_read_timeout)).c_str()));
  }
  // Signals are caught from here on, so a stop that arrives as soon as the port is published
  // still shuts down cleanly.
  asio::io_context io;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code, int sig) {
    std::printf("payout-rail: signal %d, shutting down\n", sig);
    io.stop();
  });
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);  // blocked in main() until now
  auto ledger = RailLedger::Open(db);
  if (!ledger.ok()) {
    logging::Program().Error(ledger.status().ToString());
    return 1;
  }
  auto registry = std::make_shared<metrics::Registry>();
  auto history = history::Writer::Open(absl::GetFlag(FLAGS_history), "rail");
  if (!history.ok()) {
    logging::Program().Error(history.status().ToString());
    return 1;
  }
  Rail rail(std::move(*ledger), registry, std::move(*history));
  if (absl::Status s = rail.LoadCounters(); !s.ok()) {
    logging::Program().Error(s.ToString());
    return 1;
  }
  auto exposer = ServeMetricsFromFlags(absl::GetFlag(FLAGS_host), registry);
  if (!exposer.ok()) {
    logging::Program().Error(exposer.status().ToString());
    return 1;
  }

  boost::system::error_code ec;
  const auto address = asio::ip::make_address(absl::GetFlag(FLAGS_host), ec);
  if (ec) {
    logging::Program().Error(absl::StrFormat(
        "--host=%s: %s", absl::GetFlag(FLAGS_host).c_str(), ec.message().c_str()));
    return 2;
  }
  tcp::acceptor acceptor(io);
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(absl::GetFlag(FLAGS_port)));
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    logging::Program().Error(absl::StrFormat(
        "cannot listen on %s:%d: %s", absl::GetFlag(FLAGS_host).c_str(), absl::GetFlag(FLAGS_port),
        ec.message().c_str()));
    return 1;
  }
  const int port = acceptor.local_endpoint().port();
  if (absl::Status s = process::WritePortFile(absl::GetFlag(FLAGS_port_file), port); !s.ok()) {
    logging::Program().Error(s.ToString());
    return 1;
  }
  std::printf("payout-rail: listening on %s:%d, latency %s, read timeout %s, ledger %s\n",
              absl::GetFlag(FLAGS_host).c_str(), port,
              absl::FormatDuration(absl::GetFlag(FLAGS_latency)).c_str(),
              absl::FormatDuration(absl::GetFlag(FLAGS_read_timeout)).c_str(), db.c_str());
  std::fflush(stdout);

  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  asio::co_spawn(io, Accept(acceptor, rail, rng), asio::detached);
  io.run();
  return 0;
}

}  // namespace
}  // namespace fencelock::payout

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("payout-rail");
  signal(SIGPIPE, SIG_IGN);
  // A stop signal that arrives before the handler exists waits, pending, instead of killing.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  fencelock::process::ParseFlags(argc, argv);
  return fencelock::payout::Main();
}
