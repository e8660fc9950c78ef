#include "fuzz_support.h"

#include <cstdio>
#include <cstdlib>

#include "google/protobuf/stubs/logging.h"
#include "lock-server/storage.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

namespace fencelock::fuzz {

void WriteStateDir(server::MemEnv& env, const std::string& snapshot, const std::string& records) {
  using namespace server;
  const std::string dir = kStateDir;
  (void)env.CreateDir(dir);
  env.PutFile(dir + "/" + kFormatFile, kFormatContents);
  env.PutFile(dir + "/" + kSequencesFile,
              EncodeSequences(Sequences{.token_hwm = FenceToken(1'000'000),
                                        .session_hwm = SessionId(1'000'000)}));
  env.PutFile(dir + "/" + SnapshotName(0), snapshot);
  // A preallocated segment: header, the records, then zeros to its allocated size.
  const uint64_t size = kSegmentHeaderBytes + records.size() + 64;
  std::string segment = EncodeSegmentHeader(1, size) + records;
  segment.resize(size, '\0');
  env.PutFile(dir + "/" + SegmentName(1), segment);
}

void RecoverAndCheck(server::MemEnv& env) {
  auto recovered = server::Recover(&env, kStateDir, MonoTime::FromNanos(1'000'000'000'000));
  if (!recovered.ok()) return;
  const server::StateMachine& state = recovered->state;
  auto fail = [](const char* what) {
    std::fprintf(stderr, "recovered state broken: %s\n", what);
    std::abort();
  };
  for (const server::LockState* held : state.locks()) {
    for (const server::HolderState& holder : held->holders()) {
      const server::SessionState* session = state.FindSession(holder.session);
      if (session == nullptr || !session->locks.contains(held->name())) {
        fail("a holder without its session");
      }
      if (holder.token > state.last_token()) fail("a token above the sequence");
      if (holder.mode != held->holders().front().mode) {
        fail("shared and exclusive holders together");
      }
    }
    if (held->holders().size() > 1 && held->mode() == server::LockMode::kExclusive) {
      fail("two exclusive holders");
    }
  }
  if (recovered->report.token_floor < state.last_token()) fail("restart would reissue a token");
}

}  // namespace fencelock::fuzz
