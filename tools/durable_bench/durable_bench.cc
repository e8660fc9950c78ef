// Durable acquire+release throughput and acquire latency of a real lockd process.
//
//   lockd_durable_bench --lockd=build/lock-server/lockd [--clients=1,8,64] [--seconds=3]
//                       [--tls-dir=DIR] [--etcd=/usr/bin/etcd]
//
// Starts lockd on a fresh state directory (under $TMPDIR) and, for each client count, opens
// that many TCP connections with one session each. Every client loops: Acquire its own lock
// (uncontended), wait for the grant, Release, wait for the answer. lockd acknowledges each
// only after its WAL record is fdatasynced, so every cycle is two durable mutations; clients
// share syncs through group commit. Prints cycles/s, WAL syncs/s (from lockd's own counters),
// and p50/p99 acquire latency. One benchmark thread drives all clients with Asio.
//
// With --tls-dir (a directory made by scripts/make-certs.sh DIR lockd bench), it measures
// twice in one run, on two fresh lockds: plaintext loopback TCP first, then TLS 1.3 with
// client certificates, so that the cost of TLS shows beside the same workload. With --etcd,
// it measures a third lockd whose state is in a one-member etcd it starts (a commit is then an
// etcd transaction, which etcd makes durable with its own fdatasync).
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fencelock/wire.pb.h"
#include "logging/logging.h"
#include "net/asio.h"
#include "net/asio_ssl.h"
#include "net/tls.h"
#include "payout-demo/etcd_cluster.h"
#include "process/flags.h"
#include "process/process.h"
#include "testing/local_lockd.h"
#include "protocol/frame.h"
#include "protocol/requests.h"
#include "protocol/session.h"

ABSL_FLAG(std::string, lockd, "", "path to the lockd binary");
ABSL_FLAG(std::string, clients, "1,8,64", "client counts to measure");
ABSL_FLAG(double, seconds, 3.0, "measuring time per client count");
ABSL_FLAG(std::string, dir, "", "state directory parent (default $TMPDIR or /tmp)");
ABSL_FLAG(std::string, etcd, "",
          "also measure with lockd's state in etcd: the path of the etcd binary (Debian's "
          "etcd-server: /usr/bin/etcd); the bench starts a one-member etcd of its own");
ABSL_FLAG(std::string, tls_dir, "",
          "also measure over TLS, with the certificates made by scripts/make-certs.sh DIR lockd "
          "bench in this directory");
ABSL_FLAG(bool, pipeline, false,
          "each client writes Release(previous grant) and Acquire(next) in one write and then "
          "reads both answers, as the protocol's request ids allow");
ABSL_FLAG(bool, validate_only, false,
          "baseline: each cycle is two Validate round trips (no durable mutation), to show "
          "what the network path alone costs");

namespace fencelock {
namespace {

using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;
namespace req = protocol::request;

// One request/response exchange on a connection (no pipelining), over TLS when `tls` is set.
class Conn {
 public:
  Conn(asio::ip::tcp::socket s, asio::ssl::context* tls) : socket_(std::move(s)) {
    if (tls != nullptr) tls_ = std::make_unique<asio::ssl::stream<asio::ip::tcp::socket&>>(socket_, *tls);
  }

