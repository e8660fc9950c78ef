// The control socket of a mounted forgetfs (forgetfs_main.cc): one command per connection, one
// line each way.
//   cut drop|keep-some|tear-sector|tear-page [seed=N]   the power cut (ForgetfulFs::Cut), after
//                                                        waiting up to 10 s for open files to close
//   arm N                                                the power goes at the N-th write from
//                                                        now (ForgetfulFs::Arm)
//   stats                                                what is not durable now (FsStats)
// The answer is "ok <what happened>" or "error <why>".
#ifndef FENCELOCK_POWERCUT_CONTROL_H_
#define FENCELOCK_POWERCUT_CONTROL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "powercut/forgetful_fs.h"

namespace fencelock::powercut {

// Sends `command` to the forgetfs listening on `socket` and returns what follows "ok ";
// an "error" answer is kFailedPrecondition with its text, no answer within `timeout`
// kDeadlineExceeded.
absl::StatusOr<std::string> Control(const std::string& socket, const std::string& command,
                                    absl::Duration timeout = absl::Seconds(30));

// Parses and runs one command against `fs` (the server side of Control). `wait_for_close`:
// how long a cut waits for open files to close.
std::string Answer(ForgetfulFs& fs, const std::string& command, absl::Duration wait_for_close);

}  // namespace fencelock::powercut

#endif  // FENCELOCK_POWERCUT_CONTROL_H_
