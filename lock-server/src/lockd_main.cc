// lockd: the fencelock lock server.
//
//   lockd init  --data-dir=DIR
//   lockd serve --data-dir=DIR [--listen=127.0.0.1] [--port=7420] [--unix-socket=PATH]
//               [--port-file=PATH] [--session-ttl=15s] [--lock-ttl=30s]
//
// `serve` restores the state in DIR before it listens and refuses (exit 1, naming the file and
// offset or reason) a missing, uninitialized, damaged or unsupported one. It then prints one
// line per listener ("lockd: listening on tcp 127.0.0.1:7420") and writes the bound TCP port to
// --port-file when given (tests bind port 0 and read it back). SIGINT or SIGTERM stops it
// cleanly. Flags accept dashes or underscores.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "lock-server/env.h"
#include "lock-server/server.h"
#include "process/flags.h"
#include "process/process.h"
#include "storage.h"

ABSL_FLAG(std::string, data_dir, "", "state directory (created by lockd init)");
ABSL_FLAG(uint64_t, wal_segment_bytes, uint64_t{64} << 20,
          "size of each preallocated WAL segment; a snapshot follows each new segment");
ABSL_FLAG(std::string, listen, "127.0.0.1", "TCP address to listen on");
ABSL_FLAG(int, port, 7420, "TCP port to listen on; 0 picks a free port");
ABSL_FLAG(std::string, unix_socket, "", "also listen on this Unix-domain socket path");
ABSL_FLAG(std::string, port_file, "", "write the bound TCP port to this file");
ABSL_FLAG(int, metrics_port, 9420,
          "serve Prometheus metrics on 127.0.0.1 at this port; 0 picks a free one, -1 disables");
ABSL_FLAG(std::string, metrics_port_file, "", "write the bound metrics port to this file");
ABSL_FLAG(absl::Duration, session_ttl, absl::Seconds(15),
          "lock.session.ttl: TTL of sessions that ask for none");
ABSL_FLAG(absl::Duration, lock_ttl, absl::Seconds(30),
          "lock.default.ttl: lease TTL of acquires that ask for none");

namespace {

int Serve() {
  using fencelock::server::Server;
  using fencelock::server::ServerOptions;
  const int port = absl::GetFlag(FLAGS_port);
  if (port < 0 || port > 65535) {
    std::fprintf(stderr, "lockd: --port=%d is not a TCP port (0 to 65535)\n", port);
    return 2;
  }
  ServerOptions options;
  options.tcp_host = absl::GetFlag(FLAGS_listen);
  options.tcp_port = static_cast<uint16_t>(port);
  options.unix_socket_path = absl::GetFlag(FLAGS_unix_socket);
  options.default_session_ttl = absl::GetFlag(FLAGS_session_ttl);
  options.default_lock_ttl = absl::GetFlag(FLAGS_lock_ttl);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.wal_segment_bytes = absl::GetFlag(FLAGS_wal_segment_bytes);
  if (options.data_dir.empty()) {
    std::fprintf(stderr, "lockd: serve needs --data-dir (create one with lockd init)\n");
    return 2;
  }

  // Signals are taken by a dedicated thread, so no handler runs inside the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = Server::Create(options);
  if (!server.ok()) {
    std::fprintf(stderr, "lockd: %s\n", server.status().ToString().c_str());
    return 1;
  }
  for (const std::string& line : (*server)->recovery_summary()) {
    std::printf("lockd: %s\n", line.c_str());
  }
  const uint16_t bound = (*server)->tcp_port();
  // The metrics port first: a waiter on the TCP port file can then read both.
  for (const auto& [file, port] : {std::pair{absl::GetFlag(FLAGS_metrics_port_file),
                                              static_cast<int>((*server)->metrics_port())},
                                    std::pair{absl::GetFlag(FLAGS_port_file), static_cast<int>(bound)}}) {
    if (absl::Status s = fencelock::process::WritePortFile(file, port); !s.ok()) {
      std::fprintf(stderr, "lockd: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  std::printf("lockd: listening on tcp %s:%u\n", options.tcp_host.c_str(), bound);
  if (!options.unix_socket_path.empty()) {
    std::printf("lockd: listening on unix %s\n", options.unix_socket_path.c_str());
  }
  if ((*server)->metrics_port() > 0) {
    std::printf("lockd: serving metrics on http://127.0.0.1:%d/metrics\n",
                (*server)->metrics_port());
  }
  std::fflush(stdout);

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::printf("lockd: signal %d, shutting down\n", sig);
    std::fflush(stdout);
    (*server)->Shutdown();
  });
  (*server)->Run();
  // Run() returned because of the signal, or something made it stop: make sure the signal
  // thread ends either way.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  return 0;
}

int Init() {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  if (dir.empty()) {
    std::fprintf(stderr, "lockd: init needs --data-dir\n");
    return 2;
  }
  absl::Status s = fencelock::server::InitDataDir(fencelock::server::Env::Posix(), dir,
                                                  absl::GetFlag(FLAGS_wal_segment_bytes));
  if (!s.ok()) {
    std::fprintf(stderr, "lockd: init: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("lockd: initialized state directory %s\n", dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the fencelock lock server\n"
      "  lockd init  --data-dir=DIR\n"
      "  lockd serve --data-dir=DIR [--listen=ADDR] [--port=N] [--unix-socket=PATH]\n"
      "              [--port-file=PATH] [--session-ttl=D] [--lock-ttl=D]");
  const std::vector<std::string> args = fencelock::process::ParseFlags(argc, argv);
  const std::string command = args.size() == 2 ? args[1] : "";
  if (command == "init") return Init();
  if (command == "serve") return Serve();
  std::fprintf(stderr, "usage: lockd init|serve --data-dir=DIR [flags]; lockd --help lists the flags\n");
  return 2;
}
