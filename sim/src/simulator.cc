// The run: the recording commit log, the simulated network, lockd's start and crashes, the
// faults, and the simulator's interface (sim/simulator.h).
#include "simulation.h"

namespace fencelock::sim::internal {

// ---- RecordingLog ----

void RecordingLog::Append(const Record& record) {
  sim_->OnApplied(replica_, record);
  const uint64_t before = inner_->last_lsn();
  inner_->Append(record);
  if (inner_->last_lsn() == before) return;  // renewals are not logged
  batch_last_lsn_[inner_->newest_batch()] = inner_->last_lsn();
  sim_->OnAppended(replica_, inner_->last_lsn(), record);
}

void RecordingLog::Snapshot(const StateMachine& state) {
  sim_->OnSnapshot(replica_, inner_->last_lsn(), state);
  inner_->Snapshot(state);
}

void RecordingLog::OnCommitted(uint64_t batch) {
  // What the log says is committed never goes back. If it did, a reply tagged with a batch
  // already durable would wait for a later batch, and on a quiet lockd none comes: the reply
  // is never sent. (Safety checks do not see that; lockd's first M7 run hung on it.)
  if (batch < reported_) {
    sim_->Fail(absl::StrCat("the log reported batch ", batch, " committed after batch ", reported_));
  }
  if (inner_->committed_batch() < batch) {
    sim_->Fail(absl::StrCat("the log reported batch ", batch, " committed while committed_batch() is ",
                            inner_->committed_batch()));
  }
  reported_ = std::max(reported_, batch);
  if (const uint64_t written = inner_->stats().snapshots; written > snapshots_seen_) {
    snapshots_seen_ = written;
    sim_->CheckSnapshots(replica_);
  }
  for (auto it = batch_last_lsn_.begin(); it != batch_last_lsn_.end() && it->first <= batch;) {
    sim_->OnCommittedLsn(replica_, it->second);
    it = batch_last_lsn_.erase(it);
  }
  listener_->OnCommitted(batch);
}

void RecordingLog::OnCommitFault(const absl::Status& status) {
  // On etcd a commit fault ends the replica's service (CoreOptions::on_ending_fault).
  if (!sim_->on_etcd()) sim_->OnDiskFault();
  listener_->OnCommitFault(status);
}

// ---- the network ----

int Simulation::OpenConnection(int client_node, int replica) {
  const int id = static_cast<int>(conns_.size());
  auto c = std::make_unique<Connection>();
  c->client = client_node;
  c->replica = replica;
  const int64_t arrive =
      std::max(world_.now() + Ns(rng_.Between(absl::Microseconds(50), absl::Microseconds(500))),
               blocked_to_server_[client_node]);
  c->last_to_server = arrive;
  conns_.push_back(std::move(c));
  sinks_.push_back(std::make_unique<Sink>(this, id));
  if (!replicas_[replica].up) {
    // Nobody listens: the connection is refused.
    world_.At(arrive, client_node, [this, id] {
      conns_[id]->open = false;
      if (conns_[id]->client != env_node_) ClientAt(conns_[id]->client)->OnDisconnected(id);
    });
    return id;
  }
  world_.At(arrive, replicas_[replica].node, [this, id] {
    if (!conns_[id]->open) return;
    if (ServerCore* core = CoreOf(id)) conns_[id]->server_id = core->Connect(sinks_[id].get());
  });
  return id;
}

int64_t NetworkDelay(Rng& rng, bool faults) {
  if (faults && rng.Chance(0.01)) return Ns(rng.Between(absl::Milliseconds(20), absl::Milliseconds(300)));
  return Ns(rng.Between(absl::Microseconds(50), absl::Microseconds(1500)));
}

void Simulation::ClientSend(int conn, const wire::Request& r) {
  Connection& c = *conns_[conn];
  if (!c.open) return;
  const int64_t at = std::max({c.last_to_server, blocked_to_server_[c.client],
                               world_.now() + NetworkDelay(rng_, options_.network_faults)});
  c.last_to_server = at;
  std::string payload = r.SerializeAsString();
  world_.At(at, NodeOf(conn), [this, conn, payload = std::move(payload), r] {
    DeliverToLockd(conn, payload, r);
  });
}

void Simulation::DeliverToLockd(int conn, std::string payload, wire::Request request) {
  Connection& c = *conns_[conn];
  ServerCore* core = CoreOf(conn);
  if (!c.open || c.server_id == 0 || !core) return;
  world_.Mix(payload);
  // Which lock renewals and releases are stale on arrival: lockd must never accept those.
  const auto& state = core->service().state();
  auto note = [&](const std::string& lock, FenceToken token) {
    const server::LockState* held = state.FindLock(lock);
    if (held == nullptr || held->FindToken(token) == nullptr) {
      stale_.insert({conn, request.request_id(), lock});
    }
  };
  if (request.has_keep_alive()) {
    auto& renewal = renewals_[{conn, request.request_id()}];
    renewal.first = SessionId(request.keep_alive().session_id());
    for (const auto& l : request.keep_alive().locks()) {
      note(l.lock(), FenceToken(l.token()));
      renewal.second.push_back(FenceToken(l.token()));
    }
  } else if (request.has_renew() && request.renew().sessions_size() > 0) {
    // A Renew names no lock but those it confirms: what its answer asserts is the session's.
    auto& renewal = renewals_[{conn, request.request_id()}];
    renewal.first = SessionId(request.renew().sessions(0).session_id());
    for (const auto& l : request.renew().sessions(0).confirm()) {
      renewal.second.push_back(FenceToken(l.token()));
    }
  } else if (request.has_release()) {
    note(request.release().lock(), FenceToken(request.release().token()));
  } else if (request.has_validate()) {
    note(request.validate().lock(), FenceToken(request.validate().token()));
  }
  core->Receive(c.server_id, std::span<const std::string>(&payload, 1));
}

void Simulation::Sink::Send(std::string_view frames) {
  Simulation* sim = sim_;
  sim->CheckReplyGate(conn_, frames);
  Connection& c = *sim->conns_[conn_];
  if (!c.open) return;
  const int64_t at =
      std::max({c.last_to_client, sim->blocked_to_client_[c.client],
                sim->world_.now() + NetworkDelay(sim->rng_, sim->options_.network_faults)});
  c.last_to_client = at;
  const int conn = conn_;
  sim->world_.At(at, c.client, [sim, conn, bytes = std::string(frames)] {
    Connection& c = *sim->conns_[conn];
    if (!c.open) return;
    sim->world_.Mix(bytes);
    c.decoder.Feed(bytes);
    std::string payload;
    while (c.decoder.Next(&payload) == protocol::FrameDecoder::Result::kFrame) {
      wire::Response r;
      if (!r.ParseFromString(payload)) {
        sim->Fail("a reply from lockd does not parse");
        continue;
      }
      if (c.client == sim->env_node_) continue;  // a stranger's: nobody reads it
      sim->ClientAt(c.client)->OnResponse(conn, r);
      if (!c.open) break;
    }
  });
}

void Simulation::Sink::CloseAfterSend() {
  Simulation* sim = sim_;
  const int conn = conn_;
  const int64_t at = sim->conns_[conn]->last_to_client + 1;
  sim->world_.At(at, sim->NodeOf(conn), [sim, conn] { sim->CutConnection(conn); });
}

void Simulation::CutConnection(int conn) {
  Connection& c = *conns_[conn];
  if (!c.open) return;
  c.open = false;
  world_.Mix(static_cast<uint64_t>(conn) | (uint64_t{0xC} << 56));
  if (c.server_id != 0 && CoreOf(conn) != nullptr) {
    const ConnectionId id = c.server_id;
    const uint64_t gen = replicas_[c.replica].core_gen;
    world_.At(world_.now() + Ns(absl::Microseconds(100)), NodeOf(conn),
              [this, conn, id, gen] {
                // Only the core it was connected to: a takeover replaces a standby's core.
                const Replica& r = replicas_[conns_[conn]->replica];
                if (r.core && r.core_gen == gen) r.core->Disconnect(id);
              });
  }
  const int client = c.client;
  world_.At(world_.now() + Ns(absl::Microseconds(100)), client,
            [this, conn, client] {
              if (client != env_node_) ClientAt(client)->OnDisconnected(conn);
            });
}

// ---- lockd ----

void Simulation::StartLockd() {
  server::LocalCommitLogOptions log_options{.env = &disk_,
                                            .dir = kDataDir,
                                            .segment_bytes = 4 << 10,
                                            .reservation_block = 7,
                                            // Half the runs sync small batches on lockd's own
                                            // thread when no batch is in flight, as lockd does.
                                            .inline_sync_max_records = rng_.Chance(0.5) ? 4u : 0u,
                                            // Most runs read snapshots a few entries a slice,
                                            // so that requests change the state in between.
                                            .snapshot_slice = rng_.Chance(0.8) ? 1 + rng_.Below(4)
                                                                               : size_t{2048},
                                            .now = [this] { return replicas_[0].time->Now(); },
                                            .log = [](const std::string&) {}};
  log_options.schedule_writer = [this](std::function<void()> step) {
    absl::Duration latency = rng_.Between(absl::Microseconds(100), absl::Milliseconds(1));
    if (options_.disk_faults && rng_.Chance(0.02)) {
      latency = rng_.Between(absl::Milliseconds(50), absl::Milliseconds(400));  // a slow sync
    }
    world_.At(world_.now() + Ns(latency), replicas_[0].node, std::move(step));
  };
  // The writer hands its completions to lockd's thread across threads: they arrive in order,
  // each some microseconds later, and lockd may run other events (an inline sync) meanwhile.
  auto opened = server::OpenLocalCommitLog(
      log_options, replicas_[0].time->Now(), [this](std::function<void()> f) {
        handoff_at_ = std::max(handoff_at_, world_.now() + rng_.Between(0, Ns(absl::Microseconds(500))));
        world_.At(handoff_at_, replicas_[0].node, std::move(f));
      });
  if (!opened.ok()) {
    Fail(absl::StrCat("lockd does not recover after a crash: ", opened.status().ToString()));
    return;
  }
  CheckRecovered(*opened, replicas_[0].time->Now(), "lockd");
  current_ = 0;
  current_committed_lsn_ = committed_lsn_;
  opened->log = std::make_unique<RecordingLog>(std::move(opened->log), this, 0);
  Replica& r = replicas_[0];
  r.core = std::make_unique<ServerCore>(CoreOptions(), r.time.get(), std::move(*opened));
  ++r.core_gen;
  r.core->Start();
  ResetShadow(*r.core);
  r.up = r.serving = true;
  r.started_at = world_.now();
}

void Simulation::Crash(int replica) {
  if (on_etcd()) return StopReplica(replica, true);
  if (!replicas_[0].up) return;
  ++result_.crashes;
  world_.Mix(uint64_t{0xDEAD});
  Replica& r = replicas_[0];
  r.up = r.serving = false;
  world_.Restart(r.node);  // every pending lockd event (timers, disk steps, deliveries) is gone
  r.core.reset();
  renewals_.clear();  // none of them will be answered
  for (size_t i = 0; i < conns_.size(); ++i) {
    if (conns_[i]->open) {
      conns_[i]->server_id = 0;
      CutConnection(static_cast<int>(i));
    }
  }
  disk_.ClearFaults();
  disk_.Crash([this](uint64_t unsynced) -> uint64_t {
    return rng_.Chance(0.5) ? 0 : rng_.Below(unsynced + 1);  // lost, or torn
  });
  const int64_t back = world_.now() + Ns(rng_.Between(absl::Milliseconds(50), absl::Seconds(1)));
  world_.At(back, replicas_[0].node, [this] { StartLockd(); });
}

server::CoreOptions Simulation::CoreOptions() {
  server::CoreOptions options{
      .service = server::ServiceOptions{.min_ttl = absl::Milliseconds(10),
                                        .max_ttl = absl::Seconds(60),
                                        .max_wait = absl::Seconds(60)},
      .connections = server::ConnectionOptions{.hello_timeout = absl::Seconds(2)},
      .stall_threshold = absl::Seconds(1),
      .log = [](const std::string&) {},
      .session_secrets = [this] {
        std::string secret(16, '\0');
        for (char& c : secret) c = static_cast<char>(secrets_.Next());
        return secret;
      }};
  return options;
}


// ---- faults ----

int Simulation::RandomOpenConnection() {
  std::vector<int> open;
  for (size_t c = 0; c < conns_.size(); ++c) {
    if (conns_[c]->open) open.push_back(static_cast<int>(c));
  }
  return open.empty() ? -1 : open[rng_.Below(open.size())];
}

void Simulation::ScheduleFaults() {
  const int64_t end = Ns(options_.duration);
  if (options_.crashes) {
    for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
      world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this] {
        // On etcd, mostly the serving replica.
        int replica = 0;
        if (on_etcd()) {
          replica = current_ >= 0 && rng_.Chance(0.7) ? current_
                                                     : static_cast<int>(rng_.Below(replica_count_));
        }
        Crash(replica);
      });
    }
  }
  if (options_.network_faults && rng_.Chance(0.2)) {
    world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this] { EndASession(); });
  }
  if (options_.disk_faults && !on_etcd() && rng_.Chance(0.25)) {
    world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this] {
      if (replicas_[0].up) disk_.FailNextSync();
    });
  }
  if (on_etcd()) ScheduleEtcdFaults();
  if (options_.pauses) {
    for (int i = 0, n = static_cast<int>(rng_.Below(4)); i < n; ++i) {
      const int node = static_cast<int>(rng_.Below(replica_count_ + options_.clients));
      const int64_t at = rng_.Between(0, end);
      const int64_t length = Ns(rng_.Between(absl::Milliseconds(300), absl::Seconds(6)));
      // The pause itself is not an event of the node: it happens to it.
      world_.At(at, env_node_, [this, node, length] {
        ++result_.pauses;
        World::Node& n = world_.node(node);
        n.paused_until = std::max(n.paused_until, world_.now() + length);
        world_.Mix(static_cast<uint64_t>(node) | (uint64_t{0xF} << 56));
      });
    }
  }
  if (options_.network_faults) {
    for (int i = 0, n = static_cast<int>(rng_.Below(6)); i < n; ++i) {
      world_.At(rng_.Between(0, end), env_node_, [this] {
        // A cut of a random open connection (a reset, a dead middlebox).
        const int conn = RandomOpenConnection();
        if (conn < 0) return;
        ++result_.cuts;
        CutConnection(conn);
      });
    }
    for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
      // A one-way partition: one direction of a connection stops delivering for a while; TCP
      // delivers what was sent once it heals, unless a side gives up first.
      world_.At(rng_.Between(0, end), env_node_, [this] {
        const int conn = RandomOpenConnection();
        if (conn < 0) return;
        Connection& c = *conns_[conn];
        const int64_t heal = world_.now() + Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(3)));
        if (rng_.Chance(0.5)) {
          c.last_to_server = std::max(c.last_to_server, heal);
        } else {
          c.last_to_client = std::max(c.last_to_client, heal);
        }
      });
    }
    for (int i = 0, n = static_cast<int>(rng_.Below(8)); i < n; ++i) {
      // A one-way partition of a client's whole link, across its reconnects.
      world_.At(rng_.Between(0, end), env_node_, [this] {
        const int client = replica_count_ + static_cast<int>(rng_.Below(options_.clients));
        const int64_t heal = world_.now() + Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(4)));
        auto& blocked = rng_.Chance(0.5) ? blocked_to_server_ : blocked_to_client_;
        blocked[client] = std::max(blocked[client], heal);
        world_.Mix(static_cast<uint64_t>(client) | (uint64_t{0xB} << 56));
      });
    }
  }
}

