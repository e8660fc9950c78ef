// A profile manager in C++ (seed ADR-0003's lease lifecycle, on PoolManager): it runs --jobs
// jobs, at most one per slot of its --slots, each as a worker process admitted by the pool. It
// may be killed at any moment and started again on the same --state-dir: the new manager claims
// the profile, keeps the leases of workers that still run and waits for them, frees exactly
// those whose workers are gone, and runs each job that never started. No job starts twice.
//
//   fencelock-pool-manager-demo --server=unix:/run/fencelock/lockd.sock --pool=hosts
//       --profile=build --slots=4 --jobs=20 --state-dir=/var/lib/build-manager
//       --command='make -C "/src/job-$JOB"'
//
// A worker is created before it starts, like a container in Docker's created state: a child
// process that waits on a pipe. The manager records it (slot, token, pid, the pid's start time)
// in --state-dir, activates the lease, and only then tells it to start. A manager that dies
// before that closes the pipe, and the created worker exits without running. The started
// worker runs `/bin/sh -c COMMAND` with JOB set, and records its exit status itself, so a
// restarted manager learns how an adopted worker ended. In --state-dir: `slot-S` (the worker of
// slot S), `started-J` (job J started: created exclusively, so a job never starts twice), and
// `exit-J` (its status).
//
// Prints one line per event; exits 0 once every job has run (whatever their status), 1 on a
// manager failure (another manager claimed the profile, lockd refused).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "lock-client/pool_manager.h"
#include "process/flags.h"

ABSL_FLAG(std::string, server, "unix:/run/fencelock/lockd.sock",
          "lockd's address; pools are served on its Unix socket");
ABSL_FLAG(std::string, pool, "", "the pool (required)");
ABSL_FLAG(std::string, profile, "", "the profile this manager runs (required)");
ABSL_FLAG(int, slots, 2, "how many workers may run at once, one per slot: s0, s1, ...");
ABSL_FLAG(int, jobs, 4, "how many jobs to run: 0 .. jobs-1");
ABSL_FLAG(std::string, state_dir, "", "the manager's own state (required; created if absent)");
ABSL_FLAG(std::string, command, "sleep 1", "each job's command, for /bin/sh -c, with JOB set");

namespace {

using fencelock::PoolAdmission;
using fencelock::PoolLeaseView;
using fencelock::PoolManager;
using fencelock::PoolWorkerState;

std::string g_dir;
std::mutex g_out;

// printf's `format` and arguments, as one line (the compiler checks them as printf's).
__attribute__((format(printf, 1, 2))) void Say(const char* format, ...) {
  std::lock_guard<std::mutex> lock(g_out);
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  std::printf("\n");
  std::fflush(stdout);
}

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  Say("manager: %s: %s", what.c_str(), s.ToString().c_str());
  std::fflush(nullptr);
  std::_Exit(1);
}

std::string Path(const std::string& name) { return g_dir + "/" + name; }
bool Exists(const std::string& name) { return ::access(Path(name).c_str(), F_OK) == 0; }

// Writes `name` whole or not at all (a new file renamed over the old, both synced).
void WriteFile(const std::string& name, const std::string& text) {
  const std::string tmp = Path(name + ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), Path(name).c_str()) != 0) {
    Die("writing " + Path(name), absl::InternalError(std::strerror(errno)));
  }
  const int dir = ::open(g_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

// The start time of process `pid` (field 22 of /proc/PID/stat), which tells it apart from a
// later process that reuses the pid; empty if there is no such process.
std::string StartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3 && field == "Z") return "";  // a zombie has finished
  }
  return field;
}

// A worker this manager (or its predecessor) created: what `slot-S` records.
struct Worker {
  int job = -1;
  uint64_t token = 0;
  pid_t pid = 0;
  std::string start_time;

