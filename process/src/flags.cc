#include "process/flags.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string_view>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fencelock::process {
namespace {

// A flags file is a few lines; a larger one, or one that is not a regular file (a FIFO would
// block the start), is a mistake.
constexpr off_t kMaxFlagfileBytes = off_t{1} << 20;
// A flags file may name another; this deep at most (a file that names itself is refused).
constexpr int kMaxFlagfileDepth = 8;

[[noreturn]] void Refuse(const std::string& message) {
  std::fprintf(stderr, "ERROR: %s\n", message.c_str());
  std::exit(2);
}

// "--session-ttl=5s" as absl spells it, "--session_ttl=5s"; anything else as it is.
std::string Underscored(std::string arg) {
  if (arg.rfind("--", 0) == 0) {
    const size_t end = std::min(arg.find('='), arg.size());
    for (size_t k = 2; k < end; ++k) {
      if (arg[k] == '-') arg[k] = '_';
    }
  }
  return arg;
}

void Append(const std::string& arg, int depth, std::vector<std::string>* out);

// The flags of `path`, one a line as on the command line (blank lines and lines starting with
// '#' are skipped), appended in place of --flagfile=`path`.
void ExpandFlagfile(const std::string& path, int depth, std::vector<std::string>* out) {
  const std::string flag = absl::StrCat("--flagfile=", path);
  if (depth >= kMaxFlagfileDepth) {
    Refuse(absl::StrCat(flag, ": flags files name each other more than ", kMaxFlagfileDepth,
                        " deep"));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    Refuse(absl::StrCat(flag, ": cannot read it: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode) || st.st_size > kMaxFlagfileBytes) {
    Refuse(absl::StrCat(flag, ": not a regular file of at most ", kMaxFlagfileBytes, " bytes"));
  }
  std::ifstream in(path);
  if (!in) Refuse(absl::StrCat(flag, ": cannot read it: ", std::strerror(errno)));
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string text(absl::StripAsciiWhitespace(line));
    if (text.empty() || text[0] == '#') continue;
    if (text.rfind("--", 0) != 0) {
      Refuse(absl::StrCat(path, ":", number, ": \"", text,
                          "\" is not a flag (one --name=value a line; # starts a comment)"));
    }
    Append(text, depth + 1, out);
  }
}

void Append(const std::string& arg, int depth, std::vector<std::string>* out) {
  const std::string a = Underscored(arg);
  if (a.rfind("--flagfile=", 0) == 0) {
    for (const absl::string_view path : absl::StrSplit(a.substr(11), ',', absl::SkipEmpty())) {
      ExpandFlagfile(std::string(path), depth, out);
    }
    return;
  }
  out->push_back(a);
}

// Whether `arg` asks for help rather than to run: what absl's own --help answers (with exit
// status 1, and headings that name the source file of each flag, a path in the checkout the
// program was built from).
bool AsksForHelp(absl::string_view arg) {
  absl::ConsumePrefix(&arg, "-");
  absl::ConsumePrefix(&arg, "-");
  return arg == "help" || arg == "helpfull" || arg == "helpshort" || arg == "h" ||
         absl::StartsWith(arg, "help=") || arg == "helppackage";
}

// Prints the usage message and every flag of the program (not absl's own), with its help and
// default, sorted by name, on standard output; then exits 0.
[[noreturn]] void PrintHelp() {
  std::map<std::string, const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), "absl/")) continue;
    flags.emplace(std::string(name), flag);
  }
  std::string text = absl::StrCat(absl::ProgramUsageMessage(),
                                  "\n\n  Flags (--name or --name=value; dashes or underscores):\n");
  for (const auto& [name, flag] : flags) {
    absl::StrAppend(&text, "    --", name, " (", flag->Help(), "); default: ",
                    flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue(), ";\n");
  }
  absl::StrAppend(&text,
                  "    --flagfile (files of flags, one a line; # starts a comment); default: "
                  "\"\";\n");
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  std::exit(0);
}

}  // namespace

std::vector<std::string> ParseFlags(int argc, char** argv) {
  for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i) {
    if (AsksForHelp(argv[i])) PrintHelp();
  }
  std::vector<std::string> normalized;
  for (int i = 0; i < argc; ++i) {
    if (i == 0) {
      normalized.push_back(argv[0]);
    } else {
      Append(argv[i], 0, &normalized);
    }
  }
  std::vector<char*> pointers;
  for (auto& a : normalized) pointers.push_back(a.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  return std::vector<std::string>(positional.begin(), positional.end());
}

}  // namespace fencelock::process
