// The lock server's durable state and the records that change it.
//
// Every change to sessions, holders and the token sequence is a Record applied with the
// server's `now`: Apply(state, record, now) -> new state. Nothing else mutates the state, so the
// durability layer can log records and replay them without knowing the rules. The rules (who
// may acquire, which token is stale) live in LockService, which decides which records to apply.
// Applying a record that breaks an invariant (granting a held lock, a token that does not
// increase) is a bug in the caller and aborts the process with a message.
//
// Not thread-safe: the server touches it from its one I/O thread.
#ifndef FENCELOCK_LOCK_SERVER_STATE_MACHINE_H_
#define FENCELOCK_LOCK_SERVER_STATE_MACHINE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "clock/clock.h"
#include "lock-server/pool_state.h"
#include "protocol/ids.h"

namespace fencelock::server {

using ::fencelock::FenceToken;
using ::fencelock::SessionId;

enum class EndReason { kClosed, kExpired };
// ADR 0006: shared holders coexist; an exclusive holder excludes every other holder.
enum class LockMode { kExclusive, kShared };
enum class ReleaseReason { kReleased, kLeaseExpired, kSessionEnded };

namespace record {
struct SessionOpened {
  SessionId session;
  absl::Duration ttl;
  // SessionSecretDigest() of what resumes the session on another connection (ResumeSession):
  // random bytes given only to the opener, and kept nowhere, neither in memory nor in the log.
  // Empty for sessions logged before secrets existed: those cannot be resumed.
  std::string secret_digest;
  // The authenticated identity that opened it ("uid:1000" on the Unix socket); empty when the
  // connection had none (plaintext TCP). Only this identity may drive the session.
  std::string owner;
  // Decoded from a record or snapshot written before secrets were kept as digests, which held
  // the secret itself: the digest was computed as it was read. The state counts these
  // (StateMachine::secrets_read_in_clear) so that lockd rewrites its state without them.
  bool read_in_clear = false;
};
struct SessionRenewed {
  SessionId session;
  // Every lock the session holds that its client confirmed (HolderState::confirmed) is
  // renewed with it (Renew, protocol version 6, ADR 0014).
  bool locks = false;
};
// The session must hold no locks: its locks are released by their own records first.
struct SessionEnded {
  SessionId session;
  EndReason reason;
};
struct LockGranted {
  std::string lock;
  SessionId session;
  FenceToken token;
  absl::Duration ttl;
  LockMode mode = LockMode::kExclusive;
  // The lock delay that this holder's loss (not its release) starts; zero: none.
  absl::Duration lock_delay = absl::ZeroDuration();
};
// Also confirms the grant (HolderState::confirmed): its client named it.
struct LockRenewed {
  std::string lock;
  FenceToken token;
};
// A reason other than kReleased is a loss: it starts the holder's lock delay, if it has one.
struct LockReleased {
  std::string lock;
  FenceToken token;
  ReleaseReason reason;
};

// Admission pools (pool_state.h). Every record that changes a pool's leases or policy carries
// the pool's next decision number (its last plus one).
//
// A new policy generation for `pool` (created by its first). Replaces the profiles; each
// lease's units stay what they were when granted.
struct PoolPolicyPublished {
  std::string pool;
  uint64_t generation;
  uint64_t budget;
  std::vector<PoolProfileDef> profiles;  // ascending id
  uint64_t decision;
};
// A manager takes over `profile`: the epoch goes up by one, and requests of earlier epochs are
// refused from now on (stale owner).
struct PoolProfileClaimed {
  std::string pool;
  std::string profile;
  uint64_t epoch;
  // PoolOwnerKeyDigest() of the key that proves a request is this epoch's manager: the key
  // itself goes only to the manager that claimed.
  std::string key_digest;
  uint64_t generation;  // the policy generation it enforces
  // The identity that claimed (Permissions::Name of the connection's): requests of this epoch
  // must come from it (ADR 0004). Empty in a record written before identities were kept.
  std::string claimed_by;
  // Decoded from a record that held the key itself (written before digests): counted in
  // StateMachine::secrets_read_in_clear, as for sessions.
  bool read_in_clear = false;
};
// The current owner says it enforces `generation` (the current one).
struct PoolPolicyAcked {
  std::string pool;
  std::string profile;
  uint64_t epoch;
  uint64_t generation;
};
// A provisional lease on one slot, with a token from the one token sequence.
struct PoolLeaseGranted {
  std::string pool;
  std::string profile;
  std::string slot;
  FenceToken token;
  uint64_t units;
  uint64_t epoch;
  absl::Duration ttl;
  uint64_t decision;
};
// A provisional lease's expiry moves to now + its TTL. Not logged.
struct PoolLeaseRenewed {
  std::string pool;
  std::string profile;
  std::string slot;
  FenceToken token;
};
struct PoolLeaseActivated {
  std::string pool;
  std::string profile;
  std::string slot;
  FenceToken token;
  uint64_t decision;
};
struct PoolLeaseReleased {
  std::string pool;
  std::string profile;
  std::string slot;
  FenceToken token;
  PoolReleaseReason reason;
  uint64_t decision;
};
// An operator's fenced recovery of an active lease: the tombstone and the release, in one
// record, so that the units are free only once the tombstone is durable.
struct PoolLeaseRecovered {
  std::string pool;
  std::string profile;
  std::string slot;
  FenceToken token;
  std::string evidence;
  uint64_t decision;
};
struct PoolDrainSet {
  std::string pool;
  bool draining;
};
// An operator deleted `pool`: it drained and held no lease. Its policy, owners, tombstones and
// decision sequence go with it; tokens stay above every one it handed out (one sequence).
struct PoolDeleted {
  std::string pool;
};
}  // namespace record

// What the state keeps of a session's secret: SHA-256 over a domain label, the session id and
// the secret. It checks a secret presented on resume and does not give the secret back, so
// whoever reads the log, a snapshot or etcd's keys cannot resume another's session. Empty for
// an empty secret (a session that cannot be resumed).
std::string SessionSecretDigest(SessionId session, std::string_view secret);
// The same for a pool manager's owner key, over its own label, the pool, the profile and the
// epoch it was claimed for.
std::string PoolOwnerKeyDigest(const std::string& pool, const std::string& profile,
                               uint64_t epoch, std::string_view key);

using Record = std::variant<record::SessionOpened, record::SessionRenewed, record::SessionEnded,
                            record::LockGranted, record::LockRenewed, record::LockReleased,
                            record::PoolPolicyPublished, record::PoolProfileClaimed,
                            record::PoolPolicyAcked, record::PoolLeaseGranted,
                            record::PoolLeaseRenewed, record::PoolLeaseActivated,
                            record::PoolLeaseReleased, record::PoolLeaseRecovered,
                            record::PoolDrainSet, record::PoolDeleted>;

class LockState;

// Orders lock states by name, and finds one by its name: the lock table and each session's
// locks are sets of pointers in this order.
struct LockNameLess {
  using is_transparent = void;
  bool operator()(const LockState* a, const LockState* b) const;
  bool operator()(const LockState* a, std::string_view b) const;
  bool operator()(std::string_view a, const LockState* b) const;
};
using LockSet = absl::btree_set<LockState*, LockNameLess>;

struct SessionState {
  absl::Duration ttl;
  MonoTime expires_at;
  // The locks this session holds, in name order. Their states belong to the lock table.
  LockSet locks;
  std::string secret_digest;  // see record::SessionOpened
  std::string owner;
  // Locks taken from this session because their lease ran out while it lived, since this
  // state began (RenewedSession.losses, ADR 0014). Kept in memory only: neither logged as such
  // nor in snapshots, for a client learns it afresh on every connection.
  uint64_t losses = 0;
  // The connection the session is bound to (opened or last resumed on), for LockService's
  // check of who may use it. Here rather than in a table of its own, so that a Renew of many
  // sessions finds it where it finds the session (a second search per session was 31 % of
  // lockd's time at 1,000,000 sessions). In memory only, like `losses`: none after a restore,
  // where every client resumes with its secret.
  std::optional<uint64_t> connection;
};

struct HolderState {
  SessionId session;
  FenceToken token;
  absl::Duration ttl;
  MonoTime expires_at;
  LockMode mode = LockMode::kExclusive;
  // Its client named it since it was granted or restored (a KeepAlive, a Renew's confirm), so
  // knows it holds it: only such a lock is renewed with its session by a Renew (ADR 0014). In
  // memory only: false after a restore.
  bool confirmed = false;
  absl::Duration lock_delay = absl::ZeroDuration();  // see record::LockGranted
};

// A lock delay started by a lost holder (ADR 0006): grants it blocks wait until `until`. Its
// end is not a record: `length` lets a restored state give it in full again (RestartLeases).
struct LockDelay {
  absl::Duration length;
  MonoTime until;
};

// One lock name: its holders and the delays its lost holders started. A name with neither is
// not kept. One allocation holds the state and its name; it does not move while the name is
// kept, so the indexes refer to it by address. Only the StateMachine changes or makes one.
//
// Its size is the cost of a held lock (docs/benchmarks.md, "Cost as the work grows"): the one
// holder of an exclusive lock is kept in place, and only a lock with several holders or a
// pending delay has a second allocation.
class LockState {
 public:
  LockState(const LockState&) = delete;
  LockState& operator=(const LockState&) = delete;
  // Frees a state the StateMachine made (with its name).
  struct Free {
    void operator()(LockState* state) const;
  };