  static Worker Read(const std::string& slot) {
    Worker w;
    std::ifstream in(Path("slot-" + slot));
    if (!(in >> w.job >> w.token >> w.pid >> w.start_time)) return Worker{};
    return w;
  }
  bool Alive() const { return pid > 0 && StartTime(pid) == start_time; }
};

std::mutex g_jobs_mu;
int g_next_job = 0;

// The next job that never started, or -1.
int NextJob(int jobs) {
  std::lock_guard<std::mutex> lock(g_jobs_mu);
  while (g_next_job < jobs && Exists("started-" + std::to_string(g_next_job))) ++g_next_job;
  return g_next_job < jobs ? g_next_job++ : -1;
}

// Creates job `job`'s worker: a child that waits for one byte on the returned pipe, then claims
// the job (started-J, exclusively) and runs the command. EOF instead: it exits, never started.
pid_t Create(int job, int* go) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) Die("pipe", absl::InternalError(std::strerror(errno)));
  // Everything the child needs is made before fork(): after it, only system calls.
  const std::string started = Path("started-" + std::to_string(job));
  const std::string exit_file = Path("exit-" + std::to_string(job));
  // The shell records the command's status under the job's name when it ends.
  const std::string script =
      absl::StrCat("(", absl::GetFlag(FLAGS_command), "); s=$?; echo $s > '", exit_file,
                   ".tmp' && mv '", exit_file, ".tmp' '", exit_file, "'; exit $s");
  std::vector<std::string> env_text{"JOB=" + std::to_string(job)};
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "JOB=", 4) != 0) env_text.emplace_back(*e);
  }
  std::vector<char*> env;
  for (std::string& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);
  const char* argv[] = {"sh", "-c", script.c_str(), nullptr};
  const pid_t pid = ::fork();
  if (pid < 0) Die("fork", absl::InternalError(std::strerror(errno)));
  if (pid == 0) {
    ::close(fds[1]);
    ::setpgid(0, 0);  // signals to the manager's process group do not reach it
    char byte;
    if (::read(fds[0], &byte, 1) != 1) ::_exit(0);  // the manager went away: never started
    const int fd = ::open(started.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) ::_exit(97);  // started once already: never twice
    ::fsync(fd);
    ::close(fd);
    ::execve("/bin/sh", const_cast<char* const*>(argv), env.data());
    ::_exit(127);
  }
  ::close(fds[0]);
  *go = fds[1];
  return pid;
}

// Waits until a worker that is not this process's child has gone.
void AwaitGone(const Worker& w) {
  while (w.Alive()) absl::SleepFor(absl::Milliseconds(50));
}

std::string Outcome(int job) {
  std::ifstream in(Path("exit-" + std::to_string(job)));
  std::string status;
  return in >> status ? "exit " + status : std::string("ended without a status (killed)");
}

