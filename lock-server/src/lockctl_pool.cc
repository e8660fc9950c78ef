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
#include "lockctl_pool.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

// A JSON value, written by hand: protobuf's google.protobuf.Struct lives in Debian's
// libprotobuf, whose map layout differs from what a ThreadSanitizer build's headers expect.
class Json {
 public:
  static Json Object() { return Json(kObject); }
  static Json List() { return Json(kList); }
  static Json Null() { return Json(kNull); }
  static Json Bool(bool b) {
    Json j(kBool);
    j.bool_ = b;
    return j;
  }
  static Json Num(uint64_t n) {
    Json j(kNumber);
    j.number_ = n;
    return j;
  }
  static Json Str(std::string s) {
    Json j(kString);
    j.string_ = std::move(s);
    return j;
  }
  // Object: the member `key`, created (null) if absent; members print in key order.
  Json& operator[](const std::string& key) { return members_[key]; }
  // List: appends `v`.
  void Append(Json v) { items_.push_back(std::move(v)); }
  std::string Print() const {
    std::string out;
    PrintTo(&out, 0);
    return out + "\n";
  }
  Json() = default;

 private:
  enum Kind { kNull, kBool, kNumber, kString, kList, kObject };
  explicit Json(Kind kind) : kind_(kind) {}
  static void Quote(const std::string& s, std::string* out) {
    *out += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            *out += buf;
          } else {
            *out += static_cast<char>(c);
          }
      }
    }
    *out += '"';
  }
  void PrintTo(std::string* out, int depth) const {
    const std::string pad(2 * (depth + 1), ' '), end(2 * depth, ' ');
    switch (kind_) {
      case kNull: *out += "null"; return;
      case kBool: *out += bool_ ? "true" : "false"; return;
      case kNumber: *out += std::to_string(number_); return;
      case kString: Quote(string_, out); return;
      case kList: {
        if (items_.empty()) { *out += "[]"; return; }
        *out += "[\n";
        for (size_t i = 0; i < items_.size(); ++i) {
          *out += pad;
          items_[i].PrintTo(out, depth + 1);
          *out += i + 1 < items_.size() ? ",\n" : "\n";
        }
        *out += end + "]";
        return;
      }
      case kObject: {
        if (members_.empty()) { *out += "{}"; return; }
        *out += "{\n";
        size_t i = 0;
        for (const auto& [key, value] : members_) {
          *out += pad;
          Quote(key, out);
          *out += ": ";
          value.PrintTo(out, depth + 1);
          *out += ++i < members_.size() ? ",\n" : "\n";
        }
        *out += end + "}";
        return;
      }
    }
  }

  Kind kind_ = kNull;
  bool bool_ = false;
  uint64_t number_ = 0;
  std::string string_;
  std::vector<Json> items_;
  std::map<std::string, Json> members_;
};

Json Num(uint64_t v) { return Json::Num(v); }
Json Str(const std::string& s) { return Json::Str(s); }
Json Bool(bool b) { return Json::Bool(b); }
Json Null() { return Json::Null(); }
template <typename T>
Json NumOrNull(const std::optional<T>& v) {
  return v ? Num(static_cast<uint64_t>(*v)) : Null();
}
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
      fields["ok"] = Bool(true);
      fields["code"] = Str("OK");
      std::printf("%s", fields.Print().c_str());
    } else if (!text.empty()) {
      std::printf("%s\n", text.c_str());
    }
    return 0;
  }
  int Failed(const absl::Status& s) {
    const LockctlCode c = LockctlCodeOf(s);
    if (json_) {
      Json out = Json::Object();
      out["ok"] = Bool(false);
      out["code"] = Str(c.name);
      out["message"] = Str(std::string(s.message()));
      std::printf("%s", out.Print().c_str());
    }
    std::fprintf(stderr, "lockctl: %s: %s\n", c.name, std::string(s.message()).c_str());
    return c.exit;
  }
  int Usage(const std::string& why) {
    std::fprintf(stderr, "lockctl: %s\n", why.c_str());
    if (json_) {
      Json out = Json::Object();
      out["ok"] = Bool(false);
      out["code"] = Str("USAGE");
      out["message"] = Str(why);
      std::printf("%s", out.Print().c_str());
    }
    return 2;
  }

 private:
  bool json_;
};