  awaitable<wire::Response> Call(wire::Request req) {
    req.set_request_id(++id_);
    std::string frame;
    (void)protocol::AppendFrame(req.SerializeAsString(), &frame);
    co_await Write(frame);
    co_return co_await Read();
  }
  // Writes `a` and `b` in one write; returns both answers, in request order.
  awaitable<std::pair<wire::Response, wire::Response>> CallPair(wire::Request a, wire::Request b) {
    a.set_request_id(++id_);
    b.set_request_id(++id_);
    std::string frames;
    (void)protocol::AppendFrame(a.SerializeAsString(), &frames);
    (void)protocol::AppendFrame(b.SerializeAsString(), &frames);
    co_await Write(frames);
    wire::Response first = co_await Read();
    wire::Response second = co_await Read();
    if (first.request_id() == b.request_id()) std::swap(first, second);
    co_return std::make_pair(std::move(first), std::move(second));
  }
  // The TLS handshake if any, then Hello.
  awaitable<void> Hello() {
    if (tls_) co_await tls_->async_handshake(asio::ssl::stream_base::client, use_awaitable);
    co_await Call(protocol::HelloRequest("lockd_durable_bench", {.min = 1, .max = 1}));
  }
  awaitable<wire::Response> Read() {
    std::string payload;
    for (;;) {
      if (decoder_.Next(&payload) == protocol::FrameDecoder::Result::kFrame) {
        wire::Response r;
        r.ParseFromString(payload);
        co_return r;
      }
      size_t n = 0;
      if (tls_) {
        n = co_await tls_->async_read_some(asio::buffer(buf_), use_awaitable);
      } else {
        n = co_await socket_.async_read_some(asio::buffer(buf_), use_awaitable);
      }
      decoder_.Feed(std::string_view(buf_, n));
    }
  }

 private:
  awaitable<void> Write(const std::string& bytes) {
    if (tls_) {
      co_await asio::async_write(*tls_, asio::buffer(bytes), use_awaitable);
    } else {
      co_await asio::async_write(socket_, asio::buffer(bytes), use_awaitable);
    }
  }

  asio::ip::tcp::socket socket_;
  std::unique_ptr<asio::ssl::stream<asio::ip::tcp::socket&>> tls_;
  protocol::FrameDecoder decoder_;
  char buf_[65536];
  uint64_t id_ = 0;
};

struct Shared {
  bool measuring = false;
  bool stop = false;
  uint64_t cycles = 0;
  std::vector<double> acquire_us;
  int errors = 0;
};

awaitable<void> RunClient(asio::io_context& io, int port, asio::ssl::context* tls, int index,
                          Shared& shared) {
  asio::ip::tcp::socket socket(io);
  co_await socket.async_connect(
      asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)),
      use_awaitable);
  socket.set_option(asio::ip::tcp::no_delay(true));
  Conn conn(std::move(socket), tls);
  co_await conn.Hello();
  const uint64_t session =
      (co_await conn.Call(req::OpenSession(absl::Minutes(10)))).open_session().session_id();
  const std::string lock = "bench-" + std::to_string(session) + "-" + std::to_string(index);
  if (absl::GetFlag(FLAGS_validate_only)) {
    const uint64_t token = (co_await conn.Call(req::Acquire(session, lock))).acquire().token();
    const wire::Request validate = req::Validate(lock, token);
    while (!shared.stop) {
      const auto t0 = Clock::now();
      wire::Response first = co_await conn.Call(validate);
      const auto t1 = Clock::now();
      wire::Response second = co_await conn.Call(validate);
      if (first.code() != wire::OK || second.code() != wire::OK) {
        ++shared.errors;
        break;
      }
      if (shared.measuring) {
        ++shared.cycles;
        shared.acquire_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    }
    co_return;
  }
  if (absl::GetFlag(FLAGS_pipeline)) {
    const wire::Request acquire = req::Acquire(session, lock, absl::Seconds(10));
    wire::Response granted = co_await conn.Call(acquire);
    while (!shared.stop && granted.code() == wire::OK) {
      const wire::Request release = req::Release(session, lock, granted.acquire().token());
      const auto t0 = Clock::now();
      auto [released, next] = co_await conn.CallPair(release, acquire);
      const auto t1 = Clock::now();
      if (released.code() != wire::OK || next.code() != wire::OK || !next.acquire().granted()) {
        ++shared.errors;
        break;
      }
      granted = std::move(next);
      if (shared.measuring) {
        ++shared.cycles;
        shared.acquire_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    }
    co_return;
  }
  while (!shared.stop) {
    const auto t0 = Clock::now();
    wire::Response granted = co_await conn.Call(req::Acquire(session, lock, absl::Seconds(10)));
    const auto t1 = Clock::now();
    if (granted.code() != wire::OK || !granted.acquire().granted()) {
      ++shared.errors;
      break;
    }
    wire::Response released =
        co_await conn.Call(req::Release(session, lock, granted.acquire().token()));
    if (released.code() != wire::OK) {
      ++shared.errors;
      break;
    }
    if (shared.measuring) {
      ++shared.cycles;
      shared.acquire_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  }
}

wire::StatsReply Stats(int port, asio::ssl::context* tls) {
  asio::io_context io;
  wire::StatsReply out;
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        asio::ip::tcp::socket s(io);
        co_await s.async_connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"),
                                                         static_cast<uint16_t>(port)),
                                 use_awaitable);
        Conn conn(std::move(s), tls);
        co_await conn.Hello();
        const wire::Request stats = req::GetStats();
        out = (co_await conn.Call(stats)).stats();
      },
      asio::detached);
  io.run();
  return out;
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