// One slot's loop: first the adopted worker, if any; then one job after another.
// A slot beyond --slots (a predecessor had more) only waits for its adopted worker: jobs 0.
void RunSlot(PoolManager& m, const std::string& slot, int jobs, bool adopted) {
  if (adopted) {
    const Worker w = Worker::Read(slot);
    AwaitGone(w);
    Say("slot %s: adopted job %d ended: %s", slot.c_str(), w.job, Outcome(w.job).c_str());
    if (absl::Status s = m.release(PoolAdmission{slot, w.token, true}); !s.ok()) {
      Die("release " + slot, s);
    }
    ::unlink(Path("slot-" + slot).c_str());
  }
  for (int job = NextJob(jobs); job >= 0; job = NextJob(jobs)) {
    auto lease = m.acquire(slot, absl::Hours(1));
    if (!lease.ok()) Die("acquire " + slot, lease.status());
    int go = -1;
    const pid_t pid = Create(job, &go);
    WriteFile("slot-" + slot, absl::StrCat(job, " ", lease->token, " ", pid, " ",
                                           StartTime(pid), "\n"));
    if (absl::Status s = m.activate(*lease); !s.ok()) {
      ::close(go);  // the created worker exits unstarted
      Die("activate " + slot, s);
    }
    Say("slot %s: job %d starts (token %llu, active)", slot.c_str(), job,
        static_cast<unsigned long long>(lease->token));
    if (::write(go, "g", 1) != 1) Die("start", absl::InternalError(std::strerror(errno)));
    ::close(go);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    Say("slot %s: job %d ended: %s", slot.c_str(), job, Outcome(job).c_str());
    if (absl::Status s = m.release(*lease); !s.ok()) Die("release " + slot, s);
    ::unlink(Path("slot-" + slot).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  fencelock::process::ParseFlags(argc, argv);
  g_dir = absl::GetFlag(FLAGS_state_dir);
  const int slots = absl::GetFlag(FLAGS_slots);
  const int jobs = absl::GetFlag(FLAGS_jobs);
  if (g_dir.empty() || absl::GetFlag(FLAGS_pool).empty() ||
      absl::GetFlag(FLAGS_profile).empty()) {
    std::fprintf(stderr, "manager: --pool, --profile and --state-dir are required\n");
    return 2;
  }
  if (g_dir.find('\'') != std::string::npos) {
    // The worker's shell records its status under --state-dir, single-quoted.
    std::fprintf(stderr, "manager: --state-dir may not contain a single quote\n");
    return 2;
  }
  if (slots < 1 || slots > 1024 || jobs < 0 || jobs > 1'000'000) {
    std::fprintf(stderr, "manager: --slots must be 1 to 1024 and --jobs 0 to 1000000\n");
    return 2;
  }
  if (::mkdir(g_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "manager: cannot create %s: %s\n", g_dir.c_str(), std::strerror(errno));
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);

  fencelock::PoolManagerOptions options;
  options.client.server = absl::GetFlag(FLAGS_server);
  options.client.client_name = "pool-manager-demo";
  options.pool = absl::GetFlag(FLAGS_pool);
  options.profile = absl::GetFlag(FLAGS_profile);
  // What a predecessor left: the worker recorded for the lease's slot, if it is that lease's
  // and its process still runs.
  options.reconcile = [](const PoolLeaseView& lease) {
    const Worker w = Worker::Read(lease.slot);
    if (w.token != lease.token || !w.Alive()) return PoolWorkerState::kAbsent;
    return PoolWorkerState::kRunning;
  };
  auto manager = PoolManager::Start(options);
  if (!manager.ok()) Die("start", manager.status());
  PoolManager& m = **manager;
  Say("manager: %s/%s claimed, owner %s; %zu leases kept, %zu released", options.pool.c_str(),
      options.profile.c_str(), m.owner().ToString().c_str(), m.reconciliation().kept.size(),
      m.reconciliation().released.size());
  for (const PoolAdmission& a : m.reconciliation().released) {
    const Worker w = Worker::Read(a.slot);
    if (w.token == a.token) {
      Say("slot %s: job %d's worker is gone (%s); lease %llu released", a.slot.c_str(), w.job,
          Exists("started-" + std::to_string(w.job)) ? Outcome(w.job).c_str() : "never started",
          static_cast<unsigned long long>(a.token));
      ::unlink(Path("slot-" + a.slot).c_str());
    }
  }

  std::set<std::string> adopted;
  for (const PoolAdmission& a : m.reconciliation().kept) adopted.insert(a.slot);
  std::vector<std::thread> threads;
  for (int i = 0; i < slots; ++i) {
    const std::string slot = "s" + std::to_string(i);
    const bool kept = adopted.erase(slot) > 0;
    threads.emplace_back([&m, slot, jobs, kept] { RunSlot(m, slot, jobs, kept); });
  }
  for (const std::string& slot : adopted) {
    threads.emplace_back([&m, slot] { RunSlot(m, slot, 0, true); });
  }
  for (std::thread& t : threads) t.join();
  Say("manager: every job has run");
  return 0;
}
