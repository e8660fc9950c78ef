#include "lock-server/leadership.h"

namespace fencelock::server {
namespace {

class Sole final : public Leadership {
 public:
  Role role() const override { return Role::kServing; }
  MonoTime ServesUntil() const override { return MonoTime::Max(); }
  bool leased() const override { return false; }
  std::string FaultRemedy() const override { return "restart it once the disk is fixed"; }
};

}  // namespace

std::unique_ptr<Leadership> SoleLeadership() { return std::make_unique<Sole>(); }

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
