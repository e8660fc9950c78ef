// payout-demo: the README's main command. Starts lockd on a fresh state directory, the rail
// simulator and N payout workers as separate processes, loads M payouts, freezes one worker
// with SIGSTOP in the middle of a payout for longer than the session TTL, kills another with
// SIGKILL, and reconciles the rail's ledger against the store when the work is done. With
// --ha (scripts/cluster.sh) lockd's state lives in a local 3-member etcd cluster with three
// lockd replicas, and the serving one is killed in the middle as well.
//
// Exit status: 0 when every payout was paid exactly once and the must-be-zero counters are
// zero; 1 when not; 2 for bad flags; 130 when interrupted (every process it started is stopped
// first, also then).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <map>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "fencelock/report.pb.h"
#include "logging/logging.h"
#include "payout-demo/cluster.h"
#include "process/flags.h"
#include "process/json.h"
#include "process/process.h"
#include "protocol/defaults.h"

ABSL_FLAG(int, workers, 3, "payout worker processes (at least 3 with faults on)");
ABSL_FLAG(int64_t, payouts, 300, "payouts to load");
ABSL_FLAG(int64_t, amount_cents, 1000, "amount of each payout, in cents");
ABSL_FLAG(absl::Duration, session_ttl, absl::Seconds(5), "lock.session.ttl of every worker");
ABSL_FLAG(absl::Duration, lock_ttl, absl::Seconds(5), "TTL of each payout's lock");
ABSL_FLAG(double, margin, fencelock::defaults::kSafetyMargin,
          "lock.client.safety-margin of every worker");
ABSL_FLAG(absl::Duration, rail_latency, absl::Milliseconds(20), "time the rail takes per request");
ABSL_FLAG(absl::Duration, rail_jitter, absl::Milliseconds(10), "extra rail latency, up to this");
ABSL_FLAG(absl::Duration, rail_read_timeout, absl::Milliseconds(500),
          "how long a worker waits for the rail at most; a submit costs this + 2 s of lease");
ABSL_FLAG(absl::Duration, freeze, absl::Seconds(7),
          "how long worker w1 stays frozen (SIGSTOP); 0 disables; should exceed --session-ttl");
ABSL_FLAG(std::string, freeze_at, "submitting",
          "the w1 event at which it is frozen: submitting (its submit is at the rail) or claimed");
ABSL_FLAG(bool, kill, true, "SIGKILL worker w2 in the middle of a payout");
ABSL_FLAG(absl::Duration, fault_after, absl::Seconds(1),
          "let the workers pay for this long before the freeze and the kill");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(120), "give up (and fail) after this long");
ABSL_FLAG(bool, ha, false,
          "replicated: lockd's state in a local 3-member etcd cluster (Debian's etcd-server) with "
          "three lockd replicas, the first serving and the others standing by");
ABSL_FLAG(bool, kill_lockd, true, "with --ha: SIGKILL the serving lockd in the middle of the run");
ABSL_FLAG(absl::Duration, owner_ttl, absl::Seconds(2),
          "with --ha: each replica's lease on the etcd prefix (lockd --etcd-owner-ttl)");
ABSL_FLAG(std::string, etcd_binary, "/usr/bin/etcd", "with --ha: the etcd executable");
ABSL_FLAG(std::string, etcd_tls_dir, "",
          "with --ha: etcd requires client certificates, from this directory made by "
          "scripts/make-certs.sh DIR etcd lockd (scripts/cluster.sh makes one); default: "
          "plaintext to etcd");
ABSL_FLAG(std::string, state_dir, "",
          "where lockd's state, the store, the ledger and the logs go (must not exist); default: "
          "a fresh directory under $TMPDIR, removed after a green run unless --keep-state");
