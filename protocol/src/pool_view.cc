#include "protocol/pool_view.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fencelock {

absl::StatusOr<PoolProfileDef> PoolProfileDef::Parse(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  PoolProfileDef def;
  def.id = parts[0];
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile \"", text, "\": ", why, " (id[:cost=N][:reserve=N][:lendable][:borrow])"));
  };
  if (def.id.empty()) return bad("no id");
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (p == "lendable") {
      def.lendable = true;
    } else if (p == "borrow") {
      def.borrow = true;
    } else if (p.rfind("cost=", 0) == 0) {
      if (!absl::SimpleAtoi(p.substr(5), &def.cost)) return bad("cost is not a number");
    } else if (p.rfind("reserve=", 0) == 0) {
      if (!absl::SimpleAtoi(p.substr(8), &def.reserved)) return bad("reserve is not a number");
    } else {
      return bad(absl::StrCat("unknown part \"", p, "\""));
    }
  }
  return def;
}

}  // namespace fencelock
