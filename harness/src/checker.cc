#include "harness/checker.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace fencelock::harness {
namespace {

// One step somewhere inside [begin, end], under `token`.
struct Step {
  int64_t begin = 0, end = 0;
  uint64_t token = 0;
  std::string who;  // for messages
};

std::string Describe(const Step& s) {
  return absl::StrCat(s.who, " token ", s.token, " [", s.begin, ", ", s.end, "]");
}

// Every pair a, b with b.begin > a.end must have b.token > a.token (strict) or >= (not strict).
// Sorting by end and by begin lets one pass find, for each b, the highest token among the steps
// that ended before it began.
void CheckRealTimeOrder(std::vector<Step> steps, bool strict, const std::string& what,
                        std::vector<std::string>* violations) {
  std::vector<Step> by_end = steps;
  std::sort(by_end.begin(), by_end.end(), [](const Step& a, const Step& b) { return a.end < b.end; });
  std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) { return a.begin < b.begin; });
  size_t i = 0;
  const Step* highest = nullptr;
  for (const Step& b : steps) {
    while (i < by_end.size() && by_end[i].end < b.begin) {
      if (highest == nullptr || by_end[i].token > highest->token) highest = &by_end[i];
      ++i;
    }
    if (highest == nullptr) continue;
    if (strict ? b.token <= highest->token : b.token < highest->token) {
      violations->push_back(absl::StrCat(what, ": ", Describe(b), " began after ",
                                         Describe(*highest), " ended, yet its token is ",
                                         strict ? "not higher" : "lower"));
    }
  }
}

bool IsHolderStep(const std::string& event) {
  // "held": a long holder's hold, ending at the last checkStillHeld that passed.
  static const std::set<std::string> kSteps = {"claimed", "marked-submitted", "status-asked",
                                               "step-started", "submitted", "paid", "held"};
  return kSteps.count(event) > 0;
}

bool IsStoreAdmit(const std::string& event) {
  return event == "claimed" || event == "marked-submitted" || event == "paid";
}

// A lockd replica's act (server_core.h's Act): at `at`, under an ownership held until `until`.
struct LockdAct {
  int64_t at = 0, until = 0;
  uint64_t token = 0;
  const history::Record* record = nullptr;
};

bool IsLockdAct(const std::string& event) {
  return event == "lockd-grant" || event == "lockd-renew" || event == "lockd-validate";
}

std::string Describe(const LockdAct& a) {
  return absl::StrCat(a.record->process, " ", a.record->event.substr(6), " ", a.record->key,
                      a.token != 0 ? absl::StrCat(" token ", a.token) : "", " at ", a.at);
}