ABSL_FLAG(bool, keep_state, false, "keep the state directory after a green run");
ABSL_FLAG(std::string, report_json, "", "also write the reconciliation as JSON to this file");
ABSL_FLAG(std::string, lockd_binary, LOCKD_BINARY, "the lockd executable");
ABSL_FLAG(std::string, rail_binary, RAIL_BINARY, "the payout-rail executable");
ABSL_FLAG(std::string, worker_binary, WORKER_BINARY,
          "the worker executable: payout-worker-faults, payout-worker with the fault points the "
          "freeze needs");
ABSL_FLAG(int, python_workers, 0,
          "how many of the --workers (the last ones) are the Python payout worker "
          "(python/examples/payout_worker.py) on the fencelock module, paying from the same "
          "store through the same rail");
#ifndef FENCELOCK_PYTHON_BINARY  // a tree without the fencelock module (sanitized, fuzzing)
#define FENCELOCK_PYTHON_BINARY ""
#define PYTHON_WORKER_SCRIPT ""
#define PYTHON_MODULE_DIR ""
#endif

namespace fencelock::payout {
namespace {

std::atomic<int> g_signal{0};

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(d));
}

struct Event {
  std::string worker, kind, payout;
  uint64_t token = 0;
};
// A step of a worker's payment, from its log line; std::nullopt for any other line (a fault
// point's "paused" note is not a step: the step before it is where the worker stopped).
std::optional<Event> ParseEvent(const std::string& line) {
  std::vector<std::string> f = absl::StrSplit(line, ' ');
  Event e;
  if (f.size() < 5 || f[3] != "token" || !absl::SimpleAtoi(f[4], &e.token)) return std::nullopt;
  if (f[1] == "paused") return std::nullopt;
  e.worker = f[0];
  e.kind = f[1];
  e.payout = f[2];
  return e;
}

struct Report : Reconciliation {
  absl::Duration wall, paying;
  std::vector<std::string> story;  // what the faults did, one line each
};

class Demo {
 public:
  Demo(std::string dir) : dir_(std::move(dir)) {}

  int Run() {
    const absl::Time start = absl::Now();
    if (absl::Status s = Setup(); !s.ok()) return Fail(s);
    const absl::Time paying_from = absl::Now();
    if (absl::Status s = Choreograph(start); !s.ok()) return Fail(s);
    report_.paying = absl::Now() - paying_from;
    if (absl::Status s = Reconcile(); !s.ok()) return Fail(s);
    report_.wall = absl::Now() - start;
    Print();
    if (absl::Status s = WriteJson(); !s.ok()) return Fail(s);
    return report_.ok() ? 0 : 1;
  }

