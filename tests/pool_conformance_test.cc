// The admission pools' protocol conformance fixtures (protocol/conformance/pool_*.txt), run by
// both clients against a fresh lockd each: the C++ library (fencelock::PoolClient) and lockctl's
// `pool` commands (--json, and its exit status). ADR-0003: "fixed and autoscaled clients pass
// the same protocol conformance fixtures".
#include <sys/wait.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lock-client/pool_client.h"
#include "lockd_process.h"

namespace fencelock {
namespace {

using Outcome = std::map<std::string, std::string>;
using testing::LockdProcess;

struct Step {
  int line = 0;
  std::string op;
  std::map<std::string, std::string> args;
  std::map<std::string, std::string> expect;
  std::map<std::string, std::string> capture;  // NAME -> outcome field
};

std::vector<Step> LoadFixtures() {
  std::ifstream in(FIXTURES);
  EXPECT_TRUE(in.good()) << "cannot read " << FIXTURES;
  std::vector<Step> steps;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words[0] != "expect") {
      Step s;
      s.line = number;
      s.op = words[0];
      for (size_t i = 1; i < words.size(); ++i) {
        std::vector<std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
        s.args[kv[0]] = kv.size() > 1 ? kv[1] : "";
      }
      steps.push_back(std::move(s));
      continue;
    }
    EXPECT_FALSE(steps.empty()) << "line " << number << ": expect before any step";
    Step& s = steps.back();
    for (size_t i = 1; i < words.size(); ++i) {
      if (words[i] == "capture" && i + 1 < words.size()) {
        std::vector<std::string> kv = absl::StrSplit(words[++i], absl::MaxSplits('=', 1));
        s.capture[kv[0]] = kv[1];
        continue;
      }
      std::vector<std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
      s.expect[kv[0]] = kv.size() > 1 ? kv[1] : "";
    }
  }
  return steps;
}

// Runs every step through `run` and checks its outcome; captures carry values forward.
void RunFixtures(const std::function<Outcome(const Step&)>& run) {
  std::map<std::string, std::string> captured;
  auto expand = [&](const std::string& v) {
    return !v.empty() && v[0] == '$' ? captured[v.substr(1)] : v;
  };
  const std::vector<Step> steps = LoadFixtures();
  ASSERT_GT(steps.size(), 10u);
  for (Step step : steps) {
    for (auto& [k, v] : step.args) v = expand(v);
    SCOPED_TRACE(absl::StrCat(FIXTURES, " line ", step.line, ": ", step.op));
    const Outcome got = run(step);
    for (const auto& [k, v] : step.expect) {
      auto it = got.find(k);
      ASSERT_NE(it, got.end()) << "no " << k << " in the outcome";
      EXPECT_EQ(it->second, expand(v)) << k;
    }
    for (const auto& [name, field] : step.capture) {
      auto it = got.find(field);
      ASSERT_NE(it, got.end()) << "no " << field << " to capture";
      captured[name] = it->second;
    }
  }
}

std::string Arg(const Step& s, const std::string& key) {
  auto it = s.args.find(key);
  return it == s.args.end() ? "" : it->second;
}
uint64_t Num(const Step& s, const std::string& key) {
  uint64_t v = 0;
  (void)absl::SimpleAtoi(Arg(s, key), &v);
  return v;
}

std::string CodeName(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return "OK";
    case absl::StatusCode::kNotFound:
      return "NOT_FOUND";
    case absl::StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case absl::StatusCode::kAborted:
      return "FENCED_OUT";
    case absl::StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case absl::StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    default:
      return "UNAVAILABLE";
  }
}

std::string Bool(bool b) { return b ? "true" : "false"; }
template <typename T>
std::string Opt(const std::optional<T>& v) {
  return v ? absl::StrCat(*v) : "null";
}

