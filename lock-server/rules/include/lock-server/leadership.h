// Whether this lockd may answer from its state, and until when: the leadership, a small part
// beside the commit log (commit_log.h). The log makes records durable; the leadership says
// whether this process is the one that serves them. The core asks it when a request is
// dispatched and again as each reply that acts (a grant, a renewal, a Validate) leaves.
//
// Three kinds:
//   SoleLeadership()       a state directory: this process serves it for its whole life (the
//                          directory's file lock keeps a second one out)
//   the etcd ownership     serving while this lockd holds P/owner on its lease, until the
//                          deadline its renewals give it; deposed after (etcd_commit_log.h)
//   StandingBy             a standby replica's core: serves nothing and answers every request
//                          NOT_LEADER, naming the serving replica
//
// Thread safety: every method is for the owner's thread (lockd's event loop), except
// Members() and StandingBy::SetLeader, which say so.
#ifndef FENCELOCK_LOCK_SERVER_LEADERSHIP_H_
#define FENCELOCK_LOCK_SERVER_LEADERSHIP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "clock/clock.h"

namespace fencelock::server {

enum class Role {
  kServing,     // may answer from its state until ServesUntil()
  kStandingBy,  // waits for the prefix; answers NOT_LEADER
  kDeposed,     // served once, no longer may: refuses, then ends
};

// One member of a replicated store (etcd), as lockd last saw it.
struct StoreMember {
  std::string endpoint;
  bool reachable = false;
  bool leader = false;       // the store's leader, by its own answer
  uint64_t raft_index = 0;
  int64_t db_bytes = 0;
  std::string error;         // why it was not reachable
};

class Leadership {
 public:
  virtual ~Leadership() = default;
  virtual Role role() const = 0;
  // The point on lockd's clock from which nothing may be answered from the state.
  // MonoTime::Max() for a leadership that is not leased; MonoTime::Min() when not serving.
  virtual MonoTime ServesUntil() const = 0;
  // A leased leadership can be lost within this process: a commit fault may mean it is gone,
  // so lockd then stops serving (and exits) for a standby to take over, instead of staying up
  // refusing everything until a restart.
  virtual bool leased() const = 0;
  // What an operator does about a commit fault, for lockd's refusals.
  virtual std::string FaultRemedy() const = 0;
  // The store's members and their health, polled in the background (etcd); empty for none.
  // Thread-safe.
  virtual std::vector<StoreMember> Members() const { return {}; }
};

// A state directory's: serving, not leased, for the process's life.
std::unique_ptr<Leadership> SoleLeadership();

// A standby replica's core. The serving replica it names is set from the thread that watches
// etcd, and read on the core's.
class StandingBy final : public Leadership {
 public:
  struct Leader {
    std::string address;      // its TCP address for clients to follow; empty if none
    std::string description;  // P/owner's value, for people
  };
  // `note`: why this replica stands by, beyond waiting, added to every NOT_LEADER (a replica
  // deposed earlier in this process says so); empty for none.
  explicit StandingBy(std::string note = "") : note_(std::move(note)) {}
  Role role() const override { return Role::kStandingBy; }
  MonoTime ServesUntil() const override { return MonoTime::Min(); }
  bool leased() const override { return false; }
  std::string FaultRemedy() const override {
    return "this lockd stands by; ask the serving replica";
  }
  // Thread-safe.
  void SetLeader(Leader leader) {
    absl::MutexLock lock(&mu_);
    leader_ = std::move(leader);
  }
  Leader leader() const {
    absl::MutexLock lock(&mu_);
    return leader_;
  }
  const std::string& note() const { return note_; }

 private:
  const std::string note_;
  mutable absl::Mutex mu_;
  Leader leader_ ABSL_GUARDED_BY(mu_);
};

// The serving replica as its P/owner value names it ("lockd pid 12 on host h (tcp
// 10.0.0.1:7420)"): the address after "tcp ", empty when there is none or it published port 0.
StandingBy::Leader LeaderOfOwner(const std::string& owner);

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_LEADERSHIP_H_