// A one-member etcd in `work` (payout-demo's launcher, as the M7 benchmark's etcd peer uses)
// with lockd's prefix initialized in it.
absl::StatusOr<std::unique_ptr<payout::EtcdCluster>> StartEtcd(const std::string& etcd,
                                                               const std::string& lockd,
                                                               const std::string& work) {
  std::filesystem::create_directories(work + "/logs");
  auto cluster = payout::EtcdCluster::Start({.dir = work, .etcd_binary = etcd, .members = 1});
  if (!cluster.ok()) return cluster.status();
  if (absl::Status s = process::RunToSuccess(
          lockd, {"init", "--etcd=" + (*cluster)->endpoints(), "--etcd-prefix=/fencelock/bench"},
          {.stdout_file = work + "/lockd-init.log", .stderr_file = work + "/lockd-init.log"});
      !s.ok()) {
    return s;
  }
  return cluster;
}

// A lockd serving a fresh state directory under `work` (stopped with the object), and the
// client side of its transport.
struct Lockd {
  std::unique_ptr<testing::LocalLockd> process;
  std::unique_ptr<asio::ssl::context> tls;  // null: plaintext
};

// Starts lockd (over TLS with the certificates in `tls_dir` unless it is empty; on the etcd at
// `etcd` unless it is empty, else on a state directory); an error naming the cause if it does
// not come up.
absl::Status StartLockd(const std::string& lockd, const std::string& work,
                        const std::string& tls_dir, const std::string& etcd, Lockd* out) {
  testing::LocalLockdOptions options{.binary = lockd, .dir = work};
  if (!etcd.empty()) {
    options.etcd = etcd;
    options.etcd_prefix = "/fencelock/bench";
  }
  if (!tls_dir.empty()) {
    options.serve_args = {"--tls-ca=" + tls_dir + "/ca.crt", "--tls-cert=" + tls_dir + "/lockd.crt",
                          "--tls-key=" + tls_dir + "/lockd.key"};
    auto context = net::TlsContext::Create({.ca_file = tls_dir + "/ca.crt",
                                            .cert_file = tls_dir + "/bench.crt",
                                            .key_file = tls_dir + "/bench.key"},
                                           net::TlsRole::kClient, "bench ");
    if (!context.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-dir=", tls_dir, " (scripts/make-certs.sh DIR lockd bench): ",
                       context.status().message()));
    }
    SSL_CTX_up_ref((*context)->native());
    out->tls = std::make_unique<asio::ssl::context>((*context)->native());
  }
  auto started = testing::LocalLockd::Start(std::move(options));
  if (!started.ok()) return started.status();
  out->process = std::move(*started);
  return absl::OkStatus();
}