 private:
  static void Say(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  void Note(absl::Time start, const std::string& what) {
    const std::string line = absl::StrFormat("  %6.2fs  %s", absl::ToDoubleSeconds(absl::Now() - start), what);
    report_.story.push_back(what);
    Say(line);
  }
  int Fail(const absl::Status& s) {
    logging::Program().Error(s.ToString());
    logging::Program().Info(absl::StrFormat("logs and state are in %s", dir_.c_str()));
    return g_signal.load() != 0 ? 130 : 1;
  }
  absl::Status Interrupted() const {
    if (g_signal.load() == 0) return absl::OkStatus();
    return absl::CancelledError(absl::StrCat("interrupted by signal ", g_signal.load(),
                                             "; stopping every process it started"));
  }

  absl::Status Setup() {
    Say(absl::StrCat("state directory: ", dir_));
    auto cluster = Cluster::Start({.dir = dir_,
                                   .lockd_binary = absl::GetFlag(FLAGS_lockd_binary),
                                   .rail_binary = absl::GetFlag(FLAGS_rail_binary),
                                   .worker_binary = absl::GetFlag(FLAGS_worker_binary),
                                   .python = FENCELOCK_PYTHON_BINARY,
                                   .python_worker = PYTHON_WORKER_SCRIPT,
                                   .python_module_dir = PYTHON_MODULE_DIR,
                                   .rail_latency = absl::GetFlag(FLAGS_rail_latency),
                                   .rail_jitter = absl::GetFlag(FLAGS_rail_jitter),
                                   .rail_read_timeout = absl::GetFlag(FLAGS_rail_read_timeout),
                                   .session_ttl = absl::GetFlag(FLAGS_session_ttl),
                                   .lock_ttl = absl::GetFlag(FLAGS_lock_ttl),
                                   .margin = absl::GetFlag(FLAGS_margin),
                                   // Replicated, every replica's history counts its fenced-out
                                   // requests, so that a killed replica's are not lost.
                                   .history = absl::GetFlag(FLAGS_ha),
                                   .etcd_members = absl::GetFlag(FLAGS_ha) ? 3 : 0,
                                   .etcd_binary = absl::GetFlag(FLAGS_etcd_binary),
                                   .etcd_tls_dir = absl::GetFlag(FLAGS_etcd_tls_dir),
                                   .etcd_owner_ttl = absl::GetFlag(FLAGS_owner_ttl)});
    if (!cluster.ok()) return cluster.status();
    cluster_ = std::move(*cluster);
    if (cluster_->replicated()) {
      Say(absl::StrCat("etcd cluster on ", cluster_->etcd()->endpoints(),
                       absl::GetFlag(FLAGS_etcd_tls_dir).empty()
                           ? " (plaintext)"
                           : " (TLS, client certificates required)"));
      Say(absl::StrCat("lockd replicas on ", cluster_->lockd_address(), " (",
                       cluster_->replica_name(0), " serving, the others standing by), rail on ",
                       cluster_->rail_address()));
    } else {
      Say(absl::StrCat("lockd on ", cluster_->lockd_address(), ", rail on ", cluster_->rail_address()));
    }
    if (absl::Status s = cluster_->Load(absl::GetFlag(FLAGS_payouts), absl::GetFlag(FLAGS_amount_cents));
        !s.ok()) {
      return s;
    }
    Say(absl::StrCat("loaded ", absl::GetFlag(FLAGS_payouts), " PENDING payouts of ",
                     absl::GetFlag(FLAGS_amount_cents), " cents"));
    return Interrupted();
  }

  // Whether w1 stops itself (right after a claim, a window too short to catch from outside)
  // rather than being caught by the runner at its freeze point.
  static bool SelfFreeze() {
    return absl::GetFlag(FLAGS_freeze) > absl::ZeroDuration() &&
           absl::GetFlag(FLAGS_freeze_at) == "claimed";
  }

  // " (the last 2 in Python)" with --python-workers=2.
  static std::string PythonWorkersNote() {
    const int python = absl::GetFlag(FLAGS_python_workers);
    return python == 0 ? "" : absl::StrCat(" (the last ", python, " in Python)");
  }

  // Starts worker `i`; faults may strike it from `arm_at` on.
  absl::Status StartWorker(int i, absl::Time arm_at) {
    const std::string name = absl::StrCat("w", i + 1);
    std::vector<std::string> extra;
    if (i == 0 && SelfFreeze()) {
      extra.push_back("--stop-self-after-claim=" +
                      absl::FormatDuration(std::max(arm_at - absl::Now(), absl::ZeroDuration())));
    }
    const bool python = i >= absl::GetFlag(FLAGS_workers) - absl::GetFlag(FLAGS_python_workers);
    auto worker = cluster_->StartWorker(name, extra, "", python);
    if (!worker.ok()) return worker.status();
    names_.push_back(name);
    tails_.emplace_back(cluster_->Path("logs/" + name + ".log"));
    last_.emplace_back();
    workers_.push_back(*worker);
    return absl::OkStatus();
  }

  // Starts the workers, applies the faults when their moment comes, and waits for every
  // surviving worker to finish.
  absl::Status Choreograph(absl::Time start) {
    const int n = absl::GetFlag(FLAGS_workers);
    const absl::Time arm_at = start + absl::GetFlag(FLAGS_fault_after);
    for (int i = 0; i < n; ++i) {
      if (absl::Status s = StartWorker(i, arm_at); !s.ok()) return s;
    }
    Note(start, absl::StrCat("started ", n, " workers", PythonWorkersNote()));
    const absl::Duration freeze = absl::GetFlag(FLAGS_freeze);
    const std::string freeze_at = absl::GetFlag(FLAGS_freeze_at);
    bool want_freeze = freeze > absl::ZeroDuration(), frozen = false;
    bool want_kill = absl::GetFlag(FLAGS_kill);
    // Replicated: the serving lockd is killed a moment after the worker faults, while w1 is
    // frozen, and the run watches a standby take over.
    bool want_lockd_kill = cluster_->replicated() && absl::GetFlag(FLAGS_kill_lockd);
    int killed_replica = -1;
    absl::Time lockd_killed_at;
    absl::Time frozen_at;
    std::string frozen_payout;
    std::map<std::string, std::string> watched;  // payout → whose it was when the fault hit
    const bool self_freeze = SelfFreeze();
    // w1 stopped at its freeze point (by the runner, or by itself): watch its payout.
    auto mark_frozen = [&](const std::string& how) {
      want_freeze = false;
      frozen = true;
      frozen_at = absl::Now();
      frozen_payout = last_[0].event.payout;
      watched[frozen_payout] = "w1";
      Note(start, absl::StrCat("w1 frozen (SIGSTOP", how, ") at \"", freeze_at, "\" of ",
                               frozen_payout, ", token ", last_[0].event.token));
    };
    const absl::Time give_up = start + absl::GetFlag(FLAGS_timeout);
    std::vector<bool> exited(n, false);
    for (;;) {
      if (absl::Status s = Interrupted(); !s.ok()) return s;
      if (absl::Now() > give_up) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the payouts were not all paid within --timeout=",
            absl::FormatDuration(absl::GetFlag(FLAGS_timeout))));
      }
      const bool armed = absl::Now() >= arm_at;
      for (int i = 0; i < n; ++i) {
        std::vector<std::string> lines = tails_[i].Poll();
        for (size_t k = 0; k < lines.size(); ++k) {
          const std::string& line = lines[k];
          auto e = ParseEvent(line);
          if (!e) continue;
          last_[i] = {*e, Detail(line)};
          const bool newest = k + 1 == lines.size();
          if (newest && armed && want_freeze && !self_freeze && i == 0 &&
              AtFreezePoint(last_[0], freeze_at)) {
            // The log can lag the worker: stop it, then read what it logged before it stopped,
            // and keep the freeze only if it is still at the freeze point.
            auto caught = StopAndCatchUp(0);
            if (caught.has_value() && AtFreezePoint(last_[0], freeze_at)) {
              mark_frozen("");
            } else {
              workers_[0]->Signal(SIGCONT);  // it moved on; try again at its next one
            }
          } else if (newest && armed && want_kill && i == 1 && MidPayout(last_[1])) {
            auto caught = StopAndCatchUp(1);
            if (caught.has_value() && MidPayout(last_[1])) {
              workers_[1]->Signal(SIGKILL);
              want_kill = false;
              watched[last_[1].event.payout] = "w2";
              Note(start, absl::StrCat("w2 killed (SIGKILL) in the middle of ",
                                       last_[1].event.payout, " (token ", last_[1].event.token,
                                       ", last logged: ", last_[1].event.kind, ")"));
            } else {
              workers_[1]->Signal(SIGCONT);
            }
          } else if (i == 0 && e->payout == frozen_payout && !frozen) {
            Note(start, absl::StrCat("w1 after waking: ", e->kind, " ", e->payout, " token ",
                                     e->token, Detail(line)));
          } else if (auto w = watched.find(e->payout);
                     w != watched.end() && e->worker != w->second &&
                     ((e->kind == "claimed" && Detail(line) != " (was PAID)") ||
                      e->kind == "found-paid" || e->kind == "paid" || e->kind == "submitted")) {
            Note(start, absl::StrCat(e->worker, " took over ", w->second, "'s ", e->payout, ": ",
                                     e->kind, " under token ", e->token, Detail(line)));
          }
        }
      }
      if (want_freeze && self_freeze && workers_[0]->stopped()) {
        // It logged the claim before it stopped itself: that line is in its log now.
        for (const std::string& line : tails_[0].Poll()) {
          if (auto e = ParseEvent(line)) last_[0] = {*e, Detail(line)};
        }
        if (!AtFreezePoint(last_[0], freeze_at)) {
          return absl::InternalError(absl::StrCat("w1 stopped itself after \"", last_[0].event.kind,
                                                  "\", not right after a claim"));
        }
        mark_frozen(", raised by itself right after the claim");
      }
      if (want_lockd_kill && absl::Now() >= arm_at + absl::Milliseconds(500)) {
        want_lockd_kill = false;
        killed_replica = cluster_->ServingReplica();
        if (killed_replica >= 0) {
          cluster_->replica(killed_replica).Signal(SIGKILL);
          cluster_->replica(killed_replica).Wait();
          lockd_killed_at = absl::Now();
          Note(start, absl::StrCat(cluster_->replica_name(killed_replica),
                                   " (the serving lockd) killed (SIGKILL)"));
        }
      }
      if (killed_replica >= 0) {
        if (const int now = cluster_->ServingReplica(); now >= 0 && now != killed_replica) {
          Note(start, absl::StrCat(cluster_->replica_name(now), " took over the etcd prefix ",
                                   Seconds(absl::Now() - lockd_killed_at), " after the kill (",
                                   Seconds(absl::GetFlag(FLAGS_owner_ttl)), " lease)"));
          killed_replica = -1;
        }
      }
      if (frozen && absl::Now() - frozen_at >= freeze) {
        workers_[0]->Signal(SIGCONT);
        frozen = false;
        Note(start, absl::StrCat("w1 resumed (SIGCONT) after ", Seconds(absl::Now() - frozen_at),
                                 ", longer than its ", Seconds(absl::GetFlag(FLAGS_session_ttl)),
                                 " session TTL"));
      }
      bool all_done = true;
      for (int i = 0; i < n; ++i) {
        if (exited[i]) continue;
        if (auto status = workers_[i]->Wait(absl::ZeroDuration())) {
          exited[i] = true;
          Note(start, absl::StrCat(names_[i], " ", process::DescribeStatus(*status)));
        } else {
          all_done = false;
        }
      }
      if (all_done) {
        // Too few payouts for the faults' moment: say so rather than tell a story that did
        // not happen.
        if (want_freeze) {
          Note(start, absl::StrCat("w1 was never frozen: no payout reached \"", freeze_at,
                                   "\" in w1 after --fault-after=",
                                   absl::FormatDuration(absl::GetFlag(FLAGS_fault_after)),
                                   " (too few --payouts?)"));
        }
        if (want_kill) {
          Note(start, absl::StrCat("w2 was never killed: it was not mid-payout after --fault-after=",
                                   absl::FormatDuration(absl::GetFlag(FLAGS_fault_after)),
                                   " (too few --payouts?)"));
        }
        return absl::OkStatus();
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  struct Position {
    Event event;
    std::string detail;
  };
  // Claimed and not yet paid: a fault here leaves the payout for another worker to finish (a
  // claim that found it PAID is already done).
  static bool MidPayout(const Position& p) {
    const std::string& k = p.event.kind;
    if (k == "claimed") return p.detail != " (was PAID)";
    return k == "submitting" || k == "submitted" || k == "found-paid";
  }
  static bool AtFreezePoint(const Position& p, const std::string& freeze_at) {
    return p.event.kind == freeze_at && MidPayout(p);
  }
  // SIGSTOPs worker `i`, waits until the kernel reports it stopped, and reads the events it
  // logged before that into last_[i] (they are printed in the story only as positions). Returns
  // std::nullopt if it did not stop within a second.
  std::optional<Position> StopAndCatchUp(int i) {
    workers_[i]->Signal(SIGSTOP);
    for (int tries = 0; tries < 1000; ++tries) {
      if (workers_[i]->stopped()) {
        for (const std::string& line : tails_[i].Poll()) {
          if (auto e = ParseEvent(line)) last_[i] = {*e, Detail(line)};
        }
        return last_[i];
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    return std::nullopt;
  }

  // The part of an event line after the token ("txn 12", "deadline_passed", ...).
  static std::string Detail(const std::string& line) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 5));
    return f.size() == 6 ? " (" + f[5] + ")" : "";
  }

