// The replicated scenarios' shared parts (replicated.h): the cluster's shape, the long holders
// and the prober, and the lookups in the history that judge a failover.
#include "replicated.h"

#include <algorithm>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lock-client/client.h"

namespace fencelock::harness::replicated {

void Replicas(const Env& env, absl::Duration owner_ttl, payout::ClusterOptions& o) {
  o.etcd_members = 3;
  o.etcd_binary = env.binaries.etcd;
  o.etcd_tls_dir = env.etcd_tls_dir;
  o.lockd_replicas = 3;
  o.etcd_owner_ttl = owner_ttl;
}

LongHolders::LongHolders(const std::string& servers, const std::string& history_dir,
                         uint64_t seed) {
  for (int i = 0; i < 4; ++i) {
    threads_.emplace_back([this, i, servers, history_dir, seed] {
      Run(i, servers, history_dir, seed * 4 + static_cast<uint64_t>(i));
    });
  }
}

void LongHolders::Stop() {
  stop_ = true;
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void LongHolders::Judge(Outcome& out, int64_t fault_at) {
  Stop();
  out.Expect(error().empty(), "a long holder could not start: " + error());
  out.Expect(holds_ > 0, "the long holders held nothing: the run shows nothing");
  out.Figure("long holders",
             absl::StrCat(holds_.load(), " holds of 2 to 6 s (TTL ", Secs(kTtl), "), ",
                          fault_at > 0 ? absl::StrCat(HeldAcross(fault_at), " held across the fault, ")
                                       : std::string(),
                          lost_.load(), " lost"));
}

std::string LongHolders::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

int64_t LongHolders::HeldAcross(int64_t at_ns) const {
  absl::MutexLock lock(&mu_);
  return std::count_if(spans_.begin(), spans_.end(), [at_ns](const auto& s) {
    return s.first <= at_ns && at_ns <= s.second;
  });
}

void LongHolders::Run(int i, const std::string& servers, const std::string& history_dir,
                      uint64_t seed) {
  const std::string name = absl::StrCat("holder-", i + 1);
  auto writer = history::Writer::Open(absl::StrCat(history_dir, "/", name, ".log"), name);
  auto client = Client::Create(
      {.server = servers, .session_ttl = kTtl, .default_lock_ttl = kTtl, .client_name = name});
  if (!writer.ok() || !client.ok()) {
    absl::MutexLock lock(&mu_);
    error_ = absl::StrCat(name, ": ", !writer.ok() ? writer.status().ToString()
                                                   : client.status().ToString());
    return;
  }
  std::mt19937_64 rng(seed);
  const std::string key = absl::StrCat("hold/", i % 2);
  while (!stop_) {
    const int64_t sent = history::NowNanos();
    const bool shared = rng() % 3 == 0;
    auto held = shared ? (*client)->acquireShared(key, absl::Seconds(1))
                       : (*client)->acquire(key, absl::Seconds(1));
    if (!held.ok()) {
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    const int64_t granted = history::NowNanos();
    (*writer)->Append(sent, "acquire", key, held->token(), shared ? "shared" : "", granted);
    const int64_t hold_ns = absl::ToInt64Nanoseconds(absl::Milliseconds(2000 + rng() % 4001));
    int64_t last_ok = granted;
    bool lost = false;
    while (!stop_ && history::NowNanos() - granted < hold_ns) {
      try {
        (*client)->checkStillHeld(*held);
        last_ok = history::NowNanos();
      } catch (const LockLostException&) {
        lost = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    (*writer)->Append(granted, "held", key, held->token(), lost ? "lost" : "kept", last_ok);
    {
      absl::MutexLock lock(&mu_);
      spans_.emplace_back(granted, last_ok);
    }
    ++holds_;
    if (lost) {
      ++lost_;
    } else {
      (void)(*client)->release(*held);
    }
  }
}

void Prober::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

absl::Duration Prober::LongestPause(int64_t from_ns, int64_t to_ns) const {
  absl::MutexLock lock(&mu_);
  int64_t previous = from_ns, longest = 0;
  for (int64_t g : grants_) {
    if (g < from_ns) {
      previous = g;
      continue;
    }
    if (g > to_ns) break;
    longest = std::max(longest, g - previous);
    previous = g;
  }
  longest = std::max(longest, std::min(to_ns, history::NowNanos()) - previous);
  return absl::Nanoseconds(longest);
}

int64_t Prober::grants() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(grants_.size());
}

void Prober::Run(const std::string& servers) {
  auto client = Client::Create({.server = servers,
                                .session_ttl = absl::Seconds(5),
                                .default_lock_ttl = absl::Seconds(5),
                                .client_name = "prober"});
  if (!client.ok()) return;
  // A name per acquire: an acquire whose answer was lost in a failover leaves its grant held
  // by the session until its lease runs out, and acquiring that name again is refused
  // meanwhile ("already holds"), which would count as a pause of the lease's length.
  for (uint64_t i = 0; !stop_; ++i) {
    auto held = (*client)->acquire(absl::StrCat("probe/", i), absl::Milliseconds(500));
    if (held.ok()) {
      {
        absl::MutexLock lock(&mu_);
        grants_.push_back(history::NowNanos());
      }
      (void)(*client)->release(*held);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::set<std::string> SecretCandidates(const std::string& dump) {
  std::set<std::string> out;
  for (size_t i = 0; i + 2 <= dump.size(); ++i) {
    const auto tag = static_cast<unsigned char>(dump[i]);
    const auto len = static_cast<unsigned char>(dump[i + 1]);
    if (((tag == 0x1a && len == 16) || (tag == 0x2a && len == 32)) && i + 2 + len <= dump.size()) {
      out.insert(dump.substr(i + 2, len));
    }
  }
  return out;
}

std::optional<history::Record> FirstGrantAfter(History& h, const std::string& old, int64_t from_ns) {
  std::optional<history::Record> first;
  h.Find([&](const history::Record& r) {
    if (r.event == "lockd-grant" && r.process != old && r.begin_ns >= from_ns &&
        (!first || r.begin_ns < first->begin_ns)) {
      first = r;
    }
    return false;
  });
  return first;
}

absl::StatusOr<history::Record> AwaitServingRecord(History& h, const std::string& replica,
                                                   int64_t from_ns) {
  std::optional<history::Record> serving;
  absl::Status s = WaitUntil(
      [&] {
        serving = h.Find([&](const history::Record& r) {
          return r.process == replica && r.event == "lockd-serving" && r.begin_ns > from_ns;
        });
        return serving.has_value();
      },
      absl::Seconds(30), absl::StrCat(replica, "'s lockd-serving record"));
  if (!s.ok()) return s;
  return *serving;
}

std::optional<history::Record> LastAct(History& h, const std::string& replica) {
  std::optional<history::Record> last;
  h.Find([&](const history::Record& r) {
    if (r.process == replica && absl::StartsWith(r.event, "lockd-") && r.event != "lockd-owned" &&
        r.event != "lockd-deposed" && r.event != "lockd-fenced-out" &&
        (!last || r.begin_ns > last->begin_ns)) {
      last = r;
    }
    return false;
  });
  return last;
}

std::string ProxiedEndpoints(std::vector<std::unique_ptr<FaultProxy>>& proxies,
                             payout::EtcdCluster& etcd) {
  if (proxies.empty()) {
    for (int i = 0; i < etcd.size(); ++i) {
      proxies.push_back(std::make_unique<FaultProxy>(etcd.client_port(i)));
    }
  }
  std::string endpoints;
  for (const auto& p : proxies) {
    absl::StrAppend(&endpoints, endpoints.empty() ? "" : ",", "127.0.0.1:", p->port());
  }
  return endpoints;
}

}  // namespace fencelock::harness::replicated
