#include "harness/checker.h"

#include <algorithm>
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
  static const std::set<std::string> kSteps = {"claimed", "marked-submitted", "status-asked",
                                               "step-started", "submitted", "paid"};
  return kSteps.count(event) > 0;
}

bool IsStoreAdmit(const std::string& event) {
  return event == "claimed" || event == "marked-submitted" || event == "paid";
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

  // Client-believed overlaps: per holder (process, token), from the grant received to its last
  // step as holder.
  struct Holding {
    std::string key, process;
    uint64_t token = 0;
    int64_t from = 0, to = 0;
  };
  std::map<std::pair<std::string, uint64_t>, Holding> holdings;
  for (const auto& r : records) {
    if (r.process == "rail" || r.token == 0) continue;
    auto id = std::make_pair(r.process, r.token);
    if (r.event == "acquire") {
      holdings[id] = {r.key, r.process, r.token, r.end_ns, r.end_ns};
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
        result.client_overlaps.push_back(absl::StrCat(
            key, ": ", hs[i]->process, " (token ", hs[i]->token, ") acted as holder until ",
            (hs[i]->to - hs[j]->from) / 1'000'000, " ms after ", hs[j]->process, " (token ",
            hs[j]->token, ") was granted"));
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
