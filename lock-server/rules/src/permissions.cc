#include "lock-server/permissions.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fencelock::server {
namespace {

constexpr size_t kMaxLines = 100000;
constexpr size_t kMaxPrefixBytes = 512;  // a lock name is at most this long too

// `uid:<digits>`, `anonymous` or `*`; later also certificate names (`cn:...`, `dns:...`).
bool ValidIdentity(absl::string_view id) {
  if (id == "anonymous" || id == "*") return true;
  const size_t colon = id.find(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == id.size()) return false;
  const absl::string_view kind = id.substr(0, colon), value = id.substr(colon + 1);
  if (kind == "uid") {
    return std::all_of(value.begin(), value.end(), [](char c) { return absl::ascii_isdigit(c); });
  }
  return std::all_of(kind.begin(), kind.end(), [](char c) { return absl::ascii_islower(c); }) &&
         std::all_of(value.begin(), value.end(), [](char c) { return absl::ascii_isgraph(c); });
}

}  // namespace

absl::StatusOr<Permissions> Permissions::Parse(std::string_view text, const std::string& source) {
  Permissions p;
  p.all_allowed_ = false;
  p.source_ = source;
  size_t number = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++number;
    auto fail = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(source, " line ", number, ": ", why));
    };
    if (number > kMaxLines) return fail(absl::StrCat("more than ", kMaxLines, " lines"));
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    for (absl::string_view w : words) {
      if (!std::all_of(w.begin(), w.end(), [](char c) { return absl::ascii_isgraph(c); })) {
        return fail("only printable ASCII is allowed");
      }
    }
    if (!ValidIdentity(words[0])) {
      return fail(absl::StrCat("\"", words[0],
                               "\" is not an identity (uid:<number>, anonymous or *)"));
    }
    if (words.size() < 2) return fail(absl::StrCat("no right after \"", words[0], "\""));
    Rights& r = p.rights_[std::string(words[0])];
    const absl::string_view right = words[1];
    if (right == "acquire") {
      if (words.size() < 3) return fail("acquire needs at least one lock-name prefix (or *)");
      for (size_t i = 2; i < words.size(); ++i) {
        if (words[i].size() > kMaxPrefixBytes) {
          return fail(absl::StrCat("a prefix of ", words[i].size(), " bytes (at most ",
                                   kMaxPrefixBytes, ")"));
        }
        r.prefixes.push_back(words[i] == "*" ? "" : std::string(words[i]));
      }
    } else if (right == "manage") {
      if (words.size() < 3) return fail("manage needs at least one <pool>/<profile>, <pool>/* or *");
      for (size_t i = 2; i < words.size(); ++i) {
        const absl::string_view w = words[i];
        if (w.size() > kMaxPrefixBytes) {
          return fail(absl::StrCat("a profile of ", w.size(), " bytes (at most ", kMaxPrefixBytes,
                                   ")"));
        }
        if (w != "*" && (w.find('/') == absl::string_view::npos || w.front() == '/' ||
                         w.back() == '/')) {
          return fail(absl::StrCat("\"", w, "\" is not <pool>/<profile>, <pool>/* or *"));
        }
        r.profiles.push_back(std::string(w));
      }
    } else if (right == "list" || right == "inspect" || right == "validate" ||
               right == "operator") {
      if (words.size() > 2) return fail(absl::StrCat(right, " takes no arguments"));
      (right == "list"       ? r.list
       : right == "inspect"  ? r.inspect
       : right == "validate" ? r.validate
                             : r.op) = true;
    } else {
      return fail(absl::StrCat("unknown right \"", right,
                               "\" (acquire, list, inspect, validate, operator, manage)"));
    }
    ++p.rule_count_;
  }
  // `*`'s rules apply to every identity: merge them into each named one now.
  if (auto star = p.rights_.find("*"); star != p.rights_.end()) {
    p.everyone_ = std::move(star->second);
    p.rights_.erase(star);
    for (auto& [who, r] : p.rights_) {
      r.prefixes.insert(r.prefixes.end(), p.everyone_.prefixes.begin(), p.everyone_.prefixes.end());
      r.profiles.insert(r.profiles.end(), p.everyone_.profiles.begin(), p.everyone_.profiles.end());
      r.list = r.list || p.everyone_.list;
      r.inspect = r.inspect || p.everyone_.inspect;
      r.validate = r.validate || p.everyone_.validate;
      r.op = r.op || p.everyone_.op;
    }
  }
  return p;
}

std::string Permissions::Name(const std::string& identity) {
  return identity.empty() ? "anonymous" : identity;
}

const Permissions::Rights& Permissions::For(const std::string& identity) const {
  auto it = rights_.find(identity.empty() ? absl::string_view("anonymous") : absl::string_view(identity));
  return it == rights_.end() ? everyone_ : it->second;
}

bool Permissions::MayAcquire(const std::string& identity, std::string_view lock) const {
  if (all_allowed_) return true;
  const absl::string_view name(lock.data(), lock.size());
  for (const std::string& prefix : For(identity).prefixes) {
    if (absl::StartsWith(name, prefix)) return true;
  }
  return false;
}

bool Permissions::MayList(const std::string& identity) const {
  return all_allowed_ || For(identity).list;
}

bool Permissions::MayInspect(const std::string& identity) const {
  return all_allowed_ || For(identity).inspect;
}

bool Permissions::MayValidate(const std::string& identity) const {
  return all_allowed_ || For(identity).validate;
}

bool Permissions::MayManage(const std::string& identity, const std::string& pool,
                            const std::string& profile) const {
  if (all_allowed_) return true;
  const std::string exact = absl::StrCat(pool, "/", profile);
  const std::string any = absl::StrCat(pool, "/*");
  for (const std::string& rule : For(identity).profiles) {
    if (rule == "*" || rule == exact || rule == any) return true;
  }
  return false;
}

bool Permissions::MayManageAny(const std::string& identity, const std::string& pool) const {
  if (all_allowed_) return true;
  for (const std::string& rule : For(identity).profiles) {
    if (rule == "*" || absl::StartsWith(rule, absl::StrCat(pool, "/"))) return true;
  }
  return false;
}

Permissions Permissions::WithoutFile(std::string state_owner) {
  Permissions p;
  p.state_owner_ = std::move(state_owner);
  return p;
}

bool Permissions::IsOperator(const std::string& identity) const {
  if (all_allowed_) return !state_owner_.empty() && identity == state_owner_;
  return For(identity).op;
}

std::string Permissions::DescribeAcquire(const std::string& identity) const {
  const Rights& r = For(identity);
  std::vector<std::string> shown;
  for (const std::string& p : r.prefixes) shown.push_back(p.empty() ? "*" : p);
  return absl::StrCat(Name(identity), " may acquire locks starting with ",
                      shown.empty() ? "nothing" : absl::StrJoin(shown, ", "), " (", source_, ")");
}

}  // namespace fencelock::server