  std::string_view name() const {
    return std::string_view(reinterpret_cast<const char*>(this + 1), name_size_);
  }
  // Ascending token: one exclusive holder, or any number of shared ones.
  std::span<const HolderState> holders() const {
    return extra_ != nullptr && !extra_->holders.empty()
               ? std::span<const HolderState>(extra_->holders)
               : std::span<const HolderState>(&one_, holder_count_);
  }
  // A lost exclusive holder's delay, which blocks every grant.
  const std::optional<LockDelay>& delay_all() const {
    return extra_ == nullptr ? kNoDelay : extra_->delay_all;
  }
  // A lost shared holder's delay, which blocks exclusive grants only (a late reader can return
  // stale data, never change the resource).
  const std::optional<LockDelay>& delay_writers() const {
    return extra_ == nullptr ? kNoDelay : extra_->delay_writers;
  }

  bool held() const { return holder_count_ > 0; }
  // kShared iff it is held and its holders are shared.
  LockMode mode() const {
    return held() && holders().front().mode == LockMode::kShared ? LockMode::kShared
                                                                 : LockMode::kExclusive;
  }
  const HolderState* FindToken(FenceToken token) const;
  const HolderState* FindSession(SessionId session) const;
  // The end of the delays that block a grant in `mode`; MonoTime::Min() when none does.
  MonoTime DelayedUntil(LockMode mode) const;

