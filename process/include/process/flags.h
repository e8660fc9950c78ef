// absl flags are spelled with underscores; the docs and scripts use dashes. ParseFlags accepts
// both ("--session-ttl=5s" and "--session_ttl=5s") and returns the positional arguments
// (argv[0] first), as absl::ParseCommandLine does; it exits with a message on a bad flag.
#ifndef FENCELOCK_PROCESS_FLAGS_H_
#define FENCELOCK_PROCESS_FLAGS_H_

#include <string>
#include <vector>

namespace fencelock::process {

std::vector<std::string> ParseFlags(int argc, char** argv);

}  // namespace fencelock::process

#endif  // FENCELOCK_PROCESS_FLAGS_H_
