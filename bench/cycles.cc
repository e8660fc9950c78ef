// fencelock-bench's lock-cycle systems for fencelock (bench.h): the client library and the raw
// protocol driver, a thread per client or every client on one thread; the peers' are in
// peers.cc.
#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "logging/logging.h"
#include "peers.h"
#include "bench.h"
#include "fencelock/wire.pb.h"
#include "lock-client/client.h"
#include "protocol/requests.h"

namespace fencelock::bench {
namespace {

using fencelock::Client;
using net::BlockingConnection;
namespace req = protocol::request;

// acquire (waiting up to 10 s) + release through fencelock::Client: what worker code sees.
// Pipelined, the release is releaseWithNextRequest(): it travels with the next cycle's acquire.
class LibraryCycler : public Cycler {
 public:
  LibraryCycler(std::unique_ptr<Client> client, std::string lock, bool pipelined)
      : client_(std::move(client)), lock_(std::move(lock)), pipelined_(pipelined) {}
  absl::StatusOr<int64_t> Cycle() override {
    const MonoTime start = Now();
    auto handle = client_->acquire(lock_, absl::Seconds(10));
    if (!handle.ok()) return handle.status();
    const int64_t took = NanosSince(start);
    absl::Status s = pipelined_ ? client_->releaseWithNextRequest(*handle) : client_->release(*handle);
    if (!s.ok()) return s;
    return took;
  }

 private:
  std::unique_ptr<Client> client_;
  const std::string lock_;
  const bool pipelined_;
};

// The same two requests over a BlockingConnection, without the client's lease bookkeeping:
// what lockd can do.
class RawCycler : public Cycler {
 public:
  RawCycler(std::unique_ptr<BlockingConnection> conn, uint64_t session, std::string lock,
            bool wait)
      : conn_(std::move(conn)), session_(session), lock_(std::move(lock)), wait_(wait) {}
  absl::StatusOr<int64_t> Cycle() override {
    const MonoTime start = Now();
    auto g = conn_->Call(
        req::Acquire(session_, lock_, wait_ ? absl::Seconds(10) : absl::ZeroDuration()));
    if (!g.ok()) return g.status();
    if (g->code() != wire::OK || !g->acquire().granted()) {
      return absl::FailedPreconditionError(absl::StrCat("acquire: ", g->message()));
    }
    const int64_t took = NanosSince(start);
    auto rel = conn_->Call(req::Release(session_, lock_, g->acquire().token()));
    if (!rel.ok()) return rel.status();
    if (rel->code() != wire::OK) return absl::FailedPreconditionError(absl::StrCat("release: ", rel->message()));
    return took;
  }

 private:
  std::unique_ptr<BlockingConnection> conn_;
  const uint64_t session_;
  const std::string lock_;
  const bool wait_;
};

// The raw driver pipelined: each cycle's Release goes out, unanswered, in one write with the
// next cycle's Acquire, and both answers are read then.
class PipelinedRawCycler : public Cycler {
 public:
  PipelinedRawCycler(std::unique_ptr<BlockingConnection> conn, uint64_t session, std::string lock)
      : conn_(std::move(conn)), session_(session), lock_(std::move(lock)) {}
  ~PipelinedRawCycler() override {
    // The last cycle's lock, so that the next run's sessions find it free.
    if (token_ == 0) return;
    (void)conn_->Call(req::Release(session_, lock_, token_));
  }
  absl::StatusOr<int64_t> Cycle() override {
    const MonoTime start = Now();
    std::vector<wire::Request> requests;
    if (token_ != 0) requests.push_back(req::Release(session_, lock_, token_));
    requests.push_back(req::Acquire(session_, lock_, absl::Seconds(10)));
    // One write, as the library's releaseWithNextRequest() makes.
    auto ids = conn_->SendAll(std::move(requests));
    if (!ids.ok()) return ids.status();
    const std::optional<uint64_t> release_id =
        ids->size() == 2 ? std::optional<uint64_t>(ids->front()) : std::nullopt;
    const uint64_t* acquire_id = &ids->back();
    for (;;) {
      auto reply = conn_->Receive(absl::Seconds(10));
      if (!reply.ok()) return reply.status();
      if (release_id.has_value() && reply->request_id() == *release_id) {
        if (reply->code() != wire::OK) {
          return absl::FailedPreconditionError(absl::StrCat("release: ", reply->message()));
        }
        continue;
      }
      if (reply->request_id() != *acquire_id) continue;
      if (reply->code() != wire::OK || !reply->acquire().granted()) {
        return absl::FailedPreconditionError(absl::StrCat("acquire: ", reply->message()));
      }
      token_ = reply->acquire().token();
      return NanosSince(start);
    }
  }

