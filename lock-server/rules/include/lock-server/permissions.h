// What each identity may do, from lockd's permissions file (--permissions=FILE, reloaded on
// SIGHUP). One rule per line; `#` starts a comment:
//
//   <identity>  acquire  <prefix> [<prefix> ...]   may acquire locks whose names start so
//   <identity>  list                               may list locks (ListLocks), without their
//                                                  holders' session ids and tokens
//   <identity>  inspect                            may also see those ids and tokens, and list
//                                                  sessions
//   <identity>  validate                           may check any token without a session (a
//                                                  resource asking lockd, fence 2); its
//                                                  stale tokens count as fenced out
//   <identity>  operator                           operator rights: publish pool policies,
//                                                  recover pool leases, drain, stop
//   <identity>  manage  <pool>/<profile> ...       may manage these pools' profiles (claim
//                                                  one, then its leases); <pool>/* is every
//                                                  profile of a pool, * every pool
//
// An identity is how lockd knows the peer: `uid:<n>` on the Unix socket, `anonymous` for
// plaintext TCP on loopback (which has none), or `*`, whose rules every identity gets as well.
// A prefix `*` means every lock. Rules add up; anything no rule grants is refused. Without a
// file every identity may acquire every lock and list, as before permissions existed, and may
// manage pools; the one operator of pools is then the uid that owns lockd's state (ADR 0004).
// No rule ever lets an identity drive another's session (LockService::Authorize).
#ifndef FENCELOCK_LOCK_SERVER_PERMISSIONS_H_
#define FENCELOCK_LOCK_SERVER_PERMISSIONS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace fencelock::server {

class Permissions {
 public:
  // lockd without a permissions file: everything allowed but the operator's rights, which
  // belong to `state_owner` alone ("uid:<n>", the owner of lockd's state; empty: nobody).
  Permissions() = default;
  static Permissions WithoutFile(std::string state_owner);

  // Parses a permissions file's text. Errors: kInvalidArgument naming `source`, the line and
  // the reason ("/etc/lockd/permissions line 3: unknown right \"aquire\"").
  static absl::StatusOr<Permissions> Parse(std::string_view text, const std::string& source);

  // The identity a connection is known by in the file: `identity`, or "anonymous" for none.
  static std::string Name(const std::string& identity);

  bool MayAcquire(const std::string& identity, std::string_view lock) const;
  bool MayList(const std::string& identity) const;
  bool MayInspect(const std::string& identity) const;
  bool MayValidate(const std::string& identity) const;
  bool IsOperator(const std::string& identity) const;
  // May act as the manager of `pool`'s `profile` (or of some profile of `pool`).
  bool MayManage(const std::string& identity, const std::string& pool,
                 const std::string& profile) const;
  bool MayManageAny(const std::string& identity, const std::string& pool) const;
  // For refusals: "uid:1000 may acquire locks starting with payout/, refunds/" or "... none".
  std::string DescribeAcquire(const std::string& identity) const;
  // Where the rules came from ("" without a file), and how many there are.
  const std::string& source() const { return source_; }
  // Without a file: the operator's identity (see WithoutFile).
  const std::string& state_owner() const { return state_owner_; }
  size_t rule_count() const { return rule_count_; }

 private:
  struct Rights {
    std::vector<std::string> prefixes;  // "" is every lock
    std::vector<std::string> profiles;  // manage: "<pool>/<profile>", "<pool>/*" or "*"
    bool list = false;
    bool inspect = false;
    bool validate = false;
    bool op = false;
  };
  // The rights of `identity` and of `*`, together (merged once, when the file is parsed, so
  // that the grant path allocates nothing).
  const Rights& For(const std::string& identity) const;

  bool all_allowed_ = true;
  std::string state_owner_;  // without a file: the operator
  std::string source_;
  size_t rule_count_ = 0;
  absl::flat_hash_map<std::string, Rights> rights_;  // each named identity's, `*`'s merged in
  Rights everyone_;                                   // `*`'s: for identities not named
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_PERMISSIONS_H_