  absl::Status Reconcile() {
    auto r = cluster_->Reconcile();
    if (!r.ok()) return r.status();
    static_cast<Reconciliation&>(report_) = *r;
    return absl::OkStatus();
  }

  void Print() const {
    const Report& r = report_;
    auto row = [](const std::string& name, const std::string& value, const std::string& note = "") {
      std::printf("  %-34s %10s  %s\n", name.c_str(), value.c_str(), note.c_str());
    };
    auto must_be_zero = [](double v) { return v == 0 ? "must be 0: ok" : "must be 0: FAILED"; };
    std::printf("\nReconciliation (rail ledger against payout store)\n");
    row("payouts", absl::StrCat(r.payouts));
    row("paid exactly once", absl::StrCat(r.paid_once));
    row("paid twice or more", absl::StrCat(r.paid_twice), must_be_zero(r.paid_twice));
    row("left unpaid", absl::StrCat(r.left), must_be_zero(r.left));
    row("lock_fenced_out_total (lockd)", absl::StrCat(r.lock_fenced_out), must_be_zero(r.lock_fenced_out));
    row("rail_duplicate_attempted_total", absl::StrCat(r.rail_duplicates), must_be_zero(r.rail_duplicates));
    row("rail_fenced_out_total", absl::StrCat(r.rail_fenced_out), "stale submits the rail refused");
    int64_t abandoned = 0;
    std::string reasons;
    for (const auto& [reason, count] : r.abandoned) {
      abandoned += count;
      absl::StrAppend(&reasons, reasons.empty() ? "" : ", ", reason, " ", count);
    }
    row("abandoned steps", absl::StrCat(abandoned), reasons);
    row("claims (retries under a new token)", absl::StrCat(r.claims),
        absl::StrCat(r.claims - r.payouts, " more than payouts"));
    row("rail status queries before a retry", absl::StrCat(r.status_queries));
    row("wall time", Seconds(r.wall));
    row("payouts per second", absl::StrFormat("%.1f", r.payouts / absl::ToDoubleSeconds(r.paying)),
        "while workers ran, faults included");
    std::printf("\n%s\n", r.ok() ? "RESULT: OK: every payout paid exactly once; must-be-zero counters at zero"
                                 : "RESULT: FAILED: see the rows marked FAILED");
    std::fflush(stdout);
  }

