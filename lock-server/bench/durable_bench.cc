// Durable acquire+release throughput and acquire latency of a real lockd process.
//
//   lockd_durable_bench --lockd=build/lock-server/lockd [--clients=1,8,64] [--seconds=3]
//
// Starts lockd on a fresh state directory (under $TMPDIR) and, for each client count, opens
// that many TCP connections with one session each. Every client loops: Acquire its own lock
// (uncontended), wait for the grant, Release, wait for the answer. lockd acknowledges each
// only after its WAL record is fdatasynced, so every cycle is two durable mutations; clients
// share syncs through group commit. Prints cycles/s, WAL syncs/s (from lockd's own counters),
// and p50/p99 acquire latency. One benchmark thread drives all clients with Asio.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "process/flags.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "fencelock/wire.pb.h"
#include "net/asio.h"
#include "protocol/frame.h"

ABSL_FLAG(std::string, lockd, "", "path to the lockd binary");
ABSL_FLAG(std::string, clients, "1,8,64", "client counts to measure");
ABSL_FLAG(double, seconds, 3.0, "measuring time per client count");
ABSL_FLAG(std::string, dir, "", "state directory parent (default $TMPDIR or /tmp)");
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

// One request/response exchange on a connection (no pipelining).
class Conn {
 public:
  explicit Conn(asio::ip::tcp::socket s) : socket_(std::move(s)) {}
  awaitable<wire::Response> Call(wire::Request req) {
    req.set_request_id(++id_);
    std::string frame;
    (void)protocol::AppendFrame(req.SerializeAsString(), &frame);
    co_await asio::async_write(socket_, asio::buffer(frame), use_awaitable);
    co_return co_await Read();
  }
  // Writes `a` and `b` in one write; returns both answers, in request order.
  awaitable<std::pair<wire::Response, wire::Response>> CallPair(wire::Request a, wire::Request b) {
    a.set_request_id(++id_);
    b.set_request_id(++id_);
    std::string frames;
    (void)protocol::AppendFrame(a.SerializeAsString(), &frames);
    (void)protocol::AppendFrame(b.SerializeAsString(), &frames);
    co_await asio::async_write(socket_, asio::buffer(frames), use_awaitable);
    wire::Response first = co_await Read();
    wire::Response second = co_await Read();
    if (first.request_id() == b.request_id()) std::swap(first, second);
    co_return std::make_pair(std::move(first), std::move(second));
  }
  awaitable<void> Hello() {
    wire::Request hello;
    hello.mutable_hello()->set_min_version(1);
    hello.mutable_hello()->set_max_version(1);
    co_await Call(hello);
  }
  awaitable<wire::Response> Read() {
    std::string payload;
    for (;;) {
      if (decoder_.Next(&payload) == protocol::FrameDecoder::Result::kFrame) {
        wire::Response r;
        r.ParseFromString(payload);
        co_return r;
      }
      const size_t n = co_await socket_.async_read_some(asio::buffer(buf_), use_awaitable);
      decoder_.Feed(std::string_view(buf_, n));
    }
  }

