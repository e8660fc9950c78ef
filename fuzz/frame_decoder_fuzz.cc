// The wire frame decoder (protocol/frame.h) over arbitrary bytes fed in arbitrary chunks:
// every frame it returns is within the maximum and survives re-encoding; an oversize
// announcement is reported, and then for good.
#include <cstdlib>

#include "fuzz_support.h"
#include "protocol/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fencelock::protocol::FrameDecoder;
  fencelock::fuzz::Input in(data, size);
  const size_t max_frame = 64 + in.Byte() * 16;
  const size_t chunk = 1 + in.Byte();
  FrameDecoder decoder(max_frame);
  std::string payload;
  bool too_large = false;
  while (!in.empty()) {
    decoder.Feed(in.Bytes(chunk));
    for (;;) {
      const FrameDecoder::Result r = decoder.Next(&payload);
      if (r == FrameDecoder::Result::kNeedMore) break;
      if (r == FrameDecoder::Result::kTooLarge) {
        if (decoder.announced_length() <= max_frame) std::abort();
        too_large = true;
        break;
      }
      if (too_large || payload.size() > max_frame) std::abort();
      std::string again;
      if (!fencelock::protocol::AppendFrame(payload, &again, max_frame).ok()) std::abort();
      FrameDecoder check(max_frame);
      check.Feed(again);
      std::string back;
      if (check.Next(&back) != FrameDecoder::Result::kFrame || back != payload) std::abort();
    }
    if (too_large && decoder.Next(&payload) != FrameDecoder::Result::kTooLarge) std::abort();
  }
  return 0;
}