 private:
  friend class StateMachine;
  struct Extra {
    std::vector<HolderState> holders;  // all of them, when there are two or more
    std::optional<LockDelay> delay_all;
    std::optional<LockDelay> delay_writers;
  };
  using Owned = std::unique_ptr<LockState, Free>;
  static const std::optional<LockDelay> kNoDelay;

  explicit LockState(size_t name_size) : name_size_(static_cast<uint32_t>(name_size)) {}
  // A state with no holder and no delay, named `name`.
  static Owned Make(std::string_view name);

  std::span<HolderState> mutable_holders() {
    return extra_ != nullptr && !extra_->holders.empty()
               ? std::span<HolderState>(extra_->holders)
               : std::span<HolderState>(&one_, holder_count_);
  }
  HolderState* FindToken(FenceToken token);
  // Adds a holder whose token is above every current one.
  void Add(const HolderState& holder);
  void Remove(FenceToken token);
  std::optional<LockDelay>& mutable_delay(LockMode lost);
  // Drops the second allocation once it keeps nothing that the state in place cannot.
  void Compact();

  HolderState one_{};
  uint32_t holder_count_ = 0;
  uint32_t name_size_;
  std::unique_ptr<Extra> extra_;
  // The name's bytes follow the object, in the same allocation.
};

inline bool LockNameLess::operator()(const LockState* a, const LockState* b) const {
  return a->name() < b->name();
}
inline bool LockNameLess::operator()(const LockState* a, std::string_view b) const {
  return a->name() < b;
}
inline bool LockNameLess::operator()(std::string_view a, const LockState* b) const {
  return a < b->name();
}

class StateMachine {
 public:
  StateMachine() = default;
  // A deep copy: the copy owns lock states of its own.
  StateMachine(const StateMachine& other);
  StateMachine& operator=(const StateMachine& other);
  StateMachine(StateMachine&&) = default;
  StateMachine& operator=(StateMachine&&) = default;

  // OK if `r` can be applied to the current state; otherwise kFailedPrecondition saying which
  // invariant it breaks. Recovery uses this to refuse a log that does not replay.
  absl::Status Check(const Record& r) const;

  // Applies `r` as of server time `now`. Aborts on a broken invariant (see Check).
  void Apply(const Record& r, MonoTime now);
  // Applies `r`, which Check() has just accepted, without checking it again: recovery checks
  // every record to refuse a log that does not replay, and replays millions.
  void ApplyChecked(const Record& r, MonoTime now);

