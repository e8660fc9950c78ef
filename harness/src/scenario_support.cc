#include "scenario_support.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "process/process.h"

namespace fencelock::harness {

using payout::Cluster;
using payout::ClusterOptions;

namespace {
constexpr absl::Duration kRailReadTimeout = absl::Milliseconds(300);
}  // namespace

std::string Secs(absl::Duration d) { return absl::StrFormat("%.2f s", absl::ToDoubleSeconds(d)); }
absl::Duration Since(int64_t ns) { return absl::Nanoseconds(history::NowNanos() - ns); }

absl::StatusOr<std::unique_ptr<Cluster>> StartCluster(
    Env& env, int64_t payouts, std::vector<std::string> worker_environment, absl::Duration ttl,
    const std::function<void(ClusterOptions&)>& adjust) {
  ClusterOptions options{.dir = env.dir,
                         .lockd_binary = env.binaries.lockd,
                         .rail_binary = env.binaries.rail,
                         .worker_binary = env.binaries.worker,
                         .rail_latency = absl::Milliseconds(10),
                         .rail_jitter = absl::Milliseconds(10),
                         .rail_read_timeout = kRailReadTimeout,
                         .rail_seed = env.seed,
                         .session_ttl = ttl,
                         .lock_ttl = ttl,
                         .margin = kMargin,
                         .history = true,
                         .worker_environment = std::move(worker_environment),
                         .tls_dir = env.tls_dir};
  if (adjust) adjust(options);
  auto cluster = Cluster::Start(std::move(options));
  if (!cluster.ok()) return cluster.status();
  if (payouts == 0) return cluster;
  if (absl::Status s = (*cluster)->Load(payouts, 1000); !s.ok()) return s;
  return cluster;
}

absl::Status StartWorkers(Cluster& c, const std::string& via) {
  for (const char* name : {"w1", "w2", "w3"}) {
    if (auto w = c.StartWorker(name, {}, via); !w.ok()) return w.status();
  }
  return absl::OkStatus();
}

int64_t BusyPayouts(const Env& env) { return env.quick ? 30 : 80; }

absl::StatusOr<std::unique_ptr<Cluster>> StartPaying(Env& env, int64_t payouts,
                                                      absl::Duration ttl) {
  auto cluster = StartCluster(env, payouts, {}, ttl);
  if (!cluster.ok()) return cluster;
  if (absl::Status s = StartWorkers(**cluster); !s.ok()) return s;
  return cluster;
}

void History::Poll() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string path = entry.path().string();
    if (tails_.count(path) == 0) tails_.emplace(path, payout::LineTail(path));
  }
  for (auto& [path, tail] : tails_) {
    for (const std::string& line : tail.Poll()) {
      if (auto r = history::Parse(line); r.ok()) {
        ++counts_[r->event];
        records_.push_back(std::move(*r));
      }
    }
  }
}

std::optional<history::Record> History::Find(
    const std::function<bool(const history::Record&)>& match) {
  Poll();
  for (const auto& r : records_) {
    if (match(r)) return r;
  }
  return std::nullopt;
}

int64_t History::Count(const std::string& event) {
  Poll();
  auto it = counts_.find(event);
  return it == counts_.end() ? 0 : it->second;
}

absl::Status WaitUntil(const std::function<bool()>& done, absl::Duration timeout,
                       const std::string& what) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("gave up after ", absl::FormatDuration(timeout), " waiting for ", what));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::OkStatus();
}

absl::Status AwaitPaid(History& h, int64_t count) {
  return WaitUntil([&] { return h.Count("paid") >= count; }, absl::Seconds(60),
                   absl::StrCat(count, " payouts to be paid"));
}

absl::Status AwaitSessions(Cluster& c) {
  std::map<std::string, payout::LineTail> waiting;  // worker → its log, read as it grows
  for (const std::string& name : c.worker_names()) {
    waiting.emplace(name, payout::LineTail(c.Path("logs/" + name + ".log")));
  }
  return WaitUntil(
      [&] {
        for (auto it = waiting.begin(); it != waiting.end();) {
          bool started = false;
          for (const std::string& line : it->second.Poll()) {
            started = started || line.starts_with(it->first + " started session");
          }
          it = started ? waiting.erase(it) : std::next(it);
        }
        return waiting.empty();
      },
      absl::Seconds(60), "every worker to open its lockd session");
}