void Simulation::EndASession() {
  if (ServingCore() == nullptr) return;
  // A session with a lock held.
  std::vector<SessionId> candidates;
  for (int l = 0; l < options_.locks; ++l) {
    const server::LockState* held =
        ServingCore()->service().state().FindLock(absl::StrCat("lock-", l));
    if (held == nullptr) continue;
    for (const server::HolderState& h : held->holders()) {
      if (secrets_by_session_.contains(h.session)) candidates.push_back(h.session);
    }
  }
  if (candidates.empty()) return;
  const SessionId session = candidates[rng_.Below(candidates.size())];
  ended_sessions_.insert(session);
  world_.Mix(session.value() | (uint64_t{0xE} << 56));
  const int client = conns_[secrets_by_session_.at(session).first]->client;
  for (size_t i = 0; i < conns_.size(); ++i) {
    if (conns_[i]->open && conns_[i]->client == client) CutConnection(static_cast<int>(i));
  }
  // The stranger's requests reach lockd at once, before the client can reconnect.
  const int stranger = static_cast<int>(conns_.size());
  auto c = std::make_unique<Connection>();
  c->client = env_node_;
  c->replica = current_;
  conns_.push_back(std::move(c));
  sinks_.push_back(std::make_unique<Sink>(this, stranger));
  std::vector<std::string> payloads;
  wire::Request r = protocol::HelloRequest("stranger");
  r.set_request_id(1);
  payloads.push_back(r.SerializeAsString());
  r = protocol::request::Resume(session.value(), secrets_by_session_.at(session).second);
  r.set_request_id(2);
  payloads.push_back(r.SerializeAsString());
  r = protocol::request::Close(session.value());
  r.set_request_id(3);
  payloads.push_back(r.SerializeAsString());
  world_.At(world_.now(), NodeOf(stranger), [this, stranger, payloads = std::move(payloads)] {
    ServerCore* core = CoreOf(stranger);
    if (core == nullptr || !conns_[stranger]->open) return;
    conns_[stranger]->server_id = core->Connect(sinks_[stranger].get());
    core->Receive(conns_[stranger]->server_id, std::span<const std::string>(payloads));
  });
}

