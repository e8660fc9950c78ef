#include "testing/local_lockd.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fencelock::testing {

absl::StatusOr<std::unique_ptr<LocalLockd>> LocalLockd::Start(LocalLockdOptions options) {
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot make ", options.dir, ": ", ec.message()));
  const std::string log = options.dir + "/lockd.log", port_file = options.dir + "/port";
  std::filesystem::remove(port_file, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot remove ", port_file, ": ", ec.message()));
  // lockd's own lines go to its log, not between a benchmark's rows.
  const process::SpawnOptions quiet{.stdout_file = log, .stderr_file = log};
  std::vector<std::string> serve = {"serve", "--port=0", "--port-file=" + port_file,
                                    "--metrics-port=-1"};
  if (options.etcd.empty() && options.existing_state) {
    serve.push_back("--data-dir=" + options.dir + "/state");
  } else if (options.etcd.empty()) {
    std::vector<std::string> init = {"init", "--data-dir=" + options.dir + "/state"};
    init.insert(init.end(), options.init_args.begin(), options.init_args.end());
    if (absl::Status s = process::RunToSuccess(options.binary, init, quiet, options.start_timeout);
        !s.ok()) {
      return s;
    }
    serve.push_back("--data-dir=" + options.dir + "/state");
  } else {
    serve.insert(serve.end(), {"--etcd=" + options.etcd, "--etcd-prefix=" + options.etcd_prefix});
  }
  serve.insert(serve.end(), options.serve_args.begin(), options.serve_args.end());
  auto child = process::Child::Spawn(options.binary, serve, quiet);
  if (!child.ok()) return child.status();
  auto lockd = std::unique_ptr<LocalLockd>(new LocalLockd);
  lockd->child_ = std::move(*child);
  auto port = process::AwaitPortFile(port_file, lockd->child_, options.start_timeout);
  if (!port.ok()) return absl::UnavailableError(absl::StrCat(port.status().message(), "; see ", log));
  lockd->port_ = *port;
  return lockd;
}

}  // namespace fencelock::testing
