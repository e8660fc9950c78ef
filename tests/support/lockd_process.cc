#include "lockd_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "process/process.h"

namespace fencelock::testing {
namespace {

// Runs lockd with `args` (after the binary name) to completion; stderr goes to `err_file`
// when given.
int RunToExit(const std::vector<std::string>& args, const std::string& err_file) {
  auto child = process::Child::Spawn(LOCKD_BINARY, args, {.stderr_file = err_file});
  if (!child.ok()) {
    std::fprintf(stderr, "%s\n", child.status().ToString().c_str());
    std::abort();
  }
  return *child->Wait();
}

}  // namespace

pid_t SpawnProcess(const std::string& binary, const std::vector<std::string>& args,
                   const std::string& stderr_file) {
  auto child = process::Child::Spawn(binary, args, {.stderr_file = stderr_file});
  if (!child.ok()) {
    std::fprintf(stderr, "%s\n", child.status().ToString().c_str());
    std::abort();
  }
  return child->Detach();
}

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
  if (getenv("FENCELOCK_KEEP_TMP") != nullptr) {
    std::fprintf(stderr, "kept %s (FENCELOCK_KEEP_TMP)\n", path_.c_str());
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

int InitDataDir(const std::string& data_dir, uint64_t segment_bytes) {
  return RunToExit({"init", "--data-dir=" + data_dir,
                    "--wal-segment-bytes=" + std::to_string(segment_bytes)},
                   "");
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::pair<int, std::string> RunLockdToExit(const std::vector<std::string>& args) {
  TempDir tmp;
  const std::string err_file = tmp.path() + "/stderr";
  const int status = RunToExit(args, err_file);
  return {status, ReadTextFile(err_file)};
}

LockdProcess::LockdProcess(Options options) : options_(std::move(options)) {
  data_dir_ = options_.data_dir;
  if (!options_.etcd.empty()) {
    std::vector<std::string> init = {"init", "--etcd=" + options_.etcd,
                                     "--etcd-prefix=" + options_.etcd_prefix};
    init.insert(init.end(), options_.etcd_args.begin(), options_.etcd_args.end());
    if (options_.etcd_init && RunToExit(init, "") != 0) {
      std::fprintf(stderr, "lockd init --etcd-prefix=%s failed\n", options_.etcd_prefix.c_str());
      std::abort();
    }
  } else if (data_dir_.empty()) {
    data_dir_ = dir_.path() + "/state";
    if (InitDataDir(data_dir_, options_.segment_bytes) != 0) {
      std::fprintf(stderr, "lockd init %s failed\n", data_dir_.c_str());
      std::abort();
    }
  }
  if (options_.unix_socket) unix_path_ = dir_.path() + "/lockd.sock";
  Start(options_.port);
}

void LockdProcess::Start(int port) {
  const std::string port_file = this->port_file();
  std::filesystem::remove(port_file);
  std::vector<std::string> args = {"serve",
                                   options_.etcd.empty() ? "--data-dir=" + data_dir_
                                                         : "--etcd=" + options_.etcd,
                                   "--port=" + std::to_string(port),
                                   "--port-file=" + port_file,
                                   "--wal-segment-bytes=" + std::to_string(options_.segment_bytes),
                                   "--metrics-port=0",
                                   "--metrics-port-file=" + dir_.path() + "/metrics-port"};
  if (!options_.etcd.empty()) {
    args.push_back("--etcd-prefix=" + options_.etcd_prefix);
    args.insert(args.end(), options_.etcd_args.begin(), options_.etcd_args.end());
  }
  if (!unix_path_.empty()) args.push_back("--unix-socket=" + unix_path_);
  // Each test's lockd is its own host as far as admission goes (ADR 0005): tests run side by
  // side, and one that means to share the lock names it.
  if (std::none_of(options_.extra_args.begin(), options_.extra_args.end(),
                   [](const std::string& a) { return a.rfind("--admission-lock=", 0) == 0; })) {
    args.push_back("--admission-lock=" + dir_.path() + "/admission.lock");
  }
  for (const auto& a : options_.extra_args) args.push_back(a);
  std::string binary = LOCKD_BINARY;
  if (!options_.launcher.empty()) {  // it execs lockd in its own process
    args.insert(args.begin(), binary);
    args.insert(args.begin(), options_.launcher.begin() + 1, options_.launcher.end());
    binary = options_.launcher.front();
  }
  auto child = process::Child::Spawn(
      binary, args,
      {.stdout_file = options_.stdout_file, .stderr_file = options_.stderr_file});
  if (!child.ok()) {
    std::fprintf(stderr, "%s\n", child.status().ToString().c_str());
    std::abort();
  }
  child_ = std::move(*child);
  auto bound = process::AwaitPortFile(port_file, child_, absl::Seconds(20));
  if (!bound.ok()) {
    std::fprintf(stderr, "lockd did not start listening: %s\n", bound.status().ToString().c_str());
    // Its own words say why; the file goes with the test's directory.
    if (!options_.stderr_file.empty()) {
      std::fprintf(stderr, "lockd's stderr (%s):\n%s\n", options_.stderr_file.c_str(),
                   ReadTextFile(options_.stderr_file).c_str());
    }
    std::abort();
  }
  port_ = *bound;
  std::ifstream metrics(dir_.path() + "/metrics-port");  // written before the TCP port
  metrics >> metrics_port_;
}

LockdProcess::~LockdProcess() {
  if (!child_.running()) return;
  const int status = Stop();
  // A lockd that crashed, or that a sanitizer stopped, fails the test that started it.
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "lockd did not exit cleanly (wait status %d)\n", status);
    std::abort();
  }
}

void LockdProcess::Kill() {
  child_.Signal(SIGKILL);
  child_.Wait();
}

void LockdProcess::Restart() {
  Kill();
  Start(port_);
}

int LockdProcess::Stop() {
  if (!child_.running()) return -1;
  return child_.Stop(absl::Seconds(5));
}

}  // namespace fencelock::testing
