// The state-log record decoder: recovery of a state directory whose WAL segment holds the
// input. Odd first byte: the rest is the segment's bytes as they are (headers, checksums and
// all). Even: the rest is [u16 length][payload]... and each payload gets a valid record
// header, so that decoding and replay past the checksums are reached. Recovery must either
// succeed with a state that keeps its own invariants or fail with an error; never crash.

#include "fuzz_support.h"
#include "lock-server/storage.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fencelock;
  using namespace fencelock::server;
  fuzz::Input in(data, size);
  std::string records;
  if (in.Byte() & 1) {
    records = std::string(in.Rest());
  } else {
    while (!in.empty()) records += EncodeRawRecordFrame(in.Bytes(in.U16() % 1024));
  }
  MemEnv env;
  fuzz::WriteStateDir(env, EncodeSnapshot(StateMachine(), 0), records);
  fuzz::RecoverAndCheck(env);
  return 0;
}