  // Raises the token and session-id sequences to at least these values (never lowers them),
  // so that the next grant or session is above every value that may have been handed out.
  // Refuses (changing nothing) if either would then be above kMaxInState: ids would wrap.
  absl::Status RaiseFloors(FenceToken token_floor, SessionId session_floor);

  // Moves every session and lock lease expiry, and every lock delay's end, `d` later. Not a
  // record: expiry times are never logged (a restart gives every lease its full TTL again),
  // and a later expiry only ever makes a holder look held longer, never shorter. lockd uses it
  // after a stall of its own.
  void PostponeExpiries(absl::Duration d);

  // Gives every session, lock lease and provisional pool lease its full TTL from `now`, and
  // every pending lock delay its full length, unless it already ends later. Not a record, for
  // the same reason. lockd calls it at the moment it
  // begins to serve a restored state: however long the restore or a standby's wait took, a
  // restored lease then runs at least its TTL from there, so a holder's own deadline (which
  // ran from a request sent before the restore) always ends first.
  void RestartLeases(MonoTime now);

  // ---- Reading the state as of one moment, in slices (a snapshot off the request path) ----
  //
  // Freeze() marks the moment; ReadFrozen() then visits the sessions (by id) and the locks (by
  // name) as they were at that moment, a few at a time, while records go on being applied in
  // between. Before a record changes a lock or ends a session that the reading has not reached,
  // the state keeps a copy of what it was (copy on write, per lock and per session), and the
  // reading visits the copy; what the reading already passed, and what began after the moment
  // (sessions opened, names first held), it leaves alone. Only what a snapshot holds is kept:
  // expiries and confirmations are not part of it. One reading at a time; `mutable`, for reading
  // changes nothing the rules see.
  //
  // The sessions, then the locks, each visited once; the views are valid during the call.
  using FrozenSessionVisitor = std::function<void(SessionId, const SessionState&)>;
  using FrozenLockVisitor =
      std::function<void(std::string_view lock, std::span<const HolderState> holders,
                         const std::optional<LockDelay>& delay_all,
                         const std::optional<LockDelay>& delay_writers)>;
  // Begins a reading as of now, replacing one in progress.
  void Freeze() const;
  bool frozen() const { return frozen_ != nullptr; }
  // The sequences as of the moment of the reading in progress.
  FenceToken frozen_last_token() const;
  SessionId frozen_last_session_id() const;
  // Visits up to `max` more sessions and locks of the reading in progress; true when it has
  // visited them all, and the reading is over.
  bool ReadFrozen(size_t max, const FrozenSessionVisitor& session,
                  const FrozenLockVisitor& lock) const;
  // Ends the reading in progress, if any, and drops what it kept.
  void Thaw() const { frozen_.reset(); }
  // How many locks and sessions the reading in progress keeps copies of (for tests).
  size_t frozen_copies() const;

  // Null when absent. Pointers are invalidated by the next Apply().
  const SessionState* FindSession(SessionId id) const;
  // Binds `id`, which must exist, to `connection` (SessionState::connection); not a record.
  void BindSession(SessionId id, uint64_t connection);
  const LockState* FindLock(std::string_view lock) const;
  // The holder of `lock` with the lowest token: its only holder when it is held exclusive.
  const HolderState* FindHolder(std::string_view lock) const;
  const PoolState* FindPool(const std::string& pool) const;

  // Restores one pool from a snapshot as of server time `now` (each provisional lease gets its
  // full TTL again). kFailedPrecondition when the pool breaks an invariant: a lease of no
  // profile, a token above the token sequence, units above the budget, a name already restored.
  absl::Status RestorePool(const std::string& name, PoolState pool, MonoTime now);

  // Restores one holder from a snapshot as of server time `now` (its lease runs its full TTL
  // from there), after the snapshot's sessions and floors (RaiseFloors): `r` as the grant that
  // made it, in any order of names, each lock's holders in ascending token order. The token
  // sequence does not move. kFailedPrecondition for what no grant could have left: a holder of
  // no session, a token above the token sequence or not above the lock's other holders', a
  // holder the lock's holders exclude. Tokens held by two locks are the caller's to refuse.
  absl::Status RestoreHolder(const record::LockGranted& r, MonoTime now);

  // Restores the delay that a lost holder of mode `lost` started, from a snapshot, as of server
  // time `now`: it runs its full `length` from there. kFailedPrecondition for a delay that is
  // not positive.
  absl::Status RestoreDelay(const std::string& lock, LockMode lost, absl::Duration length,
                            MonoTime now);