  absl::Status WriteJson() const {
    const std::string path = absl::GetFlag(FLAGS_report_json);
    if (path.empty()) return absl::OkStatus();
    const Report& r = report_;
    // Counts fit int32 (JSON numbers, not the strings proto3 writes for 64-bit integers).
    auto n = [](int64_t v) { return static_cast<int32_t>(v); };
    report::DemoReport out;
    out.set_ok(r.ok());
    out.set_payouts(n(r.payouts));
    out.set_paid_once(n(r.paid_once));
    out.set_paid_twice(n(r.paid_twice));
    out.set_left(n(r.left));
    out.set_lock_fenced_out_total(n(r.lock_fenced_out));
    out.set_rail_duplicate_attempted_total(n(r.rail_duplicates));
    out.set_rail_fenced_out_total(n(r.rail_fenced_out));
    out.set_rail_status_queries(n(r.status_queries));
    out.set_claims(n(r.claims));
    for (const auto& [reason, count] : r.abandoned) (*out.mutable_abandoned())[reason] = n(count);
    out.set_wall_seconds(absl::ToDoubleSeconds(r.wall));
    out.set_payouts_per_second(r.payouts / absl::ToDoubleSeconds(r.paying));
    out.set_events(n(static_cast<int64_t>(r.story.size())));
    std::ofstream file(path, std::ios::trunc);
    file << process::ToJson(out);
    if (!file.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", path));
    return absl::OkStatus();
  }

  const std::string dir_;
  std::unique_ptr<Cluster> cluster_;      // stops every process it started when destroyed
  std::vector<process::Child*> workers_;  // owned by cluster_
  std::vector<std::string> names_;
  std::vector<LineTail> tails_;
  std::vector<Position> last_;  // each worker's latest logged event
  Report report_;
};

// Flags that cannot make a meaningful run are refused before anything starts.
absl::Status CheckFlags() {
  const int workers = absl::GetFlag(FLAGS_workers);
  const bool faults = absl::GetFlag(FLAGS_freeze) > absl::ZeroDuration() || absl::GetFlag(FLAGS_kill);
  if (workers < 1 || workers > 64) return absl::InvalidArgumentError("--workers must be 1 to 64");
  if (faults && workers < 3) {
    return absl::InvalidArgumentError(
        "with faults on, --workers must be at least 3 (one frozen, one killed, one to take over); "
        "or turn them off with --freeze=0 --nokill");
  }
  const int python = absl::GetFlag(FLAGS_python_workers);
  if (python < 0 || python > workers) {
    return absl::InvalidArgumentError("--python-workers must be 0 to --workers");
  }
  if (faults && python > workers - 2) {
    return absl::InvalidArgumentError(
        "with faults on, at most --workers minus 2 may be Python workers: w1 and w2, which the "
        "faults strike, use payout-worker-faults' fault points");
  }
  if (python > 0 && absl::GetFlag(FLAGS_ha)) {
    return absl::InvalidArgumentError(
        "--python-workers does not run with --ha: the replicated run checks every worker's "
        "event history, which the Python worker does not keep");
  }
  if (absl::GetFlag(FLAGS_payouts) < 1) return absl::InvalidArgumentError("--payouts must be >= 1");
  if (absl::GetFlag(FLAGS_ha) &&
      (absl::GetFlag(FLAGS_owner_ttl) < absl::Seconds(2) || absl::GetFlag(FLAGS_owner_ttl) > absl::Hours(1))) {
    return absl::InvalidArgumentError("--owner-ttl must be 2s to 1h (lockd --etcd-owner-ttl)");
  }
  const std::string at = absl::GetFlag(FLAGS_freeze_at);
  if (at != "submitting" && at != "claimed") {
    return absl::InvalidArgumentError("--freeze-at must be submitting or claimed");
  }
  const absl::Duration usable =
      std::min(absl::GetFlag(FLAGS_session_ttl), absl::GetFlag(FLAGS_lock_ttl)) *
      (1 - absl::GetFlag(FLAGS_margin));
  const absl::Duration submit = absl::GetFlag(FLAGS_rail_read_timeout) + absl::Seconds(2);
  if (usable <= submit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no payout could ever be paid: the usable lease, min(session TTL, lock TTL) x (1 - margin) = ",
        absl::FormatDuration(usable), ", must exceed a rail submit's worst case, read timeout + 2s = ",
        absl::FormatDuration(submit)));
  }
  return absl::OkStatus();
}

