#include "common.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fencelock::bench {

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

Percentiles Summarize(std::vector<int64_t> ns) {
  Percentiles p;
  p.samples = ns.size();
  if (ns.empty()) return p;
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    const size_t i =
        std::min(ns.size() - 1, static_cast<size_t>(q * static_cast<double>(ns.size())));
    return static_cast<double>(ns[i]) / 1e6;
  };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p99 = at(0.99);
  p.p999 = at(0.999);
  p.max = static_cast<double>(ns.back()) / 1e6;
  return p;
}

Json ToJson(const Percentiles& p) {
  return {{"samples", p.samples}, {"p50_ms", p.p50},   {"p90_ms", p.p90},
          {"p99_ms", p.p99},      {"p999_ms", p.p999}, {"max_ms", p.max}};
}

std::string Ms(double ms) { return absl::StrFormat("%.3f", ms); }

namespace {
const bool kTerminal = isatty(STDERR_FILENO) == 1;
bool g_open_line = false;
}  // namespace

void Progress(const std::string& line, double elapsed_seconds) {
  if (kTerminal) {
    std::fprintf(stderr, "\r%-100s", line.c_str());
    g_open_line = true;
  } else if (static_cast<int>(elapsed_seconds + 0.5) % 5 == 0) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void EndProgress() {
  if (g_open_line) std::fprintf(stderr, "\n");
  g_open_line = false;
}

namespace {

void Report(const CycleResult& r, const std::string& label) {
  const Percentiles p = Summarize(r.acquire_ns);
  std::fprintf(stderr, "  %-58s %9.0f cycles/s  acquire p50 %.3f ms  p99 %.3f ms%s%s\n",
               label.c_str(), r.cycles_per_second, p.p50, p.p99, r.errors > 0 ? "  ERROR " : "",
               r.first_error.c_str());
}

}  // namespace

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

CycleResult RunCycles(const CyclerFactory& make, int clients, double seconds,
                      const std::string& label) {
  std::atomic<bool> go{false}, stop{false};
  std::atomic<uint64_t> cycles{0};
  std::atomic<size_t> errors{0}, ready{0};
  std::mutex mu;
  CycleResult r;
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::vector<int64_t> mine;
      auto cycler = make(c);
      auto fail = [&](const absl::Status& s) {
        ++errors;
        std::lock_guard<std::mutex> guard(mu);
        if (r.first_error.empty()) r.first_error = s.ToString();
      };
      if (!cycler.ok()) fail(cycler.status());
      ++ready;
      while (!go.load()) std::this_thread::yield();
      while (!stop.load() && cycler.ok()) {
        auto took = (*cycler)->Cycle();
        if (!took.ok()) {
          fail(took.status());
          break;
        }
        mine.push_back(*took);
        ++cycles;
      }
      std::lock_guard<std::mutex> guard(mu);
      r.acquire_ns.insert(r.acquire_ns.end(), mine.begin(), mine.end());
    });
  }
  while (ready.load() < static_cast<size_t>(clients)) absl::SleepFor(absl::Milliseconds(5));
  const double cpu_start = ProcessCpuSeconds();
  const MonoTime start = Now();
  const MonoTime end = start + absl::Seconds(seconds);
  go = true;
  uint64_t last = 0;
  for (MonoTime t = Now(); t < end; t = Now()) {
    const absl::Duration step = std::min(absl::Seconds(1), end - t);
    absl::SleepFor(step);
    const uint64_t now = cycles.load();
    Progress(absl::StrFormat("  %-58s %5.1fs  %9.0f cycles/s", label,
                             absl::ToDoubleSeconds(Now() - start),
                             static_cast<double>(now - last) / absl::ToDoubleSeconds(step)),
             absl::ToDoubleSeconds(Now() - start));
    last = now;
  }
  const uint64_t counted = cycles.load();
  const double elapsed = absl::ToDoubleSeconds(Now() - start);
  r.process_cpu_seconds = ProcessCpuSeconds() - cpu_start;
  stop = true;
  for (std::thread& t : threads) t.join();
  EndProgress();
  r.cycles_per_second = static_cast<double>(counted) / elapsed;
  r.errors = errors;
  Report(r, label);
  return r;
}