  // Forgets the delays of `lock` that have ended by `now` (and the name, if nothing else is
  // left of it). Not a record: a restored state that still has them gives them again, which
  // only makes a delay longer.
  void ForgetEndedDelays(const std::string& lock, MonoTime now);

  // Sessions (id and TTL) and holders (lock, token, session), sorted, on one line: for
  // comparing states in tests and logs. Expiry times and sequence floors are left out.
  std::string DebugString() const;

  FenceToken last_token() const { return last_token_; }
  SessionId last_session_id() const { return last_session_id_; }
  size_t session_count() const { return sessions_.size(); }
  // Locks with at least one holder.
  size_t held_lock_count() const { return held_locks_; }
  // Sessions restored from records or snapshots that held their secret in clear (written
  // before digests); lockd writes a snapshot at once when there are any, so that the files or
  // keys that held them are dropped.
  uint64_t secrets_read_in_clear() const { return secrets_read_in_clear_; }
  // Restoring a snapshot: `n` more secrets (pool owner keys) were read in clear.
  void NoteSecretsReadInClear(uint64_t n) { secrets_read_in_clear_ += n; }

  // The earliest session or lock lease expiry, provisional pool lease expiry or lock delay
  // end, or MonoTime::Max() when nothing is pending.
  MonoTime NextExpiry() const;
  // The session (or lock lease: name and token) whose lease ends first, if it has ended by
  // `now`.
  std::optional<SessionId> ExpiredSession(MonoTime now) const;
  std::optional<std::pair<std::string, FenceToken>> ExpiredLock(MonoTime now) const;
  // The lock whose delay ends first, if it has ended by `now`.
  std::optional<std::string> EndedDelay(MonoTime now) const;
  // The provisional pool lease (pool, profile, slot) that ends first, if it has ended by `now`.
  struct PoolLeaseKey {
    std::string pool;
    std::string profile;
    std::string slot;
  };
  std::optional<PoolLeaseKey> ExpiredPoolLease(MonoTime now) const;

  // Both in key order, so that listing a page costs a seek and the page, not a sort of all
  // (the locks by name: lower_bound takes a name).
  const absl::btree_map<SessionId, SessionState>& sessions() const { return sessions_; }
  const LockSet& locks() const { return locks_; }
  const absl::btree_map<std::string, PoolState>& pools() const { return pools_; }

 private:
  absl::Status CheckOne(const record::SessionOpened& r) const;
  absl::Status CheckOne(const record::SessionRenewed& r) const;
  absl::Status CheckOne(const record::SessionEnded& r) const;
  absl::Status CheckOne(const record::LockGranted& r) const;
  // What a grant and a restored holder must both satisfy (all but the token's rise).
  absl::Status CheckHolder(const record::LockGranted& r) const;
  void AddHolder(const record::LockGranted& r, MonoTime now);
  absl::Status CheckOne(const record::LockRenewed& r) const;
  absl::Status CheckOne(const record::LockReleased& r) const;
  absl::Status CheckOne(const record::PoolPolicyPublished& r) const;
  absl::Status CheckOne(const record::PoolProfileClaimed& r) const;
  absl::Status CheckOne(const record::PoolPolicyAcked& r) const;
  absl::Status CheckOne(const record::PoolLeaseGranted& r) const;
  absl::Status CheckOne(const record::PoolLeaseRenewed& r) const;
  absl::Status CheckOne(const record::PoolLeaseActivated& r) const;
  absl::Status CheckOne(const record::PoolLeaseReleased& r) const;
  absl::Status CheckOne(const record::PoolLeaseRecovered& r) const;
  absl::Status CheckOne(const record::PoolDrainSet& r) const;
  absl::Status CheckOne(const record::PoolDeleted& r) const;
  void ApplyOne(const record::SessionOpened& r, MonoTime now);
  void ApplyOne(const record::SessionRenewed& r, MonoTime now);
  void ApplyOne(const record::SessionEnded& r, MonoTime now);
  void ApplyOne(const record::LockGranted& r, MonoTime now);
  void ApplyOne(const record::LockRenewed& r, MonoTime now);
  void ApplyOne(const record::LockReleased& r, MonoTime now);
  void ApplyOne(const record::PoolPolicyPublished& r, MonoTime now);
  void ApplyOne(const record::PoolProfileClaimed& r, MonoTime now);
  void ApplyOne(const record::PoolPolicyAcked& r, MonoTime now);
  void ApplyOne(const record::PoolLeaseGranted& r, MonoTime now);
  void ApplyOne(const record::PoolLeaseRenewed& r, MonoTime now);
  void ApplyOne(const record::PoolLeaseActivated& r, MonoTime now);
  void ApplyOne(const record::PoolLeaseReleased& r, MonoTime now);
  void ApplyOne(const record::PoolLeaseRecovered& r, MonoTime now);
  void ApplyOne(const record::PoolDrainSet& r, MonoTime now);
  void ApplyOne(const record::PoolDeleted& r, MonoTime now);
  // The pool and the lease a record names, or an error saying which is missing (or whose
  // token differs).
  absl::Status CheckLease(const std::string& pool, const std::string& profile,
                          const std::string& slot, FenceToken token) const;
  absl::Status CheckDecision(const std::string& pool, uint64_t decision) const;
  void RemoveLease(PoolState& pool, const std::string& pool_name, const PoolSlotKey& key);

