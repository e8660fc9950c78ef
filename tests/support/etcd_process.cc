#include "etcd_process.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "raw_connection.h"

namespace fencelock::testing {

std::pair<bool, std::string> EtcdProcess::Etcdctl(const std::string& args) const {
  const std::string out = dir_.path() + "/etcdctl.out";
  const std::string& certs = options_.certs;
  const std::string tls =
      certs.empty() ? std::string()
                    : absl::StrCat(" --cacert=", certs, "/ca.crt --cert=", certs,
                                   "/root.crt --key=", certs, "/root.key");
  const std::string command = absl::StrCat("ETCDCTL_API=3 ", ETCDCTL_BINARY, " --endpoints=",
                                           endpoint_, tls, " ", args, " > ", out, " 2>&1");
  const bool ok = std::system(command.c_str()) == 0;
  return {ok, ReadTextFile(out)};
}

EtcdProcess::EtcdProcess(Options options) : options_(std::move(options)) {
  const int client = FreeLoopbackPort();
  const int peer = FreeLoopbackPort();
  endpoint_ = absl::StrCat("127.0.0.1:", client);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer);
  const std::string scheme = options_.certs.empty() ? "http://" : "https://";
  std::vector<std::string> args = {
      "--name=test", "--data-dir=" + dir_.path() + "/data",
      "--listen-client-urls=" + scheme + endpoint_,
      "--advertise-client-urls=" + scheme + endpoint_, "--listen-peer-urls=" + peer_url,
      "--initial-advertise-peer-urls=" + peer_url, "--initial-cluster=test=" + peer_url,
      "--log-level=warn"};
  if (!options_.certs.empty()) {
    args.insert(args.end(), {"--cert-file=" + options_.certs + "/etcd.crt",
                             "--key-file=" + options_.certs + "/etcd.key",
                             "--trusted-ca-file=" + options_.certs + "/ca.crt",
                             "--client-cert-auth"});
  }
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  auto child = process::Child::Spawn(
      ETCD_BINARY, args,
      {.stdout_file = dir_.path() + "/etcd.log", .stderr_file = dir_.path() + "/etcd.log"});
  if (!child.ok()) {
    std::fprintf(stderr, "cannot start etcd: %s\n", child.status().ToString().c_str());
    std::abort();
  }
  child_ = std::move(*child);
  for (int i = 0; i < 300; ++i) {
    if (Etcdctl("endpoint health").first) return;
    if (!child_.running()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::fprintf(stderr, "etcd did not become healthy; its log:\n%s\n",
               ReadTextFile(dir_.path() + "/etcd.log").c_str());
  std::abort();
}

EtcdProcess::~EtcdProcess() { child_.Stop(); }

std::vector<std::string> EtcdProcess::Keys(const std::string& prefix) const {
  auto [ok, out] = Etcdctl("get --prefix --keys-only " + prefix);
  std::vector<std::string> keys;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    keys.emplace_back(line);
  }
  return keys;
}

std::string EtcdProcess::Get(const std::string& key) const {
  auto [ok, out] = Etcdctl("get --print-value-only " + key);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string EtcdProcess::Dump(const std::string& prefix) const {
  return Etcdctl("get --prefix " + prefix).second;
}

bool EtcdProcess::Put(const std::string& key, const std::string& value) const {
  // etcdctl reads a value it is not given on its command line from standard input, whole.
  const std::string file = dir_.path() + "/put.value";
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << value;
  }
  return Etcdctl("put " + key + " < " + file).first;
}

bool EtcdProcess::Delete(const std::string& key) const {
  return Etcdctl("del " + key).first;
}

int64_t EtcdProcess::DbSize() const {
  auto [ok, out] = Etcdctl("endpoint status --write-out=fields");
  // "DBSize" : 24576
  const size_t at = out.find("\"DBSize\"");
  if (at == std::string::npos) return -1;
  return std::strtoll(out.c_str() + out.find(':', at) + 1, nullptr, 10);
}

}  // namespace fencelock::testing
