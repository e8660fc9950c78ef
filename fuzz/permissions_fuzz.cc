// lockd's permissions-file parser (lock-server/permissions.h) on any text: it never crashes,
// an error always names the file and a line, and a file that parses answers the same way when
// parsed again, with every granted prefix granting the locks under it.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "lock-server/permissions.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "permissions_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fencelock::server::Permissions;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = Permissions::Parse(text, "perm");
  if (!parsed.ok()) {
    if (!absl::StartsWith(parsed.status().message(), "perm line ")) {
      Fail("an error without its line: " + std::string(parsed.status().message()));
    }
    return 0;
  }
  auto again = Permissions::Parse(text, "perm");
  if (!again.ok() || again->rule_count() != parsed->rule_count()) Fail("parsed differently twice");
  // Each acquire rule's prefixes grant the locks under them, to its identity.
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> words = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.size() < 3 || words[1] != "acquire" || words[0] == "*") continue;
    const std::string who = words[0] == "anonymous" ? "" : std::string(words[0]);
    for (size_t i = 2; i < words.size(); ++i) {
      const std::string lock = (words[i] == "*" ? "" : std::string(words[i])) + "x";
      if (!parsed->MayAcquire(who, lock)) Fail("rule \"" + std::string(line) + "\" does not grant " + lock);
    }
  }
  return 0;
}