 private:
  std::unique_ptr<BlockingConnection> conn_;
  const uint64_t session_;
  const std::string lock_;
  uint64_t token_ = 0;  // held since the last cycle, released by the next
};

// The raw driver's requests (RawCycler's, or pipelined PipelinedRawCycler's) on the one-thread
// driver, RunStreamCycles.
class LockdStreamCycler : public StreamCycler {
 public:
  LockdStreamCycler(std::unique_ptr<BlockingConnection> conn, uint64_t session, std::string lock,
                    bool pipelined)
      : conn_(std::move(conn)), session_(session), lock_(std::move(lock)), pipelined_(pipelined) {}

  int fd() const override { return conn_->fd(); }
  void Begin(std::string* out) override { SendAcquire(out); }

  absl::StatusOr<bool> Feed(std::string_view in, bool stop, std::string* out,
                            std::vector<int64_t>* acquire_ns) override {
    decoder_.Feed(in);
    std::string payload;
    for (;;) {
      const auto next = decoder_.Next(&payload);
      if (next == protocol::FrameDecoder::Result::kNeedMore) break;
      if (next == protocol::FrameDecoder::Result::kTooLarge) {
        return absl::DataLossError("lockd sent a frame above the maximum size");
      }
      wire::Response reply;
      if (!reply.ParseFromString(payload)) return absl::DataLossError("lockd sent a reply that does not parse");
      if (release_id_ != 0 && reply.request_id() == release_id_) {
        if (reply.code() != wire::OK) {
          return absl::FailedPreconditionError(absl::StrCat("release: ", reply.message()));
        }
        release_id_ = 0;
        if (!pipelined_ && !stop) SendAcquire(out);
        continue;
      }
      if (acquire_id_ == 0 || reply.request_id() != acquire_id_) continue;  // a push
      if (reply.code() != wire::OK || !reply.acquire().granted()) {
        return absl::FailedPreconditionError(absl::StrCat("acquire: ", reply.message()));
      }
      acquire_id_ = 0;
      acquire_ns->push_back(NanosSince(started_));
      // Pipelined, the Release travels in one write with the next cycle's Acquire.
      SendRelease(reply.acquire().token(), out);
      if (pipelined_ && !stop) SendAcquire(out);
    }
    return acquire_id_ == 0 && release_id_ == 0;
  }

 private:
  void SendAcquire(std::string* out) {
    wire::Request a = req::Acquire(session_, lock_, absl::Seconds(10));
    a.set_request_id(acquire_id_ = ++next_id_);
    started_ = Now();
    (void)protocol::AppendFrame(a.SerializeAsString(), out);
  }
  void SendRelease(uint64_t token, std::string* out) {
    wire::Request r = req::Release(session_, lock_, token);
    r.set_request_id(release_id_ = ++next_id_);
    (void)protocol::AppendFrame(r.SerializeAsString(), out);
  }

