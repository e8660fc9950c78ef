#include "protocol/frame.h"

#include "absl/strings/str_cat.h"

namespace fencelock::protocol {

absl::Status AppendFrame(std::string_view payload, std::string* out, size_t max_frame_bytes) {
  if (payload.size() > max_frame_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("frame payload of ", payload.size(),
                                                   " bytes exceeds the maximum of ",
                                                   max_frame_bytes, " bytes"));
  }
  char header[kFrameHeaderBytes];
  WriteFrameHeader(static_cast<uint32_t>(payload.size()), header);
  out->append(header, kFrameHeaderBytes);
  out->append(payload);
  return absl::OkStatus();
}

void WriteFrameHeader(uint32_t payload_bytes, char* out) {
  out[0] = static_cast<char>(payload_bytes >> 24);
  out[1] = static_cast<char>(payload_bytes >> 16);
  out[2] = static_cast<char>(payload_bytes >> 8);
  out[3] = static_cast<char>(payload_bytes);
}

void FrameDecoder::Feed(std::string_view bytes) {
  if (too_large_) return;
  // Compact once the consumed prefix dominates, so the buffer does not grow without bound.
  if (consumed_ > 0 && consumed_ * 2 >= buffer_.size()) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes);
}

FrameDecoder::Result FrameDecoder::Next(std::string* payload) {
  if (too_large_) return Result::kTooLarge;
  if (buffered() < kFrameHeaderBytes) return Result::kNeedMore;
  const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data() + consumed_);
  const uint64_t n = (uint64_t{p[0]} << 24) | (uint64_t{p[1]} << 16) | (uint64_t{p[2]} << 8) |
                     uint64_t{p[3]};
  if (n > max_frame_bytes_) {
    too_large_ = true;
    announced_length_ = n;
    return Result::kTooLarge;
  }
  if (buffered() - kFrameHeaderBytes < n) return Result::kNeedMore;
  payload->assign(buffer_, consumed_ + kFrameHeaderBytes, n);
  consumed_ += kFrameHeaderBytes + n;
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  }
  return Result::kFrame;
}

}  // namespace fencelock::protocol
