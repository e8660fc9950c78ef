#include "process/flags.h"

#include "absl/flags/parse.h"

namespace fencelock::process {

std::vector<std::string> ParseFlags(int argc, char** argv) {
  std::vector<std::string> normalized;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a.rfind("--", 0) == 0) {
      const size_t end = std::min(a.find('='), a.size());
      for (size_t k = 2; k < end; ++k) {
        if (a[k] == '-') a[k] = '_';
      }
    }
    normalized.push_back(std::move(a));
  }
  std::vector<char*> pointers;
  for (auto& a : normalized) pointers.push_back(a.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace fencelock::process
