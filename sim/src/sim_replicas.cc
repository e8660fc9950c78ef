// lockd's replicas on the simulated etcd: start, takeover, stop, the etcd's events, and the
// checks on what a replica did after its ownership ended.
#include "simulation.h"

namespace fencelock::sim::internal {

// ---- replicas on the simulated etcd ----

void Simulation::StartReplica(int i) {
  Replica& r = replicas_[i];
  ++r.incarnation;
  r.dead = std::make_shared<bool>(false);
  r.owner = absl::StrCat("lockd-", i, " #", r.incarnation, " (tcp ", ReplicaAddress(i), ")");
  r.owned_until = MonoTime::Min();
  world_.Mix(r.owner);
  Trace(absl::StrCat(r.owner, " starts"));
  // It listens at once, answering NOT_LEADER (naming the owner once it knows it) while it
  // waits for the prefix, as `lockd serve --etcd-standby` does.
  server::OpenedCommitLog nothing;
  nothing.log = server::StandbyCommitLog(kPrefix);
  auto standing_by = std::make_unique<server::StandingBy>();
  r.standing_by = standing_by.get();
  nothing.leadership = std::move(standing_by);
  r.standby_loop = std::make_unique<LoopTime>(r.time.get());
  r.core = std::make_unique<ServerCore>(CoreOptions(), r.standby_loop.get(), std::move(nothing));
  ++r.core_gen;
  r.core->Start();
  ResetShadow(*r.core);
  r.up = true;
  r.serving = false;
  server::EtcdCommitLogOptions o{.endpoints = {"sim-etcd-0", "sim-etcd-1", "sim-etcd-2"},
                                 .prefix = kPrefix,
                                 .reservation_block = kReservationBlock,
                                 .request_timeout = kEtcdRequestTimeout,
                                 .owner_ttl = kOwnerTtl,
                                 .owner_wait = absl::InfiniteDuration(),
                                 .snapshot_min_bytes = 8 << 10,
                                 .max_value_bytes = 4 << 10,
                                 .owner = r.owner,
                                 .member_probe = absl::ZeroDuration()};
  const uint64_t incarnation = r.incarnation;
  o.on_owned = [this, i, incarnation](MonoTime, MonoTime until) {
    Replica& r = replicas_[i];
    if (r.incarnation != incarnation) return;
    r.owned_until = until;
    // lockd gives up before etcd could: the deadline comes before etcd's own expiry of the
    // lease P/owner is on.
    const auto key = etcd_->Get(absl::StrCat(kPrefix, "/owner"));
    if (!key || key->value() != r.owner) return;
    const auto expires = etcd_->LeaseExpiresAt(key->lease());
    const int64_t deadline = r.time->TrueTimeOf(until);
    if (expires && deadline > expires->nanos()) {
      Fail(absl::StrCat(r.owner, " holds its ownership until ", deadline / 1e9,
                        " s, after etcd's expiry of its lease at ", expires->nanos() / 1e9, " s"));
    }
  };
  o.on_standby = [this, i, incarnation](const std::string& owner) {
    Replica& r = replicas_[i];
    if (r.incarnation != incarnation || r.standing_by == nullptr) return;
    // "lockd-<j> #<n> (tcp lockd-<j>:7420)": the address is what the clients dial.
    r.standing_by->SetLeader(server::LeaderOfOwner(owner));
  };
  o.log = [this, i](const std::string& line) {
    world_.Mix(line);
    Trace(absl::StrCat("lockd-", i, " log: ", line));
  };
  const std::string owner = r.owner;
  EtcdNet::TxnCheck check;
  auto before = std::make_shared<std::string>();
  check.before = [this, before](const etcdserverpb::TxnRequest&) { *before = etcd_owner_; };
  check.after = [this, before, owner](const etcdserverpb::TxnRequest& request,
                                      const absl::StatusOr<etcdserverpb::TxnResponse>& response) {
    if (!response.ok() || !response->succeeded() || *before == owner) return;
    // Only the owner's transactions may change lockd's state under the prefix.
    for (const auto& op : request.success()) {
      const std::string& key = op.has_request_put() ? op.request_put().key()
                               : op.has_request_delete_range() ? op.request_delete_range().key()
                                                               : std::string();
      if (key.empty() || key == absl::StrCat(kPrefix, "/owner")) continue;
      Fail(absl::StrCat(owner, " committed a write of ", key, " while ",
                        before->empty() ? std::string("nobody") : *before, " owned the prefix"));
      return;
    }
  };
  r.opening = server::OpenEtcdCommitLogOn(
      o, r.time.get(), etcd_net_->Connect(r.node, absl::StrCat("lockd-", i), kEtcdRequestTimeout, r.dead,
                                          std::move(check)),
      [this, i](absl::StatusOr<server::OpenedCommitLog> opened) {
        OnReplicaOpened(i, std::move(opened));
      });
}

void Simulation::OnReplicaOpened(int i, absl::StatusOr<server::OpenedCommitLog> opened) {
  Replica& r = replicas_[i];
  if (!opened.ok()) {
    world_.Mix(opened.status().ToString());
    if (opened.status().code() == absl::StatusCode::kDataLoss ||
        opened.status().code() == absl::StatusCode::kInvalidArgument) {
      Fail(absl::StrCat(r.owner, " cannot restore the state: ", opened.status().ToString()));
    }
    // It exits, and its supervisor starts it again.
    return StopReplica(i, false);
  }
  Trace(absl::StrCat(r.owner, " serves"));
  CheckRecovered(*opened, r.time->Now(), absl::StrCat(r.owner, " taking over"));
  // Before it answers anyone, a new owner reserves a block of tokens and session ids above
  // everything it restored.
  const server::Sequences reserved = EtcdSequences();
  if (reserved.token_hwm < opened->state.last_token() + kReservationBlock ||
      reserved.session_hwm < opened->state.last_session_id() + kReservationBlock) {
    Fail(absl::StrCat(r.owner, " serves with P/sequences at token ", reserved.token_hwm,
                      " and session ", reserved.session_hwm, ", not a block above the restored token ",
                      opened->state.last_token(), " and session ", opened->state.last_session_id()));
  }
  ++result_.takeovers;
  // The standby's connections close; the same port serves from now on.
  for (size_t c = 0; c < conns_.size(); ++c) {
    if (conns_[c]->open && conns_[c]->replica == i) CutConnection(static_cast<int>(c));
  }
  renewals_.clear();
  grant_lsn_.clear();
  session_lsn_.clear();
  current_ = i;
  current_committed_lsn_ = committed_lsn_;
  opened->log = std::make_unique<RecordingLog>(std::move(opened->log), this, i);
  server::CoreOptions options = CoreOptions();
  const uint64_t incarnation = r.incarnation;
  options.on_act = [this, i](const server::Act& act) {
    if (trace_) Trace(absl::StrCat("lockd-", i, " act ", act.kind, " ", act.key, " token ", act.token, " at ",
                       act.at.nanos(), " owned until ", act.owned_until.nanos()));
    CheckAct(i, act.kind, act.key, act.token, false);
  };
  options.on_ending_fault = [this, i, incarnation](const absl::Status& fault) {
    Replica& r = replicas_[i];
    if (r.incarnation != incarnation) return;
    world_.Mix(fault.ToString());
    // It stops accepting, refuses what it held, closes its connections 200 ms later, gives its
    // lease back and exits (status 3); a supervisor starts it again.
    r.up = false;
    world_.At(world_.now() + Ns(absl::Milliseconds(200)), r.node, [this, i, incarnation] {
      if (replicas_[i].incarnation == incarnation) StopReplica(i, false);
    });
  };
  r.standing_by = nullptr;
  r.core = std::make_unique<ServerCore>(options, r.time.get(), std::move(*opened));
  r.standby_loop.reset();
  ++r.core_gen;
  r.core->Start();
  ResetShadow(*r.core);
  r.serving = true;
  r.started_at = world_.now();
}

void Simulation::StopReplica(int i, bool crashed) {
  Replica& r = replicas_[i];
  if (!r.core && !r.opening) return;
  world_.Mix(uint64_t{crashed ? 0xDEADu : 0xE817u} | (uint64_t(i) << 32));
  Trace(absl::StrCat(r.owner, crashed ? " crashes" : " exits"));
  if (crashed) {
    ++result_.crashes;
    *r.dead = true;  // what it sent still arrives; nothing more leaves
    world_.Restart(r.node);
  }
  r.up = false;
  r.serving = false;
  for (size_t c = 0; c < conns_.size(); ++c) {
    if (conns_[c]->open && conns_[c]->replica == i) {
      conns_[c]->server_id = 0;
      CutConnection(static_cast<int>(c));
    }
  }
  // A clean exit gives the lease back (the log's destructor revokes it); a crash cannot.
  r.standing_by = nullptr;
  r.core.reset();
  r.standby_loop.reset();
  r.opening.reset();
  *r.dead = true;
  if (!crashed) world_.Restart(r.node);
  const int64_t back = world_.now() + Ns(rng_.Between(absl::Milliseconds(100), absl::Seconds(2)));
  world_.At(back, r.node, [this, i] { StartReplica(i); });
}

void Simulation::CheckAct(int i, server::Act::Kind kind, const std::string& lock,
                          uint64_t token, bool leaving) {
  if (kind == server::Act::kFencedOut) return;
  static constexpr const char* kWhat[] = {"a grant", "a renewal", "a confirmation (Validate)"};
  const Replica& r = replicas_[i];
  const std::string what =
      absl::StrCat(r.owner, " answered ", kWhat[kind], lock == "-" ? "" : " of ", lock == "-" ? "" : lock,
                   token != 0 ? absl::StrCat(" (token ", token, ")") : "");
  if (!r.serving) Fail(absl::StrCat(what, " while not serving"));
  if (current_ != i) {
    Fail(absl::StrCat(what, " after ", replicas_[current_].owner, " took over"));
  }
  if (r.time->Now() >= r.owned_until) {
    Fail(absl::StrCat(what, " at ", r.time->Now().nanos(), " on its clock, at or after its ownership deadline ",
                      r.owned_until.nanos()));
  }
  // A token is reserved in etcd before it is handed out.
  if (leaving && kind == server::Act::kGrant && token > EtcdSequences().token_hwm.value()) {
    Fail(absl::StrCat(what, " above the reservation in P/sequences (", EtcdSequences().token_hwm, ")"));
  }
  auto key = owner_keys_.find(r.owner);
  if (key == owner_keys_.end()) return Fail(absl::StrCat(what, " without ever owning the prefix"));
  const int64_t now = world_.now();
  if (!key->second.by_hand && now >= key->second.gone) {
    Fail(absl::StrCat(what, " ", (now - key->second.gone) / 1e6,
                      " ms after etcd let its ownership go (its lease ran out or was revoked)"));
  }
  // Deleted by hand: it stops within its usable ownership (its deadline moves only while
  // P/owner is its own), however long its lease lives.
  const int64_t usable = static_cast<int64_t>(Ns(kOwnerTtl) * (1 - server::kEtcdOwnerMargin) *
                                              (1 + 2 * options_.clock_rate_bound));
  if (key->second.by_hand && now >= key->second.gone + usable) {
    Fail(absl::StrCat(what, " ", (now - key->second.gone) / 1e6,
                      " ms after its P/owner was deleted by hand"));
  }
}

server::Sequences Simulation::EtcdSequences() {
  const auto kv = etcd_->Get(absl::StrCat(kPrefix, "/sequences"));
  if (!kv) return {};
  auto decoded = server::DecodeSequences("P/sequences", kv->value());
  if (!decoded.ok()) {
    Fail(absl::StrCat("P/sequences does not decode: ", decoded.status().ToString()));
    return {};
  }
  return *decoded;
}

void Simulation::OnEtcdEvent(const etcdserverpb::Event& e) {
  if (e.kv().key() != absl::StrCat(kPrefix, "/owner")) return;
  const int64_t now = world_.now();
  Trace(absl::StrCat("etcd: P/owner ", etcdserverpb::Event::EventType_Name(e.type()), " ",
                     e.kv().value(), deleting_by_hand_ ? " (by hand)" : ""));
  auto gone = [&] {
    if (etcd_owner_.empty()) return;
    OwnerKey& k = owner_keys_[etcd_owner_];
    k.gone = std::min(k.gone, now);
    k.by_hand = deleting_by_hand_;
  };
  if (e.type() == etcdserverpb::Event::DELETE) {
    gone();
    etcd_owner_.clear();
    return;
  }
  if (e.kv().value() == etcd_owner_ && e.kv().create_revision() != e.kv().mod_revision()) return;
  gone();
  etcd_owner_ = e.kv().value();
  // A replica that lost its key while it waited to take over may create it again. One that
  // served keeps its record: it must not act on a key it lost, whatever comes after.
  const bool serving = current_ >= 0 && replicas_[current_].owner == etcd_owner_ &&
                       replicas_[current_].serving;
  if (!serving) owner_keys_[etcd_owner_] = OwnerKey{.created = now};
}

void Simulation::ScheduleEtcdFaults() {
  const int64_t end = Ns(options_.duration);
  const std::string owner_key = absl::StrCat(kPrefix, "/owner");
  for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
    // A leader election: etcd answers nothing for a while.
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Between(absl::Milliseconds(100), absl::Seconds(3)));
    world_.At(at, env_node_, [this, length] {
      ++result_.etcd_faults;
      etcd_->SetUnavailable(true);
      world_.At(world_.now() + length, env_node_, [this] { etcd_->SetUnavailable(false); });
    });
  }
  for (int i = 0, n = static_cast<int>(rng_.Below(4)); i < n; ++i) {
    world_.At(rng_.Between(0, end), env_node_, [this] {
      ++result_.etcd_faults;
      etcd_->LoseRepliesAfterCommit(1 + static_cast<int>(rng_.Below(3)));
    });
  }
  for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
    // A slow member: calls take up to 600 ms each way, some past the request timeout.
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Between(absl::Milliseconds(300), absl::Seconds(4)));
    world_.At(at, env_node_, [this, length] {
      ++result_.etcd_faults;
      etcd_net_->SlowUntil(world_.now() + length);
    });
  }
  for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
    // One replica cut off from etcd (not from its clients).
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(4)));
    const int replica = static_cast<int>(rng_.Below(replica_count_));
    world_.At(at, env_node_, [this, length, replica] {
      ++result_.etcd_faults;
      const std::string name = absl::StrCat("lockd-", replica);
      etcd_->Partition(name, true);
      world_.At(world_.now() + length, env_node_, [this, name] { etcd_->Partition(name, false); });
    });
  }
  for (int i = 0, n = static_cast<int>(rng_.Below(3)); i < n; ++i) {
    // The serving replica stalls while a lease renewal of its is in flight.
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Chance(0.5) ? rng_.Between(absl::Milliseconds(300), absl::Seconds(1))
                                               : rng_.Between(absl::Seconds(1), absl::Seconds(3)));
    world_.At(at, env_node_, [this, length] {
      if (current_ < 0) return;
      ++result_.etcd_faults;
      etcd_net_->StallAtNextRenewal(replicas_[current_].node, length);
    });
  }
  if (rng_.Chance(0.1)) {
    const int64_t at = rng_.Between(0, end);
    const int64_t length = Ns(rng_.Between(absl::Milliseconds(200), absl::Seconds(2)));
    world_.At(at, env_node_, [this, length] {
      ++result_.etcd_faults;
      etcd_->SetNoSpace(true);
      world_.At(world_.now() + length, env_node_, [this] { etcd_->SetNoSpace(false); });
    });
  }
  if (rng_.Chance(0.3)) {
    // An operator deletes P/owner by hand (etcdctl del).
    // Half the time while the standbys are cut off from etcd for a moment: nobody takes over
    // and revokes the lease the key was on, so only the serving replica's own watch and its
    // reads of the key end its service.
    const bool alone = rng_.Chance(0.5);
    const int64_t cut = Ns(rng_.Between(absl::Seconds(1), absl::Seconds(3)));
    world_.At(rng_.Between(Ns(absl::Seconds(1)), end), env_node_, [this, owner_key, alone, cut] {
      ++result_.etcd_faults;
      Trace(absl::StrCat("an operator deletes P/owner", alone ? ", the standbys cut off" : ""));
      for (int i = 0; alone && i < replica_count_; ++i) {
        if (i == current_) continue;
        const std::string name = absl::StrCat("lockd-", i);
        etcd_->Partition(name, true);
        world_.At(world_.now() + cut, env_node_, [this, name] { etcd_->Partition(name, false); });
      }
      deleting_by_hand_ = true;
      etcd_->Delete(owner_key);
      deleting_by_hand_ = false;
    });
  }
}


}  // namespace fencelock::sim::internal
