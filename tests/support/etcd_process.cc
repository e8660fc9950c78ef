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
namespace {

// Runs etcdctl against `endpoint` with `args`; its standard output, and whether it exited 0.
std::pair<bool, std::string> Etcdctl(const std::string& endpoint, const std::string& args,
                                     const std::string& scratch) {
  const std::string out = scratch + "/etcdctl.out";
  const std::string command = absl::StrCat("ETCDCTL_API=3 ", ETCDCTL_BINARY, " --endpoints=",
                                           endpoint, " ", args, " > ", out, " 2>&1");
  const bool ok = std::system(command.c_str()) == 0;
  return {ok, ReadTextFile(out)};
}

}  // namespace

EtcdProcess::EtcdProcess() {
  const int client = FreeLoopbackPort();
  const int peer = FreeLoopbackPort();
  endpoint_ = absl::StrCat("127.0.0.1:", client);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer);
  auto child = process::Child::Spawn(
      ETCD_BINARY,
      {"--name=test", "--data-dir=" + dir_.path() + "/data",
       "--listen-client-urls=http://" + endpoint_, "--advertise-client-urls=http://" + endpoint_,
       "--listen-peer-urls=" + peer_url, "--initial-advertise-peer-urls=" + peer_url,
       "--initial-cluster=test=" + peer_url, "--log-level=warn"},
      {.stdout_file = dir_.path() + "/etcd.log", .stderr_file = dir_.path() + "/etcd.log"});
  if (!child.ok()) {
    std::fprintf(stderr, "cannot start etcd: %s\n", child.status().ToString().c_str());
    std::abort();
  }
  child_ = std::move(*child);
  for (int i = 0; i < 300; ++i) {
    if (Etcdctl(endpoint_, "endpoint health", dir_.path()).first) return;
    if (!child_.running()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::fprintf(stderr, "etcd did not become healthy; its log:\n%s\n",
               ReadTextFile(dir_.path() + "/etcd.log").c_str());
  std::abort();
}

EtcdProcess::~EtcdProcess() { child_.Stop(); }

std::vector<std::string> EtcdProcess::Keys(const std::string& prefix) const {
  auto [ok, out] = Etcdctl(endpoint_, "get --prefix --keys-only " + prefix, dir_.path());
  std::vector<std::string> keys;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    keys.emplace_back(line);
  }
  return keys;
}

std::string EtcdProcess::Get(const std::string& key) const {
  auto [ok, out] = Etcdctl(endpoint_, "get --print-value-only " + key, dir_.path());
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string EtcdProcess::Dump(const std::string& prefix) const {
  return Etcdctl(endpoint_, "get --prefix " + prefix, dir_.path()).second;
}

bool EtcdProcess::Put(const std::string& key, const std::string& value) const {
  // etcdctl reads a value it is not given on its command line from standard input, whole.
  const std::string file = dir_.path() + "/put.value";
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << value;
  }
  return Etcdctl(endpoint_, "put " + key + " < " + file, dir_.path()).first;
}

bool EtcdProcess::Delete(const std::string& key) const {
  return Etcdctl(endpoint_, "del " + key, dir_.path()).first;
}

int64_t EtcdProcess::DbSize() const {
  auto [ok, out] = Etcdctl(endpoint_, "endpoint status --write-out=fields", dir_.path());
  // "DBSize" : 24576
  const size_t at = out.find("\"DBSize\"");
  if (at == std::string::npos) return -1;
  return std::strtoll(out.c_str() + out.find(':', at) + 1, nullptr, 10);
}

}  // namespace fencelock::testing
