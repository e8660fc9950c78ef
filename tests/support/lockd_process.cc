#include "lockd_process.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

namespace fencelock::testing {

TempDir::TempDir() {
  const char* base = getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/fencelock-test-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

LockdProcess::LockdProcess(Options options) {
  const std::string port_file = dir_.path() + "/port";
  std::vector<std::string> args = {LOCKD_BINARY, "serve", "--port=0", "--port_file=" + port_file};
  if (options.unix_socket) {
    unix_path_ = dir_.path() + "/lockd.sock";
    args.push_back("--unix_socket=" + unix_path_);
  }
  for (const auto& a : options.extra_args) args.push_back(a);

  pid_ = fork();
  if (pid_ < 0) {
    std::perror("fork");
    std::abort();
  }
  if (pid_ == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::perror("execv lockd");
    _exit(127);
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < give_up) {
    std::ifstream in(port_file);
    if (in >> port_ && port_ > 0) return;
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      std::fprintf(stderr, "lockd exited before listening (status %d)\n", status);
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::fprintf(stderr, "lockd did not report its port within 20 s\n");
  kill(pid_, SIGKILL);
  std::abort();
}

LockdProcess::~LockdProcess() {
  if (pid_ <= 0) return;
  const int status = Stop();
  // A lockd that crashed, or that a sanitizer stopped, fails the test that started it.
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "lockd did not exit cleanly (wait status %d)\n", status);
    std::abort();
  }
}

void LockdProcess::Pause() { kill(pid_, SIGSTOP); }
void LockdProcess::Resume() { kill(pid_, SIGCONT); }

int LockdProcess::Stop() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGCONT);
  kill(pid_, SIGTERM);
  int status = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > give_up) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
  return status;
}

}  // namespace fencelock::testing
