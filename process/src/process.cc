#include "process/process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"

namespace fencelock::process {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Milliseconds from now until `deadline`, rounded up, for poll(); -1 for no deadline.
int PollTimeout(std::optional<SteadyClock::time_point> deadline) {
  if (!deadline.has_value()) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - SteadyClock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

std::optional<SteadyClock::time_point> DeadlineAfter(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return std::nullopt;
  return SteadyClock::now() + absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration()));
}

void CloseIfOpen(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

Child::Child(Child&& other) noexcept
    : pid_(other.pid_), pidfd_(other.pidfd_), status_(other.status_) {
  other.pid_ = -1;
  other.pidfd_ = -1;
  other.status_.reset();
}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    if (running()) Stop();
    CloseIfOpen(pidfd_);
    pid_ = other.pid_;
    pidfd_ = other.pidfd_;
    status_ = other.status_;
    other.pid_ = -1;
    other.pidfd_ = -1;
    other.status_.reset();
  }
  return *this;
}

Child::~Child() {
  if (running()) Stop();
  CloseIfOpen(pidfd_);
}

// fork and execve rather than posix_spawn: the child must ask for PR_SET_PDEATHSIG itself,
// between the two, and posix_spawn runs no code of ours there. Everything the child needs is
// prepared before fork (argv, the environment, the opened output files), so the child only
// makes async-signal-safe calls: prctl, getppid, dup2, signal, sigprocmask, execve, write and
// _exit. An execve that fails sends its errno through a close-on-exec pipe, so Spawn reports
// it instead of returning a child that exits 127.
absl::StatusOr<Child> Child::Spawn(const std::string& binary,
                                   const std::vector<std::string>& args,
                                   const SpawnOptions& options) {
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The child's environment: the parent's, with options.environment.
  std::vector<std::string> env_strings;
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const std::string& extra : options.environment) {
      replaced = replaced || name_of(extra) == name_of(entry);
    }
    if (!replaced) env_strings.push_back(entry);
  }
  env_strings.insert(env_strings.end(), options.environment.begin(), options.environment.end());
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  // Output files, opened here so that a bad path is an error of Spawn's.
  int in_fd = -1, out_fd = -1, err_fd = -1;
  auto open_output = [](const std::string& path, int* fd) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    *fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (*fd < 0) return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
    return absl::OkStatus();
  };
  absl::Status opened = open_output(options.stdout_file, &out_fd);
  if (opened.ok() && !options.stdin_file.empty()) {
    in_fd = open(options.stdin_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (in_fd < 0) {
      opened = absl::UnavailableError(
          absl::StrCat("cannot open ", options.stdin_file, ": ", strerror(errno)));
    }
  }
  if (opened.ok()) opened = open_output(options.stderr_file, &err_fd);
  int exec_error[2] = {-1, -1};
  if (opened.ok() && pipe2(exec_error, O_CLOEXEC) != 0) {
    opened = absl::UnavailableError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  auto close_all = [&] {
    CloseIfOpen(in_fd);
    CloseIfOpen(out_fd);
    CloseIfOpen(err_fd);
    CloseIfOpen(exec_error[0]);
    CloseIfOpen(exec_error[1]);
  };
  if (!opened.ok()) {
    close_all();
    return opened;
  }

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close_all();
    return absl::UnavailableError(absl::StrCat("fork: ", strerror(error)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
    if (getppid() != parent) _exit(126);  // the parent died before prctl took effect
    if (in_fd >= 0) dup2(in_fd, 0);  // dup2's copy is not close-on-exec
    if (out_fd >= 0) dup2(out_fd, 1);
    if (err_fd >= 0) dup2(err_fd, 2);
    // The parent may ignore SIGPIPE or block signals (a runner waiting for Ctrl-C); the child
    // starts clean.
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), envp.data());
    const int error = errno;
    [[maybe_unused]] ssize_t n = write(exec_error[1], &error, sizeof(error));
    _exit(127);
  }
  CloseIfOpen(exec_error[1]);
  CloseIfOpen(in_fd);
  CloseIfOpen(out_fd);
  CloseIfOpen(err_fd);
  // Nothing to read: execve succeeded (the pipe closed on exec). An errno: it failed.
  int error = 0;
  ssize_t n;
  do {
    n = read(exec_error[0], &error, sizeof(error));
  } while (n < 0 && errno == EINTR);
  CloseIfOpen(exec_error[0]);
  Child child(pid);
  if (n == sizeof(error)) {
    child.Wait();
    const std::string message = absl::StrCat("cannot execute ", binary, ": ", strerror(error));
    if (error == ENOENT) return absl::NotFoundError(message);
    if (error == EACCES || error == EPERM) return absl::PermissionDeniedError(message);
    return absl::UnavailableError(message);
  }
  // A descriptor that becomes readable when the child exits, for Wait(); without one (a kernel
  // before 5.3, or no descriptor left) Wait() falls back to polling.
  // (The raw syscall: glibc 2.36's <sys/pidfd.h> declares pidfd_open without C linkage.)
  child.pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  return child;
}

void Child::Signal(int signal) const {
  if (running()) kill(pid_, signal);
}

bool Child::stopped() const {
  if (!running()) return false;
  std::ifstream in(absl::StrCat("/proc/", pid_, "/stat"));
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The state follows the command name, which is in parentheses and may contain anything.
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
}