 private:
  asio::ip::tcp::socket socket_;
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

awaitable<void> RunClient(asio::io_context& io, int port, int index, Shared& shared) {
  asio::ip::tcp::socket socket(io);
  co_await socket.async_connect(
      asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)),
      use_awaitable);
  socket.set_option(asio::ip::tcp::no_delay(true));
  Conn conn(std::move(socket));
  co_await conn.Hello();
  wire::Request open;
  open.mutable_open_session()->set_ttl_ms(600'000);
  const uint64_t session = (co_await conn.Call(open)).open_session().session_id();
  const std::string lock = "bench-" + std::to_string(session) + "-" + std::to_string(index);
  if (absl::GetFlag(FLAGS_validate_only)) {
    wire::Request acquire;
    acquire.mutable_acquire()->set_session_id(session);
    acquire.mutable_acquire()->set_lock(lock);
    const uint64_t token = (co_await conn.Call(acquire)).acquire().token();
    wire::Request validate;
    validate.mutable_validate()->set_lock(lock);
    validate.mutable_validate()->set_token(token);
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
    wire::Request acquire;
    acquire.mutable_acquire()->set_session_id(session);
    acquire.mutable_acquire()->set_lock(lock);
    acquire.mutable_acquire()->set_wait_timeout_ms(10'000);
    wire::Response granted = co_await conn.Call(acquire);
    wire::Request release;
    release.mutable_release()->set_session_id(session);
    release.mutable_release()->set_lock(lock);
    while (!shared.stop && granted.code() == wire::OK) {
      release.mutable_release()->set_token(granted.acquire().token());
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
    wire::Request acquire;
    acquire.mutable_acquire()->set_session_id(session);
    acquire.mutable_acquire()->set_lock(lock);
    acquire.mutable_acquire()->set_wait_timeout_ms(10'000);
    const auto t0 = Clock::now();
    wire::Response granted = co_await conn.Call(acquire);
    const auto t1 = Clock::now();
    if (granted.code() != wire::OK || !granted.acquire().granted()) {
      ++shared.errors;
      break;
    }
    wire::Request release;
    release.mutable_release()->set_session_id(session);
    release.mutable_release()->set_lock(lock);
    release.mutable_release()->set_token(granted.acquire().token());
    wire::Response released = co_await conn.Call(release);
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

wire::StatsReply Stats(int port) {
  asio::io_context io;
  wire::StatsReply out;
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        asio::ip::tcp::socket s(io);
        co_await s.async_connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"),
                                                         static_cast<uint16_t>(port)),
                                 use_awaitable);
        Conn conn(std::move(s));
        co_await conn.Hello();
        wire::Request stats;
        stats.mutable_get_stats();
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

int Main() {
  const std::string lockd = absl::GetFlag(FLAGS_lockd);
  if (lockd.empty()) {
    std::fprintf(stderr, "--lockd=PATH is required\n");
    return 2;
  }
  std::string base = absl::GetFlag(FLAGS_dir);
  if (base.empty()) base = getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp";
  std::string work = base + "/fencelock-bench-XXXXXX";
  if (mkdtemp(work.data()) == nullptr) return 1;
  const std::string data = work + "/state", port_file = work + "/port";
  if (std::system((lockd + " init --data-dir=" + data + " > /dev/null").c_str()) != 0) return 1;
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execl(lockd.c_str(), lockd.c_str(), "serve", ("--data-dir=" + data).c_str(), "--port=0",
          ("--port-file=" + port_file).c_str(), "--metrics-port=-1", static_cast<char*>(nullptr));
    _exit(127);
  }
  int port = 0;
  for (int i = 0; i < 2000 && port == 0; ++i) {
    std::ifstream in(port_file);
    in >> port;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (port == 0) return 1;

  std::printf("durable acquire+release cycles against lockd (state in %s, fdatasync per batch)\n",
              data.c_str());
  std::printf("%8s %12s %10s %12s %12s %12s %12s\n", "clients", "cycles/s", "syncs/s",
              "cycles/sync", "sync avg", "acquire p50", "acquire p99");
  int status = 0;
  for (absl::string_view count_text : absl::StrSplit(absl::GetFlag(FLAGS_clients), ',')) {
    int clients = 0;
    if (!absl::SimpleAtoi(count_text, &clients) || clients <= 0) return 2;
    asio::io_context io(1);
    Shared shared;
    for (int c = 0; c < clients; ++c) {
      asio::co_spawn(io, RunClient(io, port, c, shared), asio::detached);
    }
    asio::steady_timer timer(io);
    wire::StatsReply before;
    Clock::time_point start;
    // Warm up for 0.5 s, then measure.
    timer.expires_after(std::chrono::milliseconds(500));
    timer.async_wait([&](auto) {
      before = Stats(port);
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
    const wire::StatsReply after = Stats(port);
    const double syncs = static_cast<double>(after.log_syncs_total() - before.log_syncs_total());
    const double sync_us =
        syncs > 0 ? static_cast<double>(after.log_sync_ns_total() - before.log_sync_ns_total()) /
                        syncs / 1000.0
                  : 0.0;
    std::printf("%8d %12.0f %10.0f %12.2f %9.0f us %9.0f us %9.0f us%s\n", clients,
                static_cast<double>(shared.cycles) / elapsed, syncs / elapsed,
                syncs > 0 ? static_cast<double>(shared.cycles) / syncs : 0.0, sync_us,
                Percentile(shared.acquire_us, 0.50), Percentile(shared.acquire_us, 0.99),
                shared.errors ? "  (errors!)" : "");
    std::fflush(stdout);
    if (shared.errors) status = 1;
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  std::filesystem::remove_all(work);
  return status;
}

}  // namespace
}  // namespace fencelock

int main(int argc, char** argv) {
  fencelock::process::ParseFlags(argc, argv);
  return fencelock::Main();
}
