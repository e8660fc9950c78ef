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

}  // namespace

std::string SnapshotWithASecretInClear(SessionId session, absl::Duration ttl,
                                       const std::string& secret) {
  std::string entry;  // SnapshotSession
  entry.push_back(0x08);  // session_id
  Varint(&entry, session);
  entry.push_back(0x10);  // ttl_ns
  Varint(&entry, static_cast<uint64_t>(absl::ToInt64Nanoseconds(ttl)));
  entry.push_back(0x1a);  // secret, in clear
  Varint(&entry, secret.size());
  entry += secret;
  std::string snapshot;  // Snapshot (last_lsn 0 is the default, left out)
  snapshot.push_back(0x18);  // last_session_id
  Varint(&snapshot, session);
  snapshot.push_back(0x22);  // sessions
  Varint(&snapshot, entry.size());
  snapshot += entry;
  return EncodeRawSnapshot(snapshot);
}

}  // namespace fencelock::server