// The library's outcome of one step.
Outcome ThroughLibrary(PoolClient& c, const Step& s) {
  Outcome out;
  const std::string pool = Arg(s, "pool"), profile = Arg(s, "profile"), slot = Arg(s, "slot");
  auto owner = [&]() { return PoolOwnerId::Parse(Arg(s, "owner")).value_or(PoolOwnerId{}); };
  absl::Status status;
  if (s.op == "publish") {
    std::vector<PoolProfileDef> defs;
    for (const std::string& text : std::vector<std::string>(absl::StrSplit(Arg(s, "profiles"), ','))) {
      defs.push_back(PoolProfileDef::Parse(text).value());
    }
    auto g = c.publish(pool, Num(s, "generation"), Num(s, "budget"), defs);
    status = g.status();
    if (g.ok()) out["generation"] = absl::StrCat(*g);
  } else if (s.op == "claim") {
    auto o = c.claim(pool, profile, Num(s, "generation"));
    status = o.status();
    if (o.ok()) {
      out["owner"] = o->ToString();
      out["epoch"] = absl::StrCat(o->epoch);
    }
  } else if (s.op == "ack") {
    status = c.ack(pool, profile, owner(), Num(s, "generation"));
  } else if (s.op == "set-demand") {
    status = c.setDemand(pool, profile, owner(), Num(s, "slots"));
  } else if (s.op == "acquire") {
    auto g = c.acquire(pool, profile, slot, owner(), absl::ZeroDuration());
    status = g.status();
    if (g.ok()) {
      out["granted"] = Bool(g->granted);
      if (g->granted) {
        out["token"] = absl::StrCat(g->token);
        out["decision"] = absl::StrCat(g->decision);
      } else {
        out["code"] = "REFUSED";
      }
    }
  } else if (s.op == "renew") {
    status = c.renew(pool, profile, slot, Num(s, "token"), owner()).status();
  } else if (s.op == "activate" || s.op == "release" || s.op == "recover") {
    auto d = s.op == "activate"  ? c.activate(pool, profile, slot, Num(s, "token"), owner())
             : s.op == "release" ? c.release(pool, profile, slot, Num(s, "token"), owner())
                                 : c.recover(pool, profile, slot, Num(s, "token"), Arg(s, "evidence"));
    status = d.status();
    if (d.ok()) out["decision"] = absl::StrCat(*d);
  } else if (s.op == "drain") {
    status = c.drain(pool, true);
  } else if (s.op == "stop") {
    status = c.stop();
  } else if (s.op == "delete") {
    status = c.deletePool(pool);
  } else if (s.op == "status") {
    auto v = c.status(pool);
    status = v.status();
    if (v.ok()) {
      out["generation"] = absl::StrCat(v->generation);
      out["budget"] = absl::StrCat(v->budget);
      out["used_units"] = absl::StrCat(v->used_units);
      out["complete"] = Bool(v->complete);
      out["draining"] = Bool(v->draining);
      out["leases"] = absl::StrCat(v->leases.size());
      out["tombstones"] = absl::StrCat(v->tombstones.size());
      for (const PoolProfileView& p : v->profiles) {
        const std::string k = "profile." + p.profile.id + ".";
        out[k + "pending_units"] = Opt(p.pending_units);
        out[k + "withheld_units"] = Opt(p.withheld_units);
        out[k + "active_units"] = absl::StrCat(p.active_units);
        out[k + "compatible"] = Bool(p.compatible);
      }
      for (const PoolLeaseView& l : v->leases) {
        out["lease." + l.slot + ".state"] = l.active ? "active" : "provisional";
        out["lease." + l.slot + ".token"] = absl::StrCat(l.token);
      }
    }
  } else {
    ADD_FAILURE() << "unknown op " << s.op;
  }
  if (!out.contains("code")) out["code"] = CodeName(status);
  return out;
}

// Managers reach pools on lockd's Unix socket (ADR 0004).
TEST(PoolConformanceTest, TheLibraryPassesTheFixtures) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  auto client = PoolClient::Create({.server = "unix:" + lockd.unix_path()});
  ASSERT_TRUE(client.ok());
  RunFixtures([&](const Step& s) { return ThroughLibrary(**client, s); });
}

// A small JSON reader for lockctl's output (protobuf's Struct is not usable under
// ThreadSanitizer with Debian's uninstrumented libprotobuf).
struct JsonNode {
  enum Kind { kScalar, kList, kObject } kind = kScalar;
  std::string scalar;  // numbers, true/false/null as written; strings unquoted
  std::vector<JsonNode> items;
  std::vector<std::pair<std::string, JsonNode>> members;
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : t_(text) {}
  bool Parse(JsonNode* out) {
    if (!Value(out)) return false;
    Space();
    return i_ == t_.size();
  }