// Check 5: one serving lockd at a time.
void CheckReplicas(const std::vector<history::Record>& records, CheckResult* result) {
  // A replica that ended its service (lockd-deposed) claims nothing from then on, until it
  // serves again (its next lockd-serving: it stood by again in the same process and took the
  // prefix over): it gave its lease on the prefix back, and a successor may serve at once.
  std::map<std::string, std::vector<int64_t>> deposed_at, serving_at;
  for (const auto& r : records) {
    if (r.event == "lockd-deposed") deposed_at[r.process].push_back(r.begin_ns);
    if (r.event == "lockd-serving") serving_at[r.process].push_back(r.begin_ns);
  }
  for (auto* times : {&deposed_at, &serving_at}) {
    for (auto& [process, t] : *times) std::sort(t.begin(), t.end());
  }
  std::map<std::string, std::vector<LockdAct>> by_replica;
  for (const auto& r : records) {
    if (!IsLockdAct(r.event)) continue;
    LockdAct act{.at = r.begin_ns, .until = INT64_MAX, .token = r.token, .record = &r};
    if (r.detail != "inf") {
      char* end = nullptr;
      act.until = std::strtoll(r.detail.c_str(), &end, 10);
      if (r.detail.empty() || *end != '\0') {
        result->violations.push_back(absl::StrCat(r.process, " recorded an act without its "
                                                  "ownership deadline: \"", r.detail, "\""));
        continue;
      }
    }
    if (act.at >= act.until) {
      result->violations.push_back(absl::StrCat(Describe(act), ", at or past its ownership deadline ",
                                                act.until));
    }
    if (auto d = deposed_at.find(r.process); d != deposed_at.end()) {
      // The service this act belongs to began at the replica's last lockd-serving before it.
      int64_t began = INT64_MIN;
      if (auto sv = serving_at.find(r.process); sv != serving_at.end()) {
        auto after = std::upper_bound(sv->second.begin(), sv->second.end(), act.at);
        if (after != sv->second.begin()) began = *std::prev(after);
      }
      const std::vector<int64_t>& ends = d->second;
      auto ended = std::lower_bound(ends.begin(), ends.end(), began);
      if (ended != ends.end() && *ended <= act.at) {
        result->violations.push_back(absl::StrCat(Describe(act), ", after it ended its service at ",
                                                  *ended));
      }
      if (auto next = std::upper_bound(ends.begin(), ends.end(), act.at); next != ends.end()) {
        act.until = std::min(act.until, *next);
      }
    }
    by_replica[r.process].push_back(act);
    ++result->lockd_acts;
  }
  // The deadline each act held, from the replica's own renewals rather than from the act: a
  // renewal's record (lockd-owned) is appended before its deadline takes effect, so an act may
  // rely only on deadlines recorded before the act's own record. This holds lockd to its
  // renewals even if its check of the deadline were broken.
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> owned;  // (end_ns, until)
  for (const auto& r : records) {
    if (r.event != "lockd-owned") continue;
    int64_t until = 0;
    char* end = nullptr;
    until = std::strtoll(r.detail.c_str(), &end, 10);
    if (r.detail.empty() || *end != '\0') {
      result->violations.push_back(absl::StrCat(r.process, " recorded an ownership without its "
                                                "deadline: \"", r.detail, "\""));
      continue;
    }
    owned[r.process].emplace_back(r.end_ns, until);
  }
  for (auto& [replica, renewals] : owned) {
    std::sort(renewals.begin(), renewals.end());
    auto acts = by_replica.find(replica);
    if (acts == by_replica.end()) continue;
    size_t reported = 0;
    for (const LockdAct& a : acts->second) {
      int64_t held = INT64_MIN;
      for (const auto& [recorded, until] : renewals) {
        if (recorded > a.record->end_ns) break;
        held = std::max(held, until);
      }
      if (a.at >= held && reported++ < 3) {
        result->violations.push_back(absl::StrCat(
            Describe(a), ", past the ownership deadline its renewals gave it (",
            held == INT64_MIN ? std::string("none recorded") : absl::StrCat(held), ")"));
      }
    }
  }

  // Each replica's claimed spans, merged: [at, until) of its acts.
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> claimed;
  for (auto& [replica, acts] : by_replica) {
    std::sort(acts.begin(), acts.end(), [](const LockdAct& a, const LockdAct& b) { return a.at < b.at; });
    auto& spans = claimed[replica];
    for (const LockdAct& a : acts) {
      if (!spans.empty() && a.at <= spans.back().second) {
        spans.back().second = std::max(spans.back().second, a.until);
      } else {
        spans.emplace_back(a.at, a.until);
      }
    }
  }
  for (const auto& [replica, acts] : by_replica) {
    for (const auto& [other, spans] : claimed) {
      if (other == replica) continue;
      size_t reported = 0;
      for (const LockdAct& a : acts) {
        // The last span of `other` that began at or before this act.
        auto it = std::upper_bound(spans.begin(), spans.end(), a.at,
                                   [](int64_t t, const auto& span) { return t < span.first; });
        if (it == spans.begin() || a.at >= std::prev(it)->second) continue;
        if (reported++ < 3) {
          result->violations.push_back(absl::StrCat(
              Describe(a), " while ", other, " still claimed the state (it acted at ",
              std::prev(it)->first, " under an ownership until ", std::prev(it)->second, ")"));
        }
      }
    }
  }
  // One token sequence across replicas.
  std::vector<const LockdAct*> grants;
  for (const auto& [replica, acts] : by_replica) {
    for (const LockdAct& a : acts) {
      if (a.record->event == "lockd-grant") grants.push_back(&a);
    }
  }
  std::sort(grants.begin(), grants.end(), [](const LockdAct* a, const LockdAct* b) {
    return a->at != b->at ? a->at < b->at : a->token < b->token;
  });
  for (size_t i = 1; i < grants.size(); ++i) {
    if (grants[i]->token <= grants[i - 1]->token) {
      result->violations.push_back(absl::StrCat("token sequence: ", Describe(*grants[i]),
                                                " after ", Describe(*grants[i - 1])));
    }
  }
}

}  // namespace