SimResult Simulation::Run() {
  const int64_t bound_ppm = static_cast<int64_t>(options_.clock_rate_bound * 1e6);
  for (int n = 0; n < replica_count_ + options_.clients; ++n) {
    World::Node& node = world_.node(n);
    node.rate_ppm = rng_.Between(-bound_ppm, bound_ppm);
    node.origin = Ns(absl::Hours(1)) + rng_.Between(0, Ns(absl::Hours(100)));
  }
  replicas_.resize(replica_count_);
  for (int i = 0; i < replica_count_; ++i) {
    if (options_.lockd_fast_clock > 0) {
      world_.node(i).rate_ppm = static_cast<int64_t>(options_.lockd_fast_clock * 1e6);
    }
    replicas_[i].node = i;
    replicas_[i].time = std::make_unique<NodeTime>(&world_, i);
  }
  if (on_etcd()) {
    long_holders_ = rng_.Chance(0.3);
    etcd_clock_ = std::make_unique<WorldClock>(&world_);
    etcd_ = std::make_unique<SimEtcd>(etcd_clock_.get());
    etcd_net_ = std::make_unique<EtcdNet>(&world_, &rng_, env_node_, etcd_.get());
    etcd_->SetObserver([this](const etcdserverpb::Event* e) {
      etcd_net_->OnChange();
      if (e != nullptr) OnEtcdEvent(*e);
    });
    server::EtcdCommitLogOptions init{.prefix = kPrefix, .reservation_block = 7};
    if (absl::Status s = server::InitEtcdPrefixOn(init, *etcd_->Connect("init")); !s.ok()) {
      Fail(absl::StrCat("init: ", s.ToString()));
      return result_;
    }
    for (int i = 0; i < replica_count_; ++i) {
      world_.At(i == 0 ? 0 : rng_.Between(0, Ns(absl::Milliseconds(300))), i,
                [this, i] { StartReplica(i); });
    }
  } else {
    if (absl::Status s = server::InitDataDir(&disk_, kDataDir, 4 << 10); !s.ok()) {
      Fail(absl::StrCat("init: ", s.ToString()));
      return result_;
    }
    RunLockdEvent(0, [&] { StartLockd(); });
  }
  for (int c = 0; c < options_.clients; ++c) {
    clients_.push_back(std::make_unique<SimClient>(this, replica_count_ + c, &world_, &rng_));
  }
  for (auto& c : clients_) c->Start();
  ScheduleFaults();
  const int64_t end = Ns(options_.duration);
  while (result_.ok &&
         world_.Step(end, [this](int node, const std::function<void()>& fn) {
           if (node < replica_count_) {
             RunLockdEvent(node, fn);
           } else {
             fn();
           }
         })) {
  }
  result_.events = world_.events();
  result_.trace_hash = world_.hash();
  // Timers and clients refer to the cores: tear down in order. Nothing more reaches etcd.
  for (Replica& r : replicas_) {
    if (r.dead) *r.dead = true;
    r.core.reset();
    r.standby_loop.reset();
    r.opening.reset();
  }
  clients_.clear();
  return result_;
}


}  // namespace fencelock::sim::internal

