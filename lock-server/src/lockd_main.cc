// lockd: the fencelock lock server.
//
//   lockd serve [--listen=127.0.0.1] [--port=7420] [--unix_socket=PATH] [--port_file=PATH]
//               [--session_ttl=15s] [--lock_ttl=30s]
//
// Prints one line per listener ("lockd: listening on tcp 127.0.0.1:7420") once it accepts
// connections, and writes the bound TCP port to --port_file when given (tests bind port 0 and
// read it back). SIGINT or SIGTERM stops it cleanly.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "lock-server/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1", "TCP address to listen on");
ABSL_FLAG(int, port, 7420, "TCP port to listen on; 0 picks a free port");
ABSL_FLAG(std::string, unix_socket, "", "also listen on this Unix-domain socket path");
ABSL_FLAG(std::string, port_file, "", "write the bound TCP port to this file");
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
  const uint16_t bound = (*server)->tcp_port();
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << bound << "\n";
      if (!out.flush()) {
        std::fprintf(stderr, "lockd: cannot write port file %s\n", tmp.c_str());
        return 1;
      }
    }
    if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      std::fprintf(stderr, "lockd: cannot rename %s to %s\n", tmp.c_str(), port_file.c_str());
      return 1;
    }
  }
  std::printf("lockd: listening on tcp %s:%u\n", options.tcp_host.c_str(), bound);
  if (!options.unix_socket_path.empty()) {
    std::printf("lockd: listening on unix %s\n", options.unix_socket_path.c_str());
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

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the fencelock lock server\n  lockd serve [--listen=ADDR] [--port=N] [--unix_socket=PATH] "
      "[--port_file=PATH] [--session_ttl=D] [--lock_ttl=D]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2 || std::string(args[1]) != "serve") {
    std::fprintf(stderr, "usage: lockd serve [flags]; lockd --help lists the flags\n");
    return 2;
  }
  return Serve();
}