 private:
  void Space() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  bool String(std::string* out) {
    if (t_[i_] != '"') return false;
    for (++i_; i_ < t_.size() && t_[i_] != '"'; ++i_) {
      if (t_[i_] == '\\' && i_ + 1 < t_.size()) {
        const char e = t_[++i_];
        if (e == 'u' && i_ + 4 < t_.size()) {
          *out += static_cast<char>(std::stoi(t_.substr(i_ + 1, 4), nullptr, 16));
          i_ += 4;
        } else {
          *out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        }
      } else {
        *out += t_[i_];
      }
    }
    if (i_ >= t_.size()) return false;
    ++i_;
    return true;
  }
  bool Value(JsonNode* out) {
    Space();
    if (i_ >= t_.size()) return false;
    const char c = t_[i_];
    if (c == '"') return String(&out->scalar);
    if (c == '[' || c == '{') {
      const bool list = c == '[';
      out->kind = list ? JsonNode::kList : JsonNode::kObject;
      ++i_;
      Space();
      if (i_ < t_.size() && t_[i_] == (list ? ']' : '}')) {
        ++i_;
        return true;
      }
      for (;;) {
        Space();
        if (list) {
          out->items.emplace_back();
          if (!Value(&out->items.back())) return false;
        } else {
          std::string key;
          if (!String(&key)) return false;
          Space();
          if (i_ >= t_.size() || t_[i_++] != ':') return false;
          out->members.emplace_back(key, JsonNode{});
          if (!Value(&out->members.back().second)) return false;
        }
        Space();
        if (i_ >= t_.size()) return false;
        if (t_[i_] == ',') {
          ++i_;
          continue;
        }
        if (t_[i_++] != (list ? ']' : '}')) return false;
        return true;
      }
    }
    const size_t start = i_;
    while (i_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[i_])) || t_[i_] == '-' ||
                              t_[i_] == '.')) {
      ++i_;
    }
    out->scalar = t_.substr(start, i_ - start);
    return i_ > start;
  }

  const std::string& t_;
  size_t i_ = 0;
};

// lockctl's outcome: its --json object, flattened the way the fixtures name fields, and its
// exit status checked against the code (docs/admission.md's table).
Outcome ThroughLockctl(const std::string& server, const Step& s) {
  std::string cmd = absl::StrCat(LOCKCTL_BINARY, " --server=", server, " --json pool ", s.op);
  for (const auto& [k, v] : s.args) absl::StrAppend(&cmd, " '--", k, "=", v, "'");
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) text.append(buf, n);
  const int status = pclose(p);
  const int exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  JsonNode json;
  EXPECT_TRUE(JsonReader(text).Parse(&json) && json.kind == JsonNode::kObject) << text;
  Outcome out;
  for (const auto& [k, v] : json.members) {
    if (v.kind == JsonNode::kList) {
      out[k] = absl::StrCat(v.items.size());
      for (const JsonNode& item : v.items) {
        std::map<std::string, std::string> f;
        for (const auto& [fk, fv] : item.members) f[fk] = fv.scalar;
        const std::string prefix = k == "profiles" ? "profile." + f["id"] + "."
                                   : k == "leases" ? "lease." + f["slot"] + "."
                                                   : k + ".";
        for (const auto& [fk, fv] : f) out[prefix + fk] = fv;
      }
    } else {
      out[k] = v.scalar;
    }
  }
  static const std::map<std::string, int> kExit = {
      {"OK", 0},          {"INVALID_ARGUMENT", 2}, {"REFUSED", 3},          {"NOT_FOUND", 4},
      {"FAILED_PRECONDITION", 5}, {"FENCED_OUT", 6}, {"PERMISSION_DENIED", 7}, {"UNAVAILABLE", 1}};
  auto want = kExit.find(out["code"]);
  EXPECT_NE(want, kExit.end()) << "code " << out["code"];
  if (want != kExit.end()) {
    EXPECT_EQ(exit_code, want->second) << "lockctl's exit for " << out["code"];
  }
  return out;
}

TEST(PoolConformanceTest, LockctlPassesTheFixtures) {
  LockdProcess lockd(LockdProcess::Options{.unix_socket = true});
  RunFixtures([&](const Step& s) { return ThroughLockctl("unix:" + lockd.unix_path(), s); });
}

}  // namespace
}  // namespace fencelock