absl::Status WaitWorkers(Cluster& cluster, Outcome& out, absl::Duration timeout,
                         const std::set<std::string>& killed) {
  const absl::Time give_up = absl::Now() + timeout;
  for (const std::string& name : cluster.worker_names()) {
    if (killed.count(name) > 0) continue;
    auto status = cluster.worker(name)->Wait(std::max(give_up - absl::Now(), absl::ZeroDuration()));
    if (!status.has_value()) {
      return absl::DeadlineExceededError(absl::StrCat(
          name, " still running after ", absl::FormatDuration(timeout), ": payouts left unpaid?"));
    }
    out.Expect(*status == 0, absl::StrCat(name, " ", process::DescribeStatus(*status), "; see ",
                                          cluster.Path("logs/" + name + ".log")));
  }
  return absl::OkStatus();
}


absl::Status Finish(Cluster& cluster, Outcome& out, const Expectations& expect) {
  auto r = cluster.Reconcile();
  if (!r.ok()) return r.status();
  auto check = CheckDirectory(cluster.Path("history"));
  if (!check.ok()) return check.status();
  out.check = *check;
  int64_t abandoned = 0;
  for (const auto& [reason, n] : r->abandoned) abandoned += n;
  out.Figure("payouts", absl::StrCat(r->payouts));
  out.Figure("paid exactly once", absl::StrCat(r->paid_once));
  out.Figure("lock_fenced_out_total", absl::StrCat(r->lock_fenced_out));
  out.Figure("rail_duplicate_attempted_total", absl::StrCat(r->rail_duplicates));
  out.Figure("rail_fenced_out_total", absl::StrCat(r->rail_fenced_out));
  out.Figure("abandoned", absl::StrCat(abandoned));
  out.Figure("history", absl::StrCat(check->records, " records, ", check->grants, " grants, ",
                                     check->fence_decisions, " fence decisions, ",
                                     check->lockd_acts > 0
                                         ? absl::StrCat(check->lockd_acts, " lockd acts, ")
                                         : std::string(),
                                     check->violations.size(), " violations, ",
                                     check->client_overlaps.size(), " client overlaps"));
  out.Expect(r->paid_twice == 0, absl::StrCat(r->paid_twice, " payouts paid twice"));
  out.Expect(expect.max_abandoned < 0 || abandoned <= expect.max_abandoned,
             absl::StrCat(abandoned, " payouts abandoned; at most ", expect.max_abandoned,
                          " were expected"));
  out.Expect(r->left == 0 && r->paid_once == r->payouts,
             absl::StrCat(r->left, " payouts left unpaid"));
  out.Expect(r->rail_duplicates == 0,
             absl::StrCat("rail_duplicate_attempted_total is ", r->rail_duplicates));
  for (const std::string& v : check->violations) out.failures.push_back("history: " + v);
  if (expect.fences_quiet) {
    out.Expect(r->lock_fenced_out == 0,
               absl::StrCat("lock_fenced_out_total is ", r->lock_fenced_out, "; see ",
                            cluster.Path("logs/lockd.log")));
    out.Expect(r->rail_fenced_out == 0,
               absl::StrCat("rail_fenced_out_total is ", r->rail_fenced_out));
  }
  if (expect.expect_overlap) {
    out.Expect(!check->client_overlaps.empty(),
               "no client-believed overlap although the client check was off");
  } else {
    for (const std::string& o : check->client_overlaps) {
      out.failures.push_back("client-believed overlap with the client check on: " + o);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FaketimeEnvironment(const std::string& offset_file) {
  const std::string libfaketime = LIBFAKETIME;
  if (libfaketime.empty() || !std::filesystem::exists(libfaketime)) {
    return absl::FailedPreconditionError(
        "libfaketime not found: install the Debian package faketime (scripts/test.sh does)");
  }
  SetWallClockOffset(offset_file, "+0");
  std::vector<std::string> environment = {
      "LD_PRELOAD=" + libfaketime, "FAKETIME_TIMESTAMP_FILE=" + offset_file,
      "FAKETIME_CACHE_DURATION=1", "FAKETIME_DONT_FAKE_MONOTONIC=1"};
  // In an AddressSanitizer build the preloaded library comes before ASan's runtime, which ASan
  // refuses unless told that the order is on purpose.
  const char* asan = std::getenv("ASAN_OPTIONS");
  environment.push_back(absl::StrCat("ASAN_OPTIONS=", asan != nullptr ? asan : "",
                                     asan != nullptr && *asan != '\0' ? ":" : "",
                                     "verify_asan_link_order=0"));
  return environment;
}

void SetWallClockOffset(const std::string& offset_file, const std::string& offset) {
  std::ofstream(offset_file, std::ios::trunc) << offset << "\n";
}

}  // namespace fencelock::harness
