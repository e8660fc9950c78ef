// absl flags are spelled with underscores; the docs and scripts use dashes. ParseFlags accepts
// both ("--session-ttl=5s" and "--session_ttl=5s") and returns the positional arguments
// (argv[0] first), as absl::ParseCommandLine does; it exits with a message on a bad flag.
// --flagfile=PATH[,PATH...] reads flags from files, one a line as on the command line (blank
// lines and lines starting with '#' skipped), dashed or not, in its place: a flag after it
// overrides the file's. A file that cannot be read, is not a regular file of at most 1 MiB, or
// holds a line that is not a flag makes it exit 2, naming the file and the line.
#ifndef FENCELOCK_PROCESS_FLAGS_H_
#define FENCELOCK_PROCESS_FLAGS_H_

#include <string>
#include <vector>

namespace fencelock::process {

std::vector<std::string> ParseFlags(int argc, char** argv);

}  // namespace fencelock::process

#endif  // FENCELOCK_PROCESS_FLAGS_H_
