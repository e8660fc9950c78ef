// lockctl pool ...: the admission pools' static client for shell managers and operators
// (docs/admission.md). Every command is one request through fencelock::PoolClient, the same
// client a C++ manager links.
//
// Text output is one value a script can capture (publish: the generation; claim: the owner;
// acquire: the token; activate, release, recover: the decision; renew: the TTL); status prints
// tables. --json prints one JSON object for every command, failures included. Exit status:
// 0 done, 1 lockd unreachable or unavailable, 2 bad usage or a request lockd found invalid,
// 3 acquire refused for want of units (try again later), 4 no such pool, profile or lease,
// 5 refused by the state (an incompatible generation, a draining pool, a slot already leased,
// a repeated or stale recovery), 6 this manager's epoch is stale, 7 permission denied,
// 8 lockd speaks no protocol with pools.
#include "absl/strings/str_format.h"
#include "lockctl_pool.h"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "logging/logging.h"
#include "nlohmann/json.hpp"
#include "lock-client/pool_client.h"

ABSL_FLAG(std::string, pool, "", "pool: the pool's name");
ABSL_FLAG(std::string, profile, "", "pool: the profile's id");
ABSL_FLAG(std::string, slot, "", "pool: the slot's name");
ABSL_FLAG(uint64_t, generation, 0, "pool publish/claim/ack: the policy generation");
ABSL_FLAG(uint64_t, budget, 0, "pool publish: the pool's budget of units");
ABSL_FLAG(std::string, profiles, "",
          "pool publish: id[:cost=N][:reserve=N][:lendable][:borrow],... ");
ABSL_FLAG(std::string, owner, "",
          "pool: the owner `pool claim` printed (<epoch>:<key>); default: $FENCELOCK_POOL_OWNER");
ABSL_FLAG(uint64_t, token, 0, "pool renew/activate/release/recover: the lease's token");
ABSL_FLAG(uint64_t, slots, 0, "pool set-demand: slots wanted beyond those held (0: none)");
ABSL_FLAG(absl::Duration, ttl, absl::ZeroDuration(),
          "pool acquire: provisional lease TTL; 0 takes lockd's default");
ABSL_FLAG(std::string, evidence, "",
          "pool recover: what proves the worker gone (kept in the tombstone)");
ABSL_FLAG(bool, off, false, "pool drain: end draining instead");

namespace fencelock {
namespace {

using Json = nlohmann::json;  // members print in key order (std::map)

// One JSON document, indented, ending in a newline. Bytes that are not UTF-8 (a lock name is
// any bytes) print as U+FFFD instead of failing the command.
std::string Print(const Json& j) {
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

Json NumOrNull(const std::optional<uint64_t>& v) { return v ? Json(*v) : Json(nullptr); }
uint64_t Ms(absl::Duration d) { return static_cast<uint64_t>(absl::ToInt64Milliseconds(d)); }


}  // namespace

LockctlCode LockctlCodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return {"OK", 0};
    case absl::StatusCode::kInvalidArgument:
      return {"INVALID_ARGUMENT", 2};
    case absl::StatusCode::kNotFound:
      return {"NOT_FOUND", 4};
    case absl::StatusCode::kFailedPrecondition:
      // lockd's UNSUPPORTED_VERSION and FAILED_PRECONDITION both arrive as this.
      if (s.message().find("protocol version") != absl::string_view::npos) {
        return {"UNSUPPORTED_VERSION", 8};
      }
      return {"FAILED_PRECONDITION", 5};
    case absl::StatusCode::kAborted:
      return {"FENCED_OUT", 6};
    case absl::StatusCode::kPermissionDenied:
      return {"PERMISSION_DENIED", 7};
    case absl::StatusCode::kResourceExhausted:
      return {"LIMIT_EXCEEDED", 9};
    case absl::StatusCode::kDeadlineExceeded:  // lockd did not answer in time: unreachable
      return {"DEADLINE_EXCEEDED", 1};
    default:
      return {"UNAVAILABLE", 1};
  }
}

namespace {

class PoolCommand {
 public:
  PoolCommand(bool json) : json_(json) {}