Json StatusJson(const PoolView& v) {
  Json out = Json::Object();
  auto& f = out;
  f["pool"] = Str(v.pool);
  f["generation"] = Num(v.generation);
  f["budget"] = Num(v.budget);
  f["used_units"] = Num(v.used_units);
  f["free_units"] = Num(v.budget - std::min(v.budget, v.used_units));
  f["decision"] = Num(v.decision);
  f["draining"] = Bool(v.draining);
  f["complete"] = Bool(v.complete);
  f["degraded"] = v.degraded.empty() ? Null() : Str(v.degraded);
  f["tombstones_kept"] = Num(v.tombstones_kept);
  Json profiles = Json::List();
  for (const PoolProfileView& p : v.profiles) {
    Json s = Json::Object();
    auto& g = s;
    g["id"] = Str(p.profile.id);
    g["cost"] = Num(p.profile.cost);
    g["reserved"] = Num(p.profile.reserved);
    g["lendable"] = Bool(p.profile.lendable);
    g["borrow"] = Bool(p.profile.borrow);
    g["active_units"] = Num(p.active_units);
    g["provisional_units"] = Num(p.provisional_units);
    g["pending_units"] = NumOrNull(p.pending_units);
    g["withheld_units"] = NumOrNull(p.withheld_units);
    g["demand_expires_in_ms"] =
        p.demand_expires_in ? Num(Ms(*p.demand_expires_in)) : Null();
    g["owner_epoch"] = Num(p.owner_epoch);
    g["acked_generation"] = Num(p.acked_generation);
    g["compatible"] = Bool(p.compatible);
    profiles.Append(std::move(s));
  }
  Json leases = Json::List();
  for (const PoolLeaseView& l : v.leases) {
    Json s = Json::Object();
    auto& g = s;
    g["profile"] = Str(l.profile);
    g["slot"] = Str(l.slot);
    g["token"] = Num(l.token);
    g["units"] = Num(l.units);
    g["epoch"] = Num(l.epoch);
    g["state"] = Str(l.active ? "active" : "provisional");
    g["expires_in_ms"] = l.active ? Null() : Num(Ms(l.expires_in));
    g["decision"] = Num(l.decision);
    leases.Append(std::move(s));
  }
  Json tombstones = Json::List();
  for (const PoolTombstoneView& t : v.tombstones) {
    Json s = Json::Object();
    auto& g = s;
    g["profile"] = Str(t.profile);
    g["slot"] = Str(t.slot);
    g["token"] = Num(t.token);
    g["units"] = Num(t.units);
    g["decision"] = Num(t.decision);
    g["evidence"] = Str(t.evidence);
    tombstones.Append(std::move(s));
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
  for (const PoolTombstoneView& t : v.tombstones) {
    std::printf("  tombstone   %s/%s token %lu (%lu units) recovered at decision %lu: %s\n",
                t.profile.c_str(), t.slot.c_str(), static_cast<unsigned long>(t.token),
                static_cast<unsigned long>(t.units), static_cast<unsigned long>(t.decision),
                t.evidence.c_str());
  }
}

}  // namespace

std::string JsonString(const std::string& s) {
  std::string out = Json::Str(s).Print();
  out.pop_back();  // the newline
  return out;
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
  Json out = Json::Object();
  auto& f = out;
  if (sub == "publish") {
    auto g = c.publish(pool, absl::GetFlag(FLAGS_generation), absl::GetFlag(FLAGS_budget), profiles);
    if (!g.ok()) return cmd.Failed(g.status());
    f["generation"] = Num(*g);
    return cmd.Done(out, std::to_string(*g));
  }
  if (sub == "claim") {
    auto o = c.claim(pool, profile, absl::GetFlag(FLAGS_generation));
    if (!o.ok()) return cmd.Failed(o.status());
    f["owner"] = Str(o->ToString());
    f["epoch"] = Num(o->epoch);
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
    f["granted"] = Bool(g->granted);
    if (!g->granted) {
      f["refusal"] = Str(g->refusal);
      if (json) {
        f["ok"] = Bool(false);
        f["code"] = Str("REFUSED");
        std::printf("%s", out.Print().c_str());
      }
      std::fprintf(stderr, "lockctl: REFUSED: %s\n", g->refusal.c_str());
      return 3;
    }
    f["token"] = Num(g->token);
    f["ttl_ms"] = Num(Ms(g->ttl));
    f["decision"] = Num(g->decision);
    return cmd.Done(out, std::to_string(g->token));
  }
  if (sub == "renew") {
    auto ttl = c.renew(pool, profile, slot, token, *who);
    if (!ttl.ok()) return cmd.Failed(ttl.status());
    f["ttl_ms"] = Num(Ms(*ttl));
    return cmd.Done(out, absl::FormatDuration(*ttl));
  }
  if (sub == "activate" || sub == "release" || sub == "recover") {
    auto d = sub == "activate"  ? c.activate(pool, profile, slot, token, *who)
             : sub == "release" ? c.release(pool, profile, slot, token, *who)
                                : c.recover(pool, profile, slot, token, absl::GetFlag(FLAGS_evidence));
    if (!d.ok()) return cmd.Failed(d.status());
    f["decision"] = Num(*d);
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