namespace fencelock::sim {

using internal::Simulation;

std::string CheckOptions(const SimOptions& o) {
  if (o.duration <= absl::ZeroDuration() || o.duration > absl::Hours(24)) {
    return "--duration must be positive and at most 24h";
  }
  if (o.clients < 1 || o.clients > 1000) return "--clients must be 1 to 1000";
  if (o.replicas < 1 || o.replicas > 3) {
    return "--replicas must be 1 (lockd on its local log) or 2 to 3 (replicas on the simulated etcd)";
  }
  if (o.locks < 1 || o.locks > 1000) return "--locks must be 1 to 1000";
  if (!(o.safety_margin > 0 && o.safety_margin < 1)) return "--margin must be in (0, 1)";
  if (!(o.clock_rate_bound >= 0 && o.clock_rate_bound < 0.5)) {
    return "--clock-rate-bound must be in [0, 0.5)";
  }
  if (!(o.lockd_fast_clock >= 0 && o.lockd_fast_clock <= 10)) {
    return "--lockd-fast-clock must be in [0, 10]";
  }
  return "";
}

SimResult Simulate(const SimOptions& options) {
  Simulation sim(options);
  return sim.Run();
}

std::string ReplayCommand(const SimOptions& o) {
  std::string cmd = absl::StrCat("fencelock-sim --seeds=1 --from=", o.seed, " --duration=",
                                 absl::FormatDuration(o.duration), " --clients=", o.clients,
                                 " --locks=", o.locks, " --margin=", o.safety_margin,
                                 " --clock-rate-bound=", o.clock_rate_bound);
  if (o.replicas != 1) absl::StrAppend(&cmd, " --replicas=", o.replicas);
  if (o.lockd_fast_clock > 0) absl::StrAppend(&cmd, " --lockd-fast-clock=", o.lockd_fast_clock);
  if (!o.network_faults) absl::StrAppend(&cmd, " --network-faults=false");
  if (!o.disk_faults) absl::StrAppend(&cmd, " --disk-faults=false");
  if (!o.crashes) absl::StrAppend(&cmd, " --crashes=false");
  if (!o.pauses) absl::StrAppend(&cmd, " --pauses=false");
  return cmd + " --verbose";
}

}  // namespace fencelock::sim

