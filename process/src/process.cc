#include "process/process.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace fencelock::process {

Child::Child(Child&& other) noexcept : pid_(other.pid_), status_(other.status_) {
  other.pid_ = -1;
  other.status_.reset();
}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    if (running()) Stop();
    pid_ = other.pid_;
    status_ = other.status_;
    other.pid_ = -1;
    other.status_.reset();
  }
  return *this;
}

Child::~Child() {
  if (running()) Stop();
}

absl::StatusOr<Child> Child::Spawn(const std::string& binary,
                                   const std::vector<std::string>& args,
                                   const SpawnOptions& options) {
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The child's environment, built before fork: the parent's, with options.environment.
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
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
    if (getppid() != parent) _exit(126);  // the parent died before prctl took effect
    auto redirect = [](const std::string& path, int target) {
      if (path.empty()) return;
      const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (fd < 0) {
        std::fprintf(stderr, "cannot open %s: %s\n", path.c_str(), strerror(errno));
        _exit(127);
      }
      dup2(fd, target);
      close(fd);
    };
    redirect(options.stdout_file, 1);
    redirect(options.stderr_file, 2);
    // The parent may block signals (a runner waiting for Ctrl-C); the child starts clean.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(argv[0], argv.data(), envp.data());
    std::fprintf(stderr, "cannot execute %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  return Child(pid);
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

std::optional<int> Child::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return std::nullopt;
  if (status_.has_value()) return status_;
  const absl::Time give_up = absl::Now() + timeout;
  for (absl::Duration pause = absl::Microseconds(200);; pause = std::min(pause * 2, absl::Milliseconds(20))) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, timeout == absl::InfiniteDuration() ? 0 : WNOHANG);
    if (r == pid_) {
      status_ = status;
      return status_;
    }
    if (r < 0 && errno != EINTR) {
      status_ = -1;  // not our child any more; nothing to wait for
      return status_;
    }
    if (absl::Now() >= give_up) return std::nullopt;
    if (r == 0) absl::SleepFor(pause);
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
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (auto status = child.Wait(absl::ZeroDuration())) {
      return absl::UnavailableError(absl::StrCat("pid ", child.pid(), " ", DescribeStatus(*status),
                                                 " before writing ", path));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("pid ", child.pid(), " wrote no port to ", path, " within ",
                   absl::FormatDuration(timeout)));
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
