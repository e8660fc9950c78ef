#include "lock-server/testing/legacy_state.h"

#include "lock-server/storage.h"

namespace fencelock::server {
namespace {

void Varint(std::string* out, uint64_t v) {
  do {
    out->push_back(static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
}

// A length-delimited field.
void Field(std::string* out, int number, const std::string& bytes) {
  out->push_back(static_cast<char>(number << 3 | 2));
  Varint(out, bytes.size());
  *out += bytes;
}

void Number(std::string* out, int number, uint64_t value) {
  out->push_back(static_cast<char>(number << 3));
  Varint(out, value);
}

}  // namespace

std::string SnapshotWithAPoolOwnerKeyInClear(const std::string& pool, const std::string& profile,
                                             const std::string& key) {
  std::string spec;  // PoolProfile
  Field(&spec, 1, profile);
  Number(&spec, 2, 1);  // cost
  std::string owner;  // SnapshotPoolOwner
  Field(&owner, 1, profile);
  Number(&owner, 2, 1);  // epoch
  Field(&owner, 3, key);  // the key, in clear
  Number(&owner, 4, 1);  // acked_generation
  std::string p;  // SnapshotPool
  Field(&p, 1, pool);
  Number(&p, 2, 1);  // generation
  Number(&p, 3, 4);  // budget
  Field(&p, 4, spec);
  Field(&p, 6, owner);
  Number(&p, 8, 1);  // decision
  std::string snapshot;  // Snapshot
  Field(&snapshot, 6, p);  // pools
  return EncodeRawSnapshot(snapshot);
}

std::string SnapshotWithASecretInClear(SessionId session, absl::Duration ttl,
                                       const std::string& secret) {
  std::string entry;  // SnapshotSession
  entry.push_back(0x08);  // session_id
  Varint(&entry, session.value());
  entry.push_back(0x10);  // ttl_ns
  Varint(&entry, static_cast<uint64_t>(absl::ToInt64Nanoseconds(ttl)));
  entry.push_back(0x1a);  // secret, in clear
  Varint(&entry, secret.size());
  entry += secret;
  std::string snapshot;  // Snapshot (last_lsn 0 is the default, left out)
  snapshot.push_back(0x18);  // last_session_id
  Varint(&snapshot, session.value());
  snapshot.push_back(0x22);  // sessions
  Varint(&snapshot, entry.size());
  snapshot += entry;
  return EncodeRawSnapshot(snapshot);
}

}  // namespace fencelock::server
