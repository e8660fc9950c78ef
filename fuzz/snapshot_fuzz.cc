// The snapshot loader: recovery of a state directory whose snapshot-0 is the input. Odd first
// byte: the rest is the file as it is. Even: the rest is the payload behind a valid header
// and checksums, so that decoding and the consistency checks are reached. Recovery must
// either succeed with a consistent state or fail with an error; never crash.

#include "fuzz_support.h"
#include "lock-server/storage.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fencelock;
  using namespace fencelock::server;
  fuzz::Input in(data, size);
  const bool raw = in.Byte() & 1;
  const std::string_view rest = in.Rest();
  MemEnv env;
  fuzz::WriteStateDir(env, raw ? std::string(rest) : EncodeRawSnapshot(rest), "");
  fuzz::RecoverAndCheck(env);
  return 0;
}
