#include "lock-server/leadership.h"

#include "absl/strings/str_cat.h"
#include "lock-server/commit_log.h"

namespace fencelock::server {
namespace {

// Nothing is ever committed: the core answers everything NOT_LEADER before it would be.
class Standby final : public CommitLog {
 public:
  explicit Standby(std::string prefix)
      : prefix_(std::move(prefix)),
        fault_(absl::UnavailableError(absl::StrCat("standing by for etcd prefix ", prefix_))) {}
  void SetListener(CommitLogListener*) override {}
  void ReserveFor(FenceToken, SessionId) override {}
  void Append(const Record&) override {}
  void Flush() override {}
  void Snapshot(const StateMachine&) override {}
  uint64_t newest_batch() const override { return 0; }
  uint64_t committed_batch() const override { return 0; }
  uint64_t last_lsn() const override { return 0; }
  const absl::Status* fault() const override { return &fault_; }
  std::string Describe() const override { return "standing by for etcd prefix " + prefix_; }
  CommitLogStats stats() const override { return {}; }

 private:
  const std::string prefix_;
  const absl::Status fault_;
};

class Sole final : public Leadership {
 public:
  Role role() const override { return Role::kServing; }
  MonoTime ServesUntil() const override { return MonoTime::Max(); }
  bool leased() const override { return false; }
  std::string FaultRemedy() const override { return "restart it once the disk is fixed"; }
};

}  // namespace

std::unique_ptr<Leadership> SoleLeadership() { return std::make_unique<Sole>(); }

std::unique_ptr<CommitLog> StandbyCommitLog(const std::string& prefix) {
  return std::make_unique<Standby>(prefix);
}

StandingBy::Leader LeaderOfOwner(const std::string& owner) {
  StandingBy::Leader leader{.description = owner};
  const size_t at = owner.rfind("(tcp ");
  if (at == std::string::npos) return leader;
  const size_t end = owner.find(')', at);
  if (end == std::string::npos) return leader;
  std::string address = owner.substr(at + 5, end - at - 5);
  if (address.size() >= 2 && address.compare(address.size() - 2, 2, ":0") == 0) return leader;
  leader.address = std::move(address);
  return leader;
}

}  // namespace fencelock::server