  // Prints `fields` (JSON) or `text`, and returns exit 0.
  int Done(Json fields, const std::string& text) {
    if (json_) {
      fields["ok"] = Json(true);
      fields["code"] = Json("OK");
      std::printf("%s", Print(fields).c_str());
    } else if (!text.empty()) {
      std::printf("%s\n", text.c_str());
    }
    return 0;
  }
  int Failed(const absl::Status& s) {
    const LockctlCode c = LockctlCodeOf(s);
    if (json_) {
      Json out = Json::object();
      out["ok"] = Json(false);
      out["code"] = Json(c.name);
      out["message"] = Json(std::string(s.message()));
      std::printf("%s", Print(out).c_str());
    }
    logging::Program().Error(absl::StrFormat("%s: %s", c.name, std::string(s.message()).c_str()));
    return c.exit;
  }
  int Usage(const std::string& why) {
    logging::Program().Error(why);
    if (json_) {
      Json out = Json::object();
      out["ok"] = Json(false);
      out["code"] = Json("USAGE");
      out["message"] = Json(why);
      std::printf("%s", Print(out).c_str());
    }
    return 2;
  }

 private:
  bool json_;
};

Json StatusJson(const PoolView& v) {
  Json out = Json::object();
  auto& f = out;
  f["pool"] = Json(v.pool);
  f["generation"] = Json(v.generation);
  f["budget"] = Json(v.budget);
  f["used_units"] = Json(v.used_units);
  f["free_units"] = Json(v.budget - std::min(v.budget, v.used_units));
  f["decision"] = Json(v.decision);
  f["draining"] = Json(v.draining);
  f["complete"] = Json(v.complete);
  f["degraded"] = v.degraded.empty() ? Json(nullptr) : Json(v.degraded);
  f["tombstones_kept"] = Json(v.tombstones_kept);
  Json profiles = Json::array();
  for (const PoolProfileView& p : v.profiles) {
    Json s = Json::object();
    auto& g = s;
    g["id"] = Json(p.profile.id);
    g["cost"] = Json(p.profile.cost);
    g["reserved"] = Json(p.profile.reserved);
    g["lendable"] = Json(p.profile.lendable);
    g["borrow"] = Json(p.profile.borrow);
    g["active_units"] = Json(p.active_units);
    g["provisional_units"] = Json(p.provisional_units);
    g["pending_units"] = NumOrNull(p.pending_units);
    g["withheld_units"] = NumOrNull(p.withheld_units);
    g["demand_expires_in_ms"] =
        p.demand_expires_in ? Json(Ms(*p.demand_expires_in)) : Json(nullptr);
    g["owner_epoch"] = Json(p.owner_epoch);
    g["acked_generation"] = Json(p.acked_generation);
    g["compatible"] = Json(p.compatible);
    profiles.push_back(std::move(s));
  }
  Json leases = Json::array();
  for (const PoolLeaseView& l : v.leases) {
    Json s = Json::object();
    auto& g = s;
    g["profile"] = Json(l.profile);
    g["slot"] = Json(l.slot);
    g["token"] = Json(l.token);
    g["units"] = Json(l.units);
    g["epoch"] = Json(l.epoch);
    g["state"] = Json(l.active ? "active" : "provisional");
    g["expires_in_ms"] = l.active ? Json(nullptr) : Json(Ms(l.expires_in));
    g["decision"] = Json(l.decision);
    leases.push_back(std::move(s));
  }
  Json tombstones = Json::array();
  for (const PoolTombstone& t : v.tombstones) {
    Json s = Json::object();
    auto& g = s;
    g["profile"] = Json(t.profile);
    g["slot"] = Json(t.slot);
    g["token"] = Json(t.token);
    g["units"] = Json(t.units);
    g["decision"] = Json(t.decision);
    g["evidence"] = Json(t.evidence);
    tombstones.push_back(std::move(s));
  }
  f["profiles"] = std::move(profiles);
  f["leases"] = std::move(leases);
  f["tombstones"] = std::move(tombstones);
  return out;
}

std::string Optional(const std::optional<uint64_t>& v) {
  return v ? std::to_string(*v) : std::string("unknown");
}

void PrintStatus(const PoolView& v) {
  std::vector<std::string> missing;
  for (const PoolProfileView& p : v.profiles) {
    if (!p.compatible) missing.push_back(p.profile.id);
  }
  std::printf("pool %s: generation %lu, budget %lu, %lu units leased, %lu free, decision %lu\n",
              v.pool.c_str(), static_cast<unsigned long>(v.generation),
              static_cast<unsigned long>(v.budget), static_cast<unsigned long>(v.used_units),
              static_cast<unsigned long>(v.budget - std::min(v.budget, v.used_units)),
              static_cast<unsigned long>(v.decision));
  if (v.complete) {
    std::printf("  guarantee   complete: every profile has a manager on generation %lu\n",
                static_cast<unsigned long>(v.generation));
  } else {
    std::string list;
    for (const std::string& m : missing) absl::StrAppend(&list, list.empty() ? "" : ", ", m);
    std::printf("  guarantee   INCOMPLETE: no compatible manager for %s\n", list.c_str());
  }
  if (v.draining) std::printf("  draining    no new admission (lockctl pool drain --off ends it)\n");
  if (!v.degraded.empty()) std::printf("  DEGRADED    %s\n", v.degraded.c_str());
  std::printf("%-16s %5s %-16s %7s %12s %8s %9s %10s %s\n", "PROFILE", "COST", "RESERVED",
              "ACTIVE", "PROVISIONAL", "PENDING", "WITHHELD", "DEMAND", "MANAGER");
  for (const PoolProfileView& p : v.profiles) {
    std::string reserved = p.profile.reserved == 0
                               ? std::string("-")
                               : absl::StrCat(p.profile.reserved,
                                              p.profile.lendable ? " lendable" : " kept");
    if (p.profile.borrow) absl::StrAppend(&reserved, reserved == "-" ? "" : ",", " borrows");
    const std::string demand =
        p.demand_expires_in ? absl::StrCat(absl::ToInt64Seconds(*p.demand_expires_in), "s left")
                            : std::string("-");
    const std::string manager =
        p.owner_epoch == 0 ? std::string("none")
                           : absl::StrCat("epoch ", p.owner_epoch, ", generation ",
                                          p.acked_generation, p.compatible ? "" : " (stale)");
    std::printf("%-16s %5lu %-16s %7lu %12lu %8s %9s %10s %s\n", p.profile.id.c_str(),
                static_cast<unsigned long>(p.profile.cost), reserved.c_str(),
                static_cast<unsigned long>(p.active_units),
                static_cast<unsigned long>(p.provisional_units), Optional(p.pending_units).c_str(),
                Optional(p.withheld_units).c_str(), demand.c_str(), manager.c_str());
  }
  if (!v.leases.empty()) {
    std::printf("%-16s %-20s %10s %5s %-12s %6s %8s\n", "LEASE PROFILE", "SLOT", "TOKEN", "UNITS",
                "STATE", "EPOCH", "DECISION");
    for (const PoolLeaseView& l : v.leases) {
      const std::string state =
          l.active ? std::string("active")
                   : absl::StrCat("prov ", absl::ToInt64Milliseconds(l.expires_in) / 1000, "s");
      std::printf("%-16s %-20s %10lu %5lu %-12s %6lu %8lu\n", l.profile.c_str(), l.slot.c_str(),
                  static_cast<unsigned long>(l.token), static_cast<unsigned long>(l.units),
                  state.c_str(), static_cast<unsigned long>(l.epoch),
                  static_cast<unsigned long>(l.decision));
    }
  }
  for (const PoolTombstone& t : v.tombstones) {
    std::printf("  tombstone   %s/%s token %lu (%lu units) recovered at decision %lu: %s\n",
                t.profile.c_str(), t.slot.c_str(), static_cast<unsigned long>(t.token),
                static_cast<unsigned long>(t.units), static_cast<unsigned long>(t.decision),
                t.evidence.c_str());
  }
}

}  // namespace