int Main() {
  if (absl::Status s = CheckFlags(); !s.ok()) {
    logging::Program().Error(std::string(s.message()));
    return 2;
  }
  std::string dir = absl::GetFlag(FLAGS_state_dir);
  const bool fresh = dir.empty();
  if (fresh) {
    const char* tmp = getenv("TMPDIR");
    dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/fencelock-payouts-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) {
      std::perror("payout-demo: mkdtemp");
      return 1;
    }
  } else if (std::filesystem::exists(dir)) {
    logging::Program().Error(absl::StrFormat(
        "--state-dir %s already exists; give a new path", dir.c_str()));
    return 2;
  }
  const absl::Duration usable =
      std::min(absl::GetFlag(FLAGS_session_ttl), absl::GetFlag(FLAGS_lock_ttl)) *
      (1 - absl::GetFlag(FLAGS_margin));
  std::printf(
      "fencelock payout demo: %d workers pay %ld payouts through a rail whose submit cannot be undone\n"
      "  session TTL %s, lock TTL %s, safety margin %.2f: usable lease %s\n"
      "  rail latency %s (+ up to %s), read timeout %s: a submit needs %s of lease (D4)\n"
      "  faults: w1 frozen for %s at \"%s\", w2 killed mid-payout: %s%s\n\n",
      absl::GetFlag(FLAGS_workers), static_cast<long>(absl::GetFlag(FLAGS_payouts)),
      Seconds(absl::GetFlag(FLAGS_session_ttl)).c_str(), Seconds(absl::GetFlag(FLAGS_lock_ttl)).c_str(),
      absl::GetFlag(FLAGS_margin), Seconds(usable).c_str(),
      absl::FormatDuration(absl::GetFlag(FLAGS_rail_latency)).c_str(),
      absl::FormatDuration(absl::GetFlag(FLAGS_rail_jitter)).c_str(),
      absl::FormatDuration(absl::GetFlag(FLAGS_rail_read_timeout)).c_str(),
      Seconds(absl::GetFlag(FLAGS_rail_read_timeout) + absl::Seconds(2)).c_str(),
      Seconds(absl::GetFlag(FLAGS_freeze)).c_str(), absl::GetFlag(FLAGS_freeze_at).c_str(),
      absl::GetFlag(FLAGS_kill) ? "yes" : "no",
      !absl::GetFlag(FLAGS_ha) ? ""
      : absl::GetFlag(FLAGS_kill_lockd)
          ? absl::StrCat(", the serving lockd killed (3 etcd members, 3 lockd replicas, ",
                         Seconds(absl::GetFlag(FLAGS_owner_ttl)), " lease on the prefix)").c_str()
          : ", replicated (3 etcd members, 3 lockd replicas)");
  int code;
  {
    Demo demo(dir);
    code = demo.Run();
  }  // every child is stopped and reaped here
  if (code == 0 && fresh && !absl::GetFlag(FLAGS_keep_state)) {
    std::filesystem::remove_all(dir);
  } else {
    std::printf("state and logs kept in %s\n", dir.c_str());
  }
  return code;
}

}  // namespace
}  // namespace fencelock::payout

int main(int argc, char** argv) {
  fencelock::logging::InitProgram("payout-demo");
  absl::SetProgramUsageMessage(
      "runs the payout demo end to end: lockd, the rail, N workers, a freeze and a kill, and a "
      "reconciliation\n  payout-demo [--workers=3] [--payouts=300] [--session-ttl=5s] ...");
  fencelock::process::ParseFlags(argc, argv);
  struct sigaction on_signal = {};
  on_signal.sa_handler = [](int sig) { fencelock::payout::g_signal.store(sig); };
  sigaction(SIGINT, &on_signal, nullptr);
  sigaction(SIGTERM, &on_signal, nullptr);
  sigaction(SIGHUP, &on_signal, nullptr);
  return fencelock::payout::Main();
}