bool Child::Reap(bool block) {
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  status_ = r == pid_ ? status : -1;  // -1: not our child any more; nothing to wait for
  CloseIfOpen(pidfd_);
  return true;
}

std::optional<int> Child::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return std::nullopt;
  if (status_.has_value()) return status_;
  if (timeout == absl::InfiniteDuration()) {
    Reap(/*block=*/true);
    return status_;
  }
  const auto deadline = DeadlineAfter(timeout);
  if (pidfd_ >= 0) {
    // The pidfd turns readable when the child exits: sleep in poll() until then or the deadline.
    for (;;) {
      if (Reap(/*block=*/false)) return status_;
      pollfd p{pidfd_, POLLIN, 0};
      const int ready = poll(&p, 1, PollTimeout(deadline));
      if (ready == 0) return Reap(/*block=*/false) ? status_ : std::nullopt;
      if (ready < 0 && errno != EINTR) break;  // fall back to polling below
    }
  }
  for (auto pause = std::chrono::microseconds(200);; pause = std::min(pause * 2, std::chrono::microseconds(20000))) {
    if (Reap(/*block=*/false)) return status_;
    if (SteadyClock::now() >= *deadline) return std::nullopt;
    std::this_thread::sleep_for(pause);
  }
}

int Child::Stop(absl::Duration grace) {
  if (!running()) return status_.value_or(-1);
  kill(pid_, SIGCONT);  // a stopped child cannot act on SIGTERM
  kill(pid_, SIGTERM);
  if (auto s = Wait(grace)) return *s;
  kill(pid_, SIGKILL);
  return *Wait();
}

namespace {

// Binds 127.0.0.1:`port` (0: any) and closes it again; the port bound, or the errno.
absl::StatusOr<int> TryLoopbackPort(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int error = errno;
  ::close(fd);
  if (!ok) return absl::UnavailableError(absl::StrCat("no free loopback port: ", strerror(error)));
  return static_cast<int>(ntohs(addr.sin_port));
}

// The ports below the kernel's ephemeral range that are worth trying: [10000, low).
std::pair<int, int> PortsBelowEphemeral() {
  int low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int from = 0;
  if (range >> from && from > 0) low = from;
  return {10000, low};
}

}  // namespace

absl::StatusOr<int> FreeLoopbackPort() {
  const auto [first, end] = PortsBelowEphemeral();
  if (end - first >= 1000) {
    // Processes picking at once (tests run side by side) rarely draw the same port.
    static std::atomic<uint64_t> draws{0};
    const auto ticks = std::chrono::steady_clock::now().time_since_epoch().count();
    uint64_t x = static_cast<uint64_t>(getpid()) * 0x9E3779B97F4A7C15ull ^
                 static_cast<uint64_t>(ticks) ^ (draws.fetch_add(1) * 0xBF58476D1CE4E5B9ull);
    for (int attempt = 0; attempt < 64; ++attempt) {
      x ^= x >> 31;
      x *= 0x94D049BB133111EBull;
      x ^= x >> 29;
      auto port = TryLoopbackPort(first + static_cast<int>(x % static_cast<uint64_t>(end - first)));
      if (port.ok()) return port;
    }
  }
  return TryLoopbackPort(0);
}

absl::Status WritePortFile(const std::string& path, int port) {
  if (path.empty()) return absl::OkStatus();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> AwaitPortFile(const std::string& path, Child& child, absl::Duration timeout) {
  const auto give_up = DeadlineAfter(timeout);
  while (!give_up.has_value() || SteadyClock::now() < *give_up) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    // Look again in 5 ms, or at once if the child exits first.
    if (auto status = child.Wait(absl::Milliseconds(5))) {
      return absl::UnavailableError(absl::StrCat("pid ", child.pid(), " ", DescribeStatus(*status),
                                                 " before writing ", path));
    }
  }
  return absl::DeadlineExceededError(
      absl::StrCat("pid ", child.pid(), " wrote no port to ", path, " within ",
                   absl::FormatDuration(timeout)));
}

absl::Status RunToSuccess(const std::string& binary, const std::vector<std::string>& args,
                          const SpawnOptions& options, absl::Duration timeout) {
  auto child = Child::Spawn(binary, args, options);
  if (!child.ok()) return child.status();
  std::string command = binary;
  for (const std::string& arg : args) absl::StrAppend(&command, " ", arg);
  const std::string output =
      options.stderr_file.empty() ? "" : absl::StrCat("; see ", options.stderr_file);
  std::optional<int> status = child->Wait(timeout);
  if (!status.has_value()) {
    child->Stop();
    return absl::InternalError(absl::StrCat(command, " did not end within ",
                                            absl::FormatDuration(timeout), output));
  }
  if (*status == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(command, " ", DescribeStatus(*status), output));
}

std::string DescribeStatus(int wait_status) {
  if (wait_status < 0) return "lost (not a child)";
  if (WIFEXITED(wait_status)) return absl::StrCat("exited ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const char* name = sigabbrev_np(WTERMSIG(wait_status));
    if (name != nullptr) return absl::StrCat("killed by SIG", name);
    return absl::StrCat("killed by signal ", WTERMSIG(wait_status));
  }
  return absl::StrCat("wait status ", wait_status);
}

}  // namespace fencelock::process