std::string JsonString(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Why `lockctl pool SUB` cannot run with the flags given (naming what is missing or wrong), or
// "" when it can.
std::string PoolUsageProblem(const std::string& sub, bool json,
                             const std::vector<std::string>& command) {
  const std::string pool = absl::GetFlag(FLAGS_pool);
  const std::string profile = absl::GetFlag(FLAGS_profile);
  const std::string slot = absl::GetFlag(FLAGS_slot);
  const uint64_t token = absl::GetFlag(FLAGS_token);
  auto need = [&](std::initializer_list<std::pair<const char*, bool>> flags) -> std::string {
    for (const auto& [name, present] : flags) {
      if (!present) return absl::StrCat("pool ", sub, " needs --", name);
    }
    return "";
  };
  static const char* const kSubs[] = {"publish", "claim",   "ack",     "set-demand", "acquire",
                                      "renew",   "activate", "release", "recover",    "drain",
                                      "status",  "stop",     "delete",  "run"};
  if (std::find(std::begin(kSubs), std::end(kSubs), sub) == std::end(kSubs)) {
    return absl::StrCat(
        "unknown pool command \"", sub,
        "\"; use publish, claim, ack, set-demand, acquire, renew, activate, release, recover, "
        "drain, status, stop, delete or run");
  }
  std::string missing;
  if (sub == "publish") {
    missing = need({{"pool", !pool.empty()},
                    {"generation", absl::GetFlag(FLAGS_generation) != 0},
                    {"budget", absl::GetFlag(FLAGS_budget) != 0},
                    {"profiles", !absl::GetFlag(FLAGS_profiles).empty()}});
  } else if (sub == "claim" || sub == "ack") {
    missing = need({{"pool", !pool.empty()},
                    {"profile", !profile.empty()},
                    {"generation", absl::GetFlag(FLAGS_generation) != 0}});
  } else if (sub == "set-demand") {
    missing = need({{"pool", !pool.empty()}, {"profile", !profile.empty()}});
  } else if (sub == "acquire" || sub == "run") {
    missing = need({{"pool", !pool.empty()}, {"profile", !profile.empty()}, {"slot", !slot.empty()}});
  } else if (sub == "renew" || sub == "activate" || sub == "release" || sub == "recover") {
    missing = need({{"pool", !pool.empty()},
                    {"profile", !profile.empty()},
                    {"slot", !slot.empty()},
                    {"token", token != 0}});
  } else if (sub == "drain" || sub == "status" || sub == "delete") {
    missing = need({{"pool", !pool.empty()}});
  }
  if (!missing.empty()) return missing;
  if ((sub == "run") != !command.empty()) {
    return sub == "run" ? std::string("pool run needs the command to run after --")
                        : absl::StrCat("pool ", sub, " takes no command");
  }
  if (sub == "run" && json) return "pool run prints no JSON: its output is CMD's";
  if (absl::GetFlag(FLAGS_ttl) < absl::ZeroDuration()) {
    return "--ttl must not be negative";
  }
  return "";
}

int PoolMain(const std::string& sub, const PoolClientOptions& client_options, bool json,
             const std::vector<std::string>& command) {
  PoolCommand cmd(json);
  const std::string pool = absl::GetFlag(FLAGS_pool);
  const std::string profile = absl::GetFlag(FLAGS_profile);
  const std::string slot = absl::GetFlag(FLAGS_slot);
  const uint64_t token = absl::GetFlag(FLAGS_token);
  auto owner = [&]() -> absl::StatusOr<PoolOwnerId> {
    std::string text = absl::GetFlag(FLAGS_owner);
    if (text.empty()) {
      const char* env = std::getenv("FENCELOCK_POOL_OWNER");
      text = env == nullptr ? "" : env;
    }
    if (text.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool ", sub, " needs --owner (or $FENCELOCK_POOL_OWNER): what `pool claim` printed"));
    }
    return PoolOwnerId::Parse(text);
  };
  if (std::string problem = PoolUsageProblem(sub, json, command); !problem.empty()) {
    return cmd.Usage(problem);
  }
  std::vector<PoolProfileDef> profiles;
  if (sub == "publish") {
    const std::vector<std::string> texts =
        absl::StrSplit(absl::GetFlag(FLAGS_profiles), ',', absl::SkipEmpty());
    for (const std::string& text : texts) {
      auto def = PoolProfileDef::Parse(text);
      if (!def.ok()) return cmd.Usage(std::string(def.status().message()));
      profiles.push_back(*def);
    }
  }
  absl::StatusOr<PoolOwnerId> who = PoolOwnerId{};
  if (sub == "ack" || sub == "set-demand" || sub == "acquire" || sub == "renew" ||
      sub == "activate" || sub == "release" || sub == "run") {
    who = owner();
    if (!who.ok()) return cmd.Usage(std::string(who.status().message()));
  }
  if (sub == "run") return PoolRun(client_options, *who, command);
  auto client = PoolClient::Create(client_options);
  if (!client.ok()) return cmd.Usage(std::string(client.status().message()));
  PoolClient& c = **client;
  Json out = Json::object();
  auto& f = out;
  if (sub == "publish") {
    auto g = c.publish(pool, absl::GetFlag(FLAGS_generation), absl::GetFlag(FLAGS_budget), profiles);
    if (!g.ok()) return cmd.Failed(g.status());
    f["generation"] = Json(*g);
    return cmd.Done(out, std::to_string(*g));
  }
  if (sub == "claim") {
    auto o = c.claim(pool, profile, absl::GetFlag(FLAGS_generation));
    if (!o.ok()) return cmd.Failed(o.status());
    f["owner"] = Json(o->ToString());
    f["epoch"] = Json(o->epoch);
    return cmd.Done(out, o->ToString());
  }
  if (sub == "ack") {
    absl::Status s = c.ack(pool, profile, *who, absl::GetFlag(FLAGS_generation));
    return s.ok() ? cmd.Done(out, "") : cmd.Failed(s);
  }
  if (sub == "set-demand") {
    absl::Status s = c.setDemand(pool, profile, *who, absl::GetFlag(FLAGS_slots));
    return s.ok() ? cmd.Done(out, "") : cmd.Failed(s);
  }
  if (sub == "acquire") {
    auto g = c.acquire(pool, profile, slot, *who, absl::GetFlag(FLAGS_ttl));
    if (!g.ok()) return cmd.Failed(g.status());
    f["granted"] = Json(g->granted);
    if (!g->granted) {
      f["refusal"] = Json(g->refusal);
      if (json) {
        f["ok"] = Json(false);
        f["code"] = Json("REFUSED");
        std::printf("%s", Print(out).c_str());
      }
      logging::Program().Error(absl::StrFormat("REFUSED: %s", g->refusal.c_str()));
      return 3;
    }
    f["token"] = Json(g->token);
    f["ttl_ms"] = Json(Ms(g->ttl));
    f["decision"] = Json(g->decision);
    return cmd.Done(out, std::to_string(g->token));
  }
  if (sub == "renew") {
    auto ttl = c.renew(pool, profile, slot, token, *who);
    if (!ttl.ok()) return cmd.Failed(ttl.status());
    f["ttl_ms"] = Json(Ms(*ttl));
    return cmd.Done(out, absl::FormatDuration(*ttl));
  }
  if (sub == "activate" || sub == "release" || sub == "recover") {
    auto d = sub == "activate"  ? c.activate(pool, profile, slot, token, *who)
             : sub == "release" ? c.release(pool, profile, slot, token, *who)
                                : c.recover(pool, profile, slot, token, absl::GetFlag(FLAGS_evidence));
    if (!d.ok()) return cmd.Failed(d.status());
    f["decision"] = Json(*d);
    return cmd.Done(out, std::to_string(*d));
  }
  if (sub == "drain") {
    absl::Status s = c.drain(pool, !absl::GetFlag(FLAGS_off));
    return s.ok() ? cmd.Done(out, "") : cmd.Failed(s);
  }
  if (sub == "status") {
    auto v = c.status(pool);
    if (!v.ok()) return cmd.Failed(v.status());
    if (json) return cmd.Done(StatusJson(*v), "");
    PrintStatus(*v);
    return 0;
  }
  if (sub == "delete") {
    absl::Status s = c.deletePool(pool);
    return s.ok() ? cmd.Done(out, "") : cmd.Failed(s);
  }
  absl::Status s = c.stop();  // "stop"
  return s.ok() ? cmd.Done(out, "lockd stops") : cmd.Failed(s);
}

}  // namespace fencelock
