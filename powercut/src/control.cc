#include "powercut/control.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "clock/clock.h"

namespace fencelock::powercut {

absl::StatusOr<std::string> Control(const std::string& socket, const std::string& command,
                                    absl::Duration timeout) {
  sockaddr_un addr{};
  if (socket.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", socket));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket.c_str(), socket.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  auto fail = [&](const std::string& what) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat(what, " ", socket, ": ", std::strerror(error)));
  };
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail("cannot connect to forgetfs at");
  }
  const std::string line = command + "\n";
  if (send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    return fail("cannot send to");
  }
  std::string answer;
  const MonoTime give_up = Clock::Real()->Now() + timeout;
  while (answer.find('\n') == std::string::npos) {
    const absl::Duration left = give_up - Clock::Real()->Now();
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    const int ready = left > absl::ZeroDuration()
                          ? poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1)
                          : 0;
    if (ready == 0) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat(
          "forgetfs at ", socket, " did not answer \"", command, "\" within ",
          absl::FormatDuration(timeout)));
    }
    char buf[512];
    const ssize_t n = ready < 0 ? -1 : read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ECONNRESET;
      return fail("no answer from");
    }
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  absl::string_view said(answer);
  said = said.substr(0, said.find('\n'));
  if (absl::ConsumePrefix(&said, "ok ") || said == "ok") return std::string(said);
  absl::ConsumePrefix(&said, "error ");
  return absl::FailedPreconditionError(said);
}

std::string Answer(ForgetfulFs& fs, const std::string& command, absl::Duration wait_for_close) {
  std::vector<std::string> words = absl::StrSplit(command, ' ', absl::SkipWhitespace());
  if (words.size() == 1 && words[0] == "stats") {
    const FsStats s = fs.Stats();
    return absl::StrCat("ok files=", s.files, " open=", s.open_handles, " unsynced_writes=",
                        s.unsynced_writes, " unsynced_bytes=", s.unsynced_bytes,
                        " unsynced_dirs=", s.unsynced_dirs, " syncs=", s.syncs,
                        " dir_syncs=", s.dir_syncs, " cuts=", s.cuts, " refused=", s.refused,
                        " freezes=", s.freezes, " armed=", s.armed ? 1 : 0,
                        " frozen=", s.frozen ? 1 : 0);
  }
  if (words.size() == 2 && words[0] == "arm") {
    int64_t writes = 0;
    if (!absl::SimpleAtoi(words[1], &writes) || writes < 1) {
      return absl::StrCat("error \"", words[1], "\" is not a count of writes (1 or more)");
    }
    fs.Arm(writes);
    return absl::StrCat("ok armed: the power goes at the ", writes, "th write from now");
  }
  if (words.empty() || words[0] != "cut" || words.size() > 3) {
    return "error usage: cut drop|keep-some|tear-sector|tear-page [seed=N] | arm N | stats";
  }
  CutOptions options;
  const std::string mode = words.size() > 1 ? words[1] : "drop";
  if (mode == "drop") {
    options.unsynced = Unsynced::kDrop;
  } else if (mode == "keep-some") {
    options.unsynced = Unsynced::kKeepSome;
  } else if (mode == "tear-sector" || mode == "tear-page") {
    options.unsynced = Unsynced::kTear;
    options.tear_unit = mode == "tear-sector" ? 512 : 4096;
  } else {
    return absl::StrCat("error unknown cut \"", mode,
                        "\": drop, keep-some, tear-sector or tear-page");
  }
  if (words.size() == 3) {
    absl::string_view seed = words[2];
    if (!absl::ConsumePrefix(&seed, "seed=") || !absl::SimpleAtoi(seed, &options.seed)) {
      return absl::StrCat("error \"", words[2], "\" is not seed=N");
    }
  }
  const MonoTime give_up = Clock::Real()->Now() + wait_for_close;
  for (;;) {
    auto report = fs.Cut(options);
    if (report.ok()) return "ok " + report->ToString();
    if (!absl::IsFailedPrecondition(report.status()) || Clock::Real()->Now() > give_up) {
      return absl::StrCat("error ", report.status().message());
    }
    absl::SleepFor(absl::Milliseconds(10));  // the kernel releases a dead process's files
  }
}

}  // namespace fencelock::powercut