CheckResult Check(const std::vector<history::Record>& records) {
  CheckResult result;
  result.records = static_cast<int64_t>(records.size());

  // 1 and 2: grants.
  std::vector<Step> grants;
  absl::flat_hash_map<uint64_t, std::string> granted;  // token → "w1 for payout/3"
  for (const auto& r : records) {
    if (r.event != "acquire") continue;
    const std::string who = absl::StrCat(r.process, " for ", r.key);
    auto [it, fresh] = granted.emplace(r.token, who);
    if (!fresh) {
      result.violations.push_back(
          absl::StrCat("token ", r.token, " granted twice: to ", it->second, " and to ", who));
    }
    grants.push_back({r.begin_ns, r.end_ns, r.token, who});
  }
  result.grants = static_cast<int64_t>(grants.size());
  CheckRealTimeOrder(grants, /*strict=*/true, "grant order", &result.violations);

  // 3: the fences. The store's decisions come from the workers, timed by interval; the rail's
  // come in its own order.
  std::map<std::string, std::vector<Step>> store_admits;
  std::map<std::string, std::vector<Step>> store_refusals;
  std::map<std::string, uint64_t> rail_highest;
  std::map<std::string, int64_t> paid;
  for (const auto& r : records) {
    const Step step{r.begin_ns, r.end_ns, r.token, absl::StrCat(r.process, " ", r.event)};
    if (r.process == "rail") {
      ++result.fence_decisions;
      uint64_t& highest = rail_highest[r.key];
      if (r.event == "admit") {
        if (r.token < highest) {
          result.violations.push_back(absl::StrCat("rail fence for ", r.key, " admitted token ",
                                                   r.token, " after admitting ", highest));
        }
        highest = std::max(highest, r.token);
        if (absl::StartsWith(r.detail, "SUBMIT PAID")) {
          ++result.payments;
          if (++paid[r.key] == 2) {
            result.violations.push_back(absl::StrCat(r.key, " paid twice by the rail (second under token ",
                                                     r.token, ")"));
          }
        }
      } else if (r.event == "refuse" && r.token >= highest) {
        result.violations.push_back(absl::StrCat("rail fence for ", r.key, " refused token ", r.token,
                                                 " although the highest admitted was ", highest));
      }
    } else if (IsStoreAdmit(r.event)) {
      ++result.fence_decisions;
      store_admits[r.key].push_back(step);
    } else if (r.event == "fenced" && absl::StartsWith(r.detail, "store")) {
      ++result.fence_decisions;
      store_refusals[r.key].push_back(step);
    }
  }
  for (const auto& [key, admits] : store_admits) {
    CheckRealTimeOrder(admits, /*strict=*/false, absl::StrCat("store fence for ", key),
                       &result.violations);
  }
  // A refusal must have been of a token lower than one admitted before the refusal ended.
  for (const auto& [key, refusals] : store_refusals) {
    const auto& admits = store_admits[key];
    for (const Step& refused : refusals) {
      const bool justified = std::any_of(admits.begin(), admits.end(), [&](const Step& a) {
        return a.token > refused.token && a.begin < refused.end;
      });
      if (!justified) {
        result.violations.push_back(absl::StrCat("store fence for ", key, " refused ",
                                                 Describe(refused),
                                                 " with no higher token admitted before"));
      }
    }
  }

  CheckReplicas(records, &result);

  // Client-believed overlaps: per holder (process, token), from the grant received to its last
  // step as holder. Holders that both hold shared (an "acquire" whose detail is "shared", ADR
  // 0006) may overlap; any other pair may not.
  struct Holding {
    std::string key, process;
    uint64_t token = 0;
    int64_t from = 0, to = 0;
    bool shared = false;
  };
  std::map<std::pair<std::string, uint64_t>, Holding> holdings;
  for (const auto& r : records) {
    if (r.process == "rail" || r.token == 0) continue;
    auto id = std::make_pair(r.process, r.token);
    if (r.event == "acquire") {
      holdings[id] = {r.key, r.process, r.token, r.end_ns, r.end_ns, r.detail == "shared"};
    } else if (IsHolderStep(r.event)) {
      auto it = holdings.find(id);
      if (it != holdings.end()) it->second.to = std::max(it->second.to, r.end_ns);
    }
  }
  std::map<std::string, std::vector<const Holding*>> by_key;
  for (const auto& [id, h] : holdings) by_key[h.key].push_back(&h);
  for (auto& [key, hs] : by_key) {
    std::sort(hs.begin(), hs.end(), [](const Holding* a, const Holding* b) { return a->from < b->from; });
    for (size_t i = 0; i < hs.size(); ++i) {
      for (size_t j = i + 1; j < hs.size() && hs[j]->from < hs[i]->to; ++j) {
        if (hs[i]->shared && hs[j]->shared) continue;
        result.client_overlaps.push_back(absl::StrCat(
            key, ": ", hs[i]->process, " (token ", hs[i]->token, hs[i]->shared ? ", shared" : "",
            ") acted as holder until ", (hs[i]->to - hs[j]->from) / 1'000'000, " ms after ",
            hs[j]->process, " (token ", hs[j]->token, hs[j]->shared ? ", shared" : "",
            ") was granted"));
      }
    }
  }
  return result;
}

absl::StatusOr<CheckResult> CheckDirectory(const std::string& dir) {
  std::error_code ec;
  std::vector<history::Record> all;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".log") files.push_back(entry.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  if (files.empty()) return absl::NotFoundError(absl::StrCat("no history (*.log) in ", dir));
  std::sort(files.begin(), files.end());
  // The rail's file is read in its own order: Check() relies on it.
  for (const std::string& file : files) {
    auto records = history::ReadFile(file);
    if (!records.ok()) return records.status();
    all.insert(all.end(), records->begin(), records->end());
  }
  return Check(all);
}

}  // namespace fencelock::harness