  std::unique_ptr<BlockingConnection> conn_;
  const uint64_t session_;
  const std::string lock_;
  const bool pipelined_;
  protocol::FrameDecoder decoder_;
  uint64_t next_id_ = uint64_t{1} << 32;  // above the ids the setup's calls took
  uint64_t acquire_id_ = 0, release_id_ = 0;  // in flight (0: none)
  MonoTime started_;
};

std::string CycleLock(int client, bool contended) {
  return contended ? std::string("cycle") : absl::StrCat("cycle/", client);
}

// A connection with a session of its own (60 s), for the raw drivers.
absl::StatusOr<std::pair<std::unique_ptr<BlockingConnection>, uint64_t>> ConnectWithSession(
    const std::string& address) {
  auto conn = Connect(address);
  if (!conn.ok()) return conn.status();
  auto opened = (*conn)->Call(req::OpenSession(absl::Minutes(1)));
  if (!opened.ok()) return opened.status();
  if (opened->code() != wire::OK) return absl::UnavailableError(opened->message());
  return std::make_pair(std::move(*conn), opened->open_session().session_id());
}

}  // namespace

CyclerFactory LibraryCyclers(const std::string& address, bool contended, bool pipelined) {
  return [address, contended, pipelined](int client) -> absl::StatusOr<std::unique_ptr<Cycler>> {
    auto c = Client::Create({.server = address});
    if (!c.ok()) return c.status();
    return std::make_unique<LibraryCycler>(std::move(*c), CycleLock(client, contended), pipelined);
  };
}


StreamCyclerFactory LockdStreamCyclers(const std::string& address, bool pipelined) {
  return [address, pipelined](int client) -> absl::StatusOr<std::unique_ptr<StreamCycler>> {
    auto c = ConnectWithSession(address);
    if (!c.ok()) return c.status();
    return std::make_unique<LockdStreamCycler>(std::move(c->first), c->second,
                                               CycleLock(client, false), pipelined);
  };
}


CyclerFactory RawCyclers(const std::string& address, bool contended, bool pipelined) {
  return [address, contended, pipelined](int client) -> absl::StatusOr<std::unique_ptr<Cycler>> {
    auto c = ConnectWithSession(address);
    if (!c.ok()) return c.status();
    auto conn = std::move(c->first);
    const uint64_t session = c->second;
    if (pipelined) {
      return std::make_unique<PipelinedRawCycler>(std::move(conn), session,
                                                  CycleLock(client, contended));
    }
    return std::make_unique<RawCycler>(std::move(conn), session, CycleLock(client, contended),
                                       contended);
  };
}


absl::Status RunCycleWorkloads(const Settings& s, Report& report) {
  // lockd and the peers, all started before the first round.
  auto lockd = StartLockd(s.binary, absl::StrCat(s.root, "/lockd-cycles"));
  if (!lockd.ok()) return lockd.status();
  const std::string address = (*lockd)->address();
  report.systems = {
      {"fencelock_library", "fencelock, library", LibraryCyclers(address, false), true},
      {"fencelock_raw", "fencelock, raw driver", RawCyclers(address, false), true},
      {"fencelock_library_pipelined", "fencelock, library, pipelined",
       LibraryCyclers(address, false, true), true},
      {"fencelock_raw_pipelined", "fencelock, raw driver, pipelined",
       RawCyclers(address, false, true), true},
      {"fencelock_library_one_lock", "fencelock, library, one lock", LibraryCyclers(address, true), true},
      {"fencelock_raw_one_lock", "fencelock, raw driver, one lock", RawCyclers(address, true), true},
      {"fencelock_raw_one_thread", "fencelock, raw driver, one thread", nullptr, true,
       LockdStreamCyclers(address, false)},
      {"fencelock_raw_one_thread_pipelined", "fencelock, raw driver, one thread, pipelined", nullptr,
       true, LockdStreamCyclers(address, true)},
  };
  std::unique_ptr<RedisPeer> redis_always, redis_none;
  std::unique_ptr<EtcdPeer> etcd;
  if (s.want_redis) {
    logging::Program().Info("peers: starting Redis (appendfsync always, and no persistence)");
    auto a = RedisPeer::Start(s.redis_binary, s.root + "/redis-always",
                              RedisPeer::Persistence::kAppendFsyncAlways);
    if (!a.ok()) return absl::UnavailableError(absl::StrCat("redis: ", a.status().ToString()));
    auto b = RedisPeer::Start(s.redis_binary, s.root + "/redis-none", RedisPeer::Persistence::kNone);
    if (!b.ok()) return absl::UnavailableError(absl::StrCat("redis: ", b.status().ToString()));
    redis_always = std::move(*a);
    redis_none = std::move(*b);
    absl::StrAppend(&report.versions, "Redis ", redis_always->version(), "; ");
    report.systems.push_back({"redis_fsync_always", "Redis, appendfsync always", redis_always->Cyclers(false)});
    report.systems.push_back({"redis_fsync_always_incr", "Redis, appendfsync always, INCR token", redis_always->Cyclers(true)});
    report.systems.push_back({"redis_no_persistence", "Redis, no persistence", redis_none->Cyclers(false)});
    report.systems.push_back({"redis_no_persistence_incr", "Redis, no persistence, INCR token", redis_none->Cyclers(true)});
    report.systems.push_back({"redis_fsync_always_one_thread", "Redis, appendfsync always, one thread", nullptr,
                       false, redis_always->StreamCyclers(false)});
    report.systems.push_back({"redis_fsync_always_one_thread_pipelined",
                       "Redis, appendfsync always, one thread, pipelined", nullptr, false,
                       redis_always->StreamCyclers(true)});
  }
  if (s.want_etcd) {
    logging::Program().Info("peers: starting etcd (one member)");
    auto e = EtcdPeer::Start(s.etcd_binary, s.root + "/etcd");
    if (!e.ok()) return absl::UnavailableError(absl::StrCat("etcd: ", e.status().ToString()));
    etcd = std::move(*e);
    absl::StrAppend(&report.versions, "etcd ", etcd->version(), "; ");
    report.systems.push_back({"etcd", "etcd, one member", etcd->Cyclers()});
  }
  // The list --systems is checked against must name every system built here, or a request
  // for one would be refused before anything starts.
  for (const System& sys : report.systems) {
    if (std::find(s.system_keys.begin(), s.system_keys.end(), sys.key) == s.system_keys.end()) {
      return absl::InternalError(absl::StrCat("system ", sys.key, " is missing from the --systems list"));
    }
  }
  if (!s.only.empty()) {
    std::vector<System> kept;
    for (const std::string& key : s.only) {
      for (const System& sys : report.systems) {
        if (sys.key == key) kept.push_back(sys);
      }
    }
    report.systems = std::move(kept);
  }
  logging::Program().Info(absl::StrFormat(
      "lock cycles: %zu systems x %zu client counts x %d rounds, %.1f s each",
      report.systems.size(), s.clients.size(), s.rounds, s.cycle_seconds));
  // A fresh lockd writes into its first WAL segment for the first time: one untimed run first,
  // so that the first measured one does not pay for that.
  (void)RunCycles(RawCyclers(address, false), 8, std::min(1.0, s.cycle_seconds), "warm-up (not reported)");
  report.runs.assign(report.systems.size(), std::vector<Runs>(s.clients.size()));
  for (size_t c = 0; c < s.clients.size(); ++c) {
    for (int round = 1; round <= s.rounds; ++round) {
      for (size_t k = 0; k < report.systems.size(); ++k) {
        const System& sys = report.systems[k];
        const std::string label = absl::StrCat(s.clients[c], " clients, round ", round, ": ", sys.name);
        CycleResult r = sys.make ? RunCycles(sys.make, s.clients[c], s.cycle_seconds, label)
                                 : RunStreamCycles(sys.stream, s.clients[c], s.cycle_seconds, label);
        Runs& into = report.runs[k][c];
        into.rates.push_back(r.cycles_per_second);
        into.acquire_ns.insert(into.acquire_ns.end(), r.acquire_ns.begin(), r.acquire_ns.end());
        into.errors += r.errors;
        if (into.first_error.empty()) into.first_error = r.first_error;
        if (r.errors > 0 || r.cycles_per_second == 0) report.broken = true;
      }
    }
  }
  lockd->reset();
  redis_always.reset();
  redis_none.reset();
  etcd.reset();
  Json& cycles = report.json["lock_cycles"] = {
      {"rounds", s.rounds}, {"seconds", s.cycle_seconds}, {"runs", Json::array()}};
  report.cycles_table =
      "| clients | system | cycles/s min | median | max | median / fencelock library | acquire p50 / "
      "p99 ms | errors |\n|---|---|---|---|---|---|---|---|\n";
  // The ratio column is against the library; with --systems leaving it out, there is none.
  const auto library_at = std::find_if(report.systems.begin(), report.systems.end(),
                                       [](const System& sys) { return sys.key == "fencelock_library"; });
  for (size_t c = 0; c < s.clients.size(); ++c) {
    const double library = library_at == report.systems.end()
                               ? 0.0
                               : report.runs[static_cast<size_t>(library_at - report.systems.begin())][c].median();
    for (size_t k = 0; k < report.systems.size(); ++k) {
      const Runs& r = report.runs[k][c];
      const Percentiles acquire = Summarize(r.acquire_ns);
      cycles["runs"].push_back({{"clients", s.clients[c]},
                                {"system", report.systems[k].key},
                                {"cycles_per_s", r.rates},
                                {"median", r.median()},
                                {"acquire", ToJson(acquire)},
                                {"errors", r.errors}});
      absl::StrAppend(&report.cycles_table, "| ", s.clients[c], " | ", report.systems[k].name, " | ",
                      absl::StrFormat("%.0f | %.0f | %.0f", r.min(), r.median(), r.max()), " | ",
                      library > 0 ? absl::StrFormat("%.2f", r.median() / library) : std::string("-"),
                      " | ",
                      Ms(acquire.p50), " / ", Ms(acquire.p99), " | ",
                      r.errors == 0 ? std::string("0") : absl::StrCat(r.errors, ": ", r.first_error), " |\n");
    }
  }
  return absl::OkStatus();
}

}  // namespace fencelock::bench