  // Replaces the delay of `lock` that a lost holder of mode `lost` starts (kExclusive:
  // delay_all, kShared: delay_writers), keeping delay_ends_ in step.
  void SetDelay(LockState& state, LockMode lost, std::optional<LockDelay> value);
  // The state of `lock`, made (with no holder and no delay) if there is none.
  LockState& LockOf(std::string_view lock);
  LockState* MutableLock(std::string_view lock);
  // Before a change to `lock` (its holders or delays) or the end of `session`: keeps a copy of
  // it for the reading in progress (Freeze), if it has not read it yet.
  void KeepLock(std::string_view lock);
  void KeepSession(SessionId session);
  // Forgets `state` if it has neither holder nor delay left.
  void ForgetIfUnused(LockState* state);
  // Moves the expiry of `h`, a holder of `state`, to `at`.
  void MoveExpiry(LockState* state, HolderState& h, MonoTime at);

  absl::btree_map<SessionId, SessionState> sessions_;
  // The lock set that owns its states: a state is freed when it leaves it, and a moved-from
  // table is empty.
  class LockTable : public LockSet {
   public:
    LockTable() = default;
    LockTable(const LockTable&) = delete;
    LockTable& operator=(const LockTable&) = delete;
    LockTable(LockTable&& other) noexcept;
    LockTable& operator=(LockTable&& other) noexcept;
    ~LockTable() { Free(); }
    // Takes `state` out of the table and frees it.
    void Forget(LockState* state);
    void Free();
  };
  LockTable locks_;
  size_t held_locks_ = 0;
  // Expiry indexes, kept in step with the maps above.
  absl::btree_set<std::pair<MonoTime, SessionId>> session_expiry_;
  // Lock leases by (expiry, token) with the lock's state: tokens are unique, so the order
  // compares integers only (a KeepAlive's renewals share one expiry).
  absl::btree_map<std::pair<MonoTime, FenceToken>, LockState*> lock_expiry_;
  // (until, lock, mode of the lost holder that started it) of every pending delay.
  std::set<std::tuple<MonoTime, std::string, LockMode>> delay_ends_;
  absl::btree_map<std::string, PoolState> pools_;
  // Provisional pool leases by expiry: (expires_at, pool, profile, slot).
  std::set<std::tuple<MonoTime, std::string, std::string, std::string>> pool_expiry_;
  FenceToken last_token_;
  SessionId last_session_id_;
  uint64_t secrets_read_in_clear_ = 0;

  // The reading in progress (Freeze): how far it has read, and the copies kept of what changed
  // ahead of it.
  struct Frozen {
    struct LockCopy {  // empty: the name was not kept at the moment
      std::vector<HolderState> holders;
      std::optional<LockDelay> delay_all;
      std::optional<LockDelay> delay_writers;
    };
    FenceToken last_token;
    SessionId last_session_id;
    SessionId sessions_read;  // every session up to this id was visited
    bool sessions_done = false;
    std::map<SessionId, SessionState> sessions;  // ended since the moment, not yet visited
    bool locks_started = false;
    std::string locks_read;  // once started: every name up to this one was visited
    std::map<std::string, LockCopy, std::less<>> locks;  // changed since, not yet visited
  };
  mutable std::unique_ptr<Frozen> frozen_;
};

}  // namespace fencelock::server

#endif  // FENCELOCK_LOCK_SERVER_STATE_MACHINE_H_