CycleResult RunStreamCycles(const StreamCyclerFactory& make, int clients, double seconds,
                            const std::string& label) {
  CycleResult r;
  auto fail = [&r](const absl::Status& s) {
    ++r.errors;
    if (r.first_error.empty()) r.first_error = s.ToString();
  };
  struct Conn {
    std::unique_ptr<StreamCycler> cycler;
    std::string out;  // what the socket did not take yet
    bool waits_for_room = false;  // watched for EPOLLOUT
    bool done = false;
  };
  std::vector<Conn> conns;
  for (int c = 0; c < clients; ++c) {
    auto cycler = make(c);
    if (!cycler.ok()) {
      fail(cycler.status());
      continue;
    }
    conns.push_back({.cycler = std::move(*cycler)});
  }
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    fail(absl::ErrnoToStatus(errno, "epoll_create1"));
    Report(r, label);
    return r;
  }
  auto watch = [ep](int fd, uint32_t index, bool writable, int op) {
    epoll_event e{.events = EPOLLIN | (writable ? EPOLLOUT : 0u), .data = {.u32 = index}};
    return epoll_ctl(ep, op, fd, &e) == 0;
  };
  size_t live = 0;
  for (uint32_t i = 0; i < conns.size(); ++i) {
    const int fd = conns[i].cycler->fd();
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0 ||
        !watch(fd, i, false, EPOLL_CTL_ADD)) {
      fail(absl::ErrnoToStatus(errno, "cannot watch a connection"));
      conns[i].done = true;
      continue;
    }
    ++live;
  }
  // Sends what `c` has to send; false (and the connection ended) on an error.
  auto flush = [&](Conn& c, uint32_t index) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.cycler->fd(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) {
        fail(absl::ErrnoToStatus(errno, "send"));
        return false;
      }
      c.out.erase(0, static_cast<size_t>(n));
    }
    // Wait for room only while something is left.
    if (c.waits_for_room != !c.out.empty()) {
      c.waits_for_room = !c.out.empty();
      watch(c.cycler->fd(), index, c.waits_for_room, EPOLL_CTL_MOD);
    }
    return true;
  };
  auto end_conn = [&](Conn& c) {
    if (c.done) return;
    c.done = true;
    --live;
    epoll_ctl(ep, EPOLL_CTL_DEL, c.cycler->fd(), nullptr);
  };
  const MonoTime start = Now();
  const MonoTime end = start + absl::Seconds(seconds);
  // Past the end, what is in flight gets this long to come back (each gives back its lock).
  const MonoTime give_up = end + absl::Seconds(10);
  for (uint32_t i = 0; i < conns.size(); ++i) {
    if (conns[i].done) continue;
    conns[i].cycler->Begin(&conns[i].out);
    if (!flush(conns[i], i)) end_conn(conns[i]);
  }
  std::vector<int64_t> acquire_ns;
  uint64_t counted = 0, last = 0;
  bool stop = false;
  double elapsed = seconds;
  MonoTime next_progress = start + absl::Seconds(1);
  std::vector<epoll_event> events(conns.size() + 1);
  std::string chunk(64 * 1024, '\0');
  while (live > 0) {
    const MonoTime now = Now();
    if (!stop && now >= end) {
      stop = true;
      counted = acquire_ns.size();
      elapsed = absl::ToDoubleSeconds(now - start);
    }
    if (stop && now >= give_up) {
      fail(absl::DeadlineExceededError(absl::StrCat(
          live, " connections still had requests in flight 10 s after the run ended")));
      break;
    }
    if (!stop && now >= next_progress) {
      Progress(absl::StrFormat("  %-58s %5.1fs  %9.0f cycles/s", label,
                               absl::ToDoubleSeconds(now - start),
                               static_cast<double>(acquire_ns.size() - last)),
               absl::ToDoubleSeconds(now - start));
      last = acquire_ns.size();
      next_progress = next_progress + absl::Seconds(1);
    }
    const int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 50);
    if (n < 0 && errno != EINTR) {
      fail(absl::ErrnoToStatus(errno, "epoll_wait"));
      break;
    }
    for (int e = 0; e < n; ++e) {
      const uint32_t index = events[e].data.u32;
      Conn& c = conns[index];
      if (c.done) continue;
      if ((events[e].events & EPOLLOUT) != 0 && !flush(c, index)) {
        end_conn(c);
        continue;
      }
      if ((events[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) == 0) continue;
      const ssize_t got = ::recv(c.cycler->fd(), chunk.data(), chunk.size(), 0);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (got <= 0) {
        fail(got == 0 ? absl::UnavailableError("the server closed the connection")
                      : absl::ErrnoToStatus(errno, "recv"));
        end_conn(c);
        continue;
      }
      auto idle = c.cycler->Feed(std::string_view(chunk.data(), static_cast<size_t>(got)), stop,
                                 &c.out, &acquire_ns);
      if (!idle.ok()) {
        fail(idle.status());
        end_conn(c);
      } else if (!flush(c, index)) {
        end_conn(c);
      } else if (*idle) {
        end_conn(c);
      }
    }
  }
  ::close(ep);
  EndProgress();
  if (!stop) {  // every connection failed before the end
    counted = acquire_ns.size();
    elapsed = absl::ToDoubleSeconds(Now() - start);
  }
  acquire_ns.resize(counted);
  r.acquire_ns = std::move(acquire_ns);
  r.cycles_per_second = static_cast<double>(counted) / std::max(elapsed, 1e-9);
  Report(r, label);
  return r;
}

}  // namespace fencelock::bench
