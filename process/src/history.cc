#include "process/history.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fencelock::history {

int64_t NowNanos() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string Format(const Record& r) {
  std::string line = absl::StrCat(r.begin_ns, " ", r.end_ns, " ", r.process, " ", r.event, " ",
                                  r.key.empty() ? "-" : r.key, " ", r.token);
  if (!r.detail.empty()) absl::StrAppend(&line, " ", r.detail);
  return line;
}

absl::StatusOr<Record> Parse(const std::string& line) {
  std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 6));
  if (f.size() < 6) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected \"<begin_ns> <end_ns> <process> <event> <key> <token> [detail]\", "
                     "got \"", line, "\""));
  }
  Record r;
  if (!absl::SimpleAtoi(f[0], &r.begin_ns) || !absl::SimpleAtoi(f[1], &r.end_ns)) {
    return absl::InvalidArgumentError(absl::StrCat("bad timestamps in \"", line, "\""));
  }
  if (r.end_ns < r.begin_ns) {
    return absl::InvalidArgumentError(absl::StrCat("end before begin in \"", line, "\""));
  }
  if (!absl::SimpleAtoi(f[5], &r.token)) {
    return absl::InvalidArgumentError(absl::StrCat("bad token in \"", line, "\""));
  }
  r.process = f[2];
  r.event = f[3];
  r.key = f[4];
  if (f.size() == 7) r.detail = f[6];
  return r;
}

absl::StatusOr<std::vector<Record>> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open history ", path));
  std::vector<Record> records;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    auto r = Parse(line);
    if (!r.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": ", r.status().message()));
    }
    records.push_back(std::move(*r));
  }
  return records;
}

absl::StatusOr<std::unique_ptr<Writer>> Writer::Open(const std::string& path,
                                                     std::string process) {
  if (process.empty() || process.find_first_of(" \n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("bad process name \"", process, "\""));
  }
  int fd = -1;
  if (!path.empty()) {
    fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot open history ", path, ": ", std::strerror(errno)));
    }
  }
  return std::unique_ptr<Writer>(new Writer(fd, std::move(process)));
}

Writer::~Writer() {
  if (fd_ >= 0) close(fd_);
}

void Writer::Append(int64_t begin_ns, const std::string& event, const std::string& key,
                    uint64_t token, const std::string& detail, int64_t end_ns) {
  if (fd_ < 0) return;
  std::string line = Format({.begin_ns = begin_ns,
                             .end_ns = end_ns != 0 ? end_ns : NowNanos(),
                             .process = process_,
                             .event = event,
                             .key = key,
                             .token = token,
                             .detail = detail});
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  line += '\n';
  // One write per record: with O_APPEND the record lands whole, after every earlier one.
  (void)!write(fd_, line.data(), line.size());
}

}  // namespace fencelock::history
