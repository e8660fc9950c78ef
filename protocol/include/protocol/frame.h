// Length-prefixed framing for the fencelock wire protocol.
//
// A frame is a 4-byte big-endian payload length followed by that many bytes of a serialized
// fencelock.wire.Request or Response. Frames longer than the maximum (1 MiB by default) are
// refused by both the encoder and the decoder. Nothing here touches a socket: the decoder is
// fed whatever bytes the transport read and hands back whole frames.
#ifndef FENCELOCK_PROTOCOL_FRAME_H_
#define FENCELOCK_PROTOCOL_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace fencelock::protocol {

inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr size_t kDefaultMaxFrameBytes = size_t{1} << 20;

// Appends one frame carrying `payload` to `*out`. Returns kInvalidArgument (and leaves `*out`
// untouched) when the payload is longer than `max_frame_bytes`.
absl::Status AppendFrame(std::string_view payload, std::string* out,
                         size_t max_frame_bytes = kDefaultMaxFrameBytes);

// Writes the header of a frame whose payload is `payload_bytes` long into `out`
// (kFrameHeaderBytes bytes), for a caller that serializes the payload in place behind it.
void WriteFrameHeader(uint32_t payload_bytes, char* out);

// Splits a byte stream into frame payloads. Not thread-safe; one decoder per connection.
class FrameDecoder {
 public:
  enum class Result {
    kFrame,     // *payload holds the next frame's payload.
    kNeedMore,  // no complete frame buffered yet: feed more bytes.
    kTooLarge,  // the next frame announces more than the maximum; the stream is unusable.
  };

  explicit FrameDecoder(size_t max_frame_bytes = kDefaultMaxFrameBytes)
      : max_frame_bytes_(max_frame_bytes) {}

  // Appends bytes read from the stream.
  void Feed(std::string_view bytes);

  // Takes the next complete frame, if any. Once it returns kTooLarge it keeps returning it.
  Result Next(std::string* payload);

  // The length the offending frame announced, valid after Next() returned kTooLarge.
  uint64_t announced_length() const { return announced_length_; }
  size_t max_frame_bytes() const { return max_frame_bytes_; }
  // Bytes fed but not yet returned in a frame.
  size_t buffered() const { return buffer_.size() - consumed_; }

 private:
  size_t max_frame_bytes_;
  std::string buffer_;
  size_t consumed_ = 0;
  uint64_t announced_length_ = 0;
  bool too_large_ = false;
};

}  // namespace fencelock::protocol

#endif  // FENCELOCK_PROTOCOL_FRAME_H_