// Every client count against `lockd`, one line each; false if a cycle failed.
bool Measure(Lockd& lockd, const char* transport) {
  bool ok = true;
  for (absl::string_view count_text : absl::StrSplit(absl::GetFlag(FLAGS_clients), ',')) {
    int clients = 0;
    if (!absl::SimpleAtoi(count_text, &clients) || clients <= 0) return false;
    asio::io_context io(1);
    Shared shared;
    for (int c = 0; c < clients; ++c) {
      asio::co_spawn(io, RunClient(io, lockd.process->port(), lockd.tls.get(), c, shared), asio::detached);
    }
    asio::steady_timer timer(io);
    wire::StatsReply before;
    Clock::time_point start;
    // Warm up for 0.5 s, then measure.
    timer.expires_after(std::chrono::milliseconds(500));
    timer.async_wait([&](auto) {
      before = Stats(lockd.process->port(), lockd.tls.get());
      start = Clock::now();
      shared.measuring = true;
      timer.expires_after(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds))));
      timer.async_wait([&](auto) {
        shared.measuring = false;
        shared.stop = true;
      });
    });
    io.run();
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const wire::StatsReply after = Stats(lockd.process->port(), lockd.tls.get());
    const double syncs = static_cast<double>(after.log_syncs_total() - before.log_syncs_total());
    const double sync_us =
        syncs > 0 ? static_cast<double>(after.log_sync_ns_total() - before.log_sync_ns_total()) /
                        syncs / 1000.0
                  : 0.0;
    std::printf("%-10s %8d %12.0f %10.0f %12.2f %9.0f us %9.0f us %9.0f us%s\n", transport,
                clients, static_cast<double>(shared.cycles) / elapsed, syncs / elapsed,
                syncs > 0 ? static_cast<double>(shared.cycles) / syncs : 0.0, sync_us,
                Percentile(shared.acquire_us, 0.50), Percentile(shared.acquire_us, 0.99),
                shared.errors ? "  (errors!)" : "");
    std::fflush(stdout);
    if (shared.errors) ok = false;
  }
  return ok;
}

int Main() {
  const std::string lockd = absl::GetFlag(FLAGS_lockd);
  if (lockd.empty()) {
    logging::Program().Error("--lockd=PATH is required");
    return 2;
  }
  std::string base = absl::GetFlag(FLAGS_dir);
  if (base.empty()) base = getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp";
  std::string work = base + "/fencelock-bench-XXXXXX";
  if (mkdtemp(work.data()) == nullptr) return 1;
  std::printf("durable acquire+release cycles against lockd (state in %s, fdatasync per batch)\n",
              work.c_str());
  std::printf("%-10s %8s %12s %10s %12s %12s %12s %12s\n", "setup", "clients", "cycles/s",
              "syncs/s", "cycles/sync", "sync avg", "acquire p50", "acquire p99");
  struct Setup {
    const char* name;
    std::string tls_dir;
    bool etcd;
  };
  std::vector<Setup> setups = {{"plaintext", "", false}};
  if (const std::string tls = absl::GetFlag(FLAGS_tls_dir); !tls.empty()) {
    setups.push_back({"tls", tls, false});
  }
  if (!absl::GetFlag(FLAGS_etcd).empty()) setups.push_back({"etcd", "", true});
  int status = 0;
  for (const auto& setup : setups) {
    Lockd server;
    const std::string dir = work + "/" + setup.name;
    std::filesystem::create_directories(dir);
    std::unique_ptr<payout::EtcdCluster> etcd;
    absl::Status started = absl::OkStatus();
    if (setup.etcd) {
      auto cluster = StartEtcd(absl::GetFlag(FLAGS_etcd), lockd, dir);
      if (cluster.ok()) {
        etcd = std::move(*cluster);
      } else {
        started = cluster.status();
      }
    }
    if (started.ok()) started = StartLockd(lockd, dir, setup.tls_dir, etcd ? etcd->endpoints() : "", &server);
    if (!started.ok()) {
      logging::Program().Error(absl::StrCat(setup.name, ": ", started.ToString()));
      status = 1;
    } else if (!Measure(server, setup.name)) {
      status = 1;
    }
    server.process.reset();  // stopped before the etcd it may be on
  }
  std::filesystem::remove_all(work);
  return status;
}

}  // namespace
}  // namespace fencelock

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("lockd_durable_bench");
  fencelock::process::ParseFlags(argc, argv);
  return fencelock::Main();
}
