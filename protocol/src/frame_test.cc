#include "protocol/frame.h"

#include <random>

#include "gtest/gtest.h"

namespace fencelock::protocol {
namespace {

TEST(FrameTest, RoundTripsFramesFedOneByteAtATime) {
  std::string stream;
  ASSERT_TRUE(AppendFrame("hello", &stream).ok());
  ASSERT_TRUE(AppendFrame("", &stream).ok());
  ASSERT_TRUE(AppendFrame(std::string(70000, 'x'), &stream).ok());
  EXPECT_EQ(stream.substr(0, 4), std::string("\0\0\0\5", 4));

  FrameDecoder decoder;
  std::vector<std::string> frames;
  std::string payload;
  for (char c : stream) {
    decoder.Feed(std::string_view(&c, 1));
    while (decoder.Next(&payload) == FrameDecoder::Result::kFrame) frames.push_back(payload);
  }
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0], "hello");
  EXPECT_EQ(frames[1], "");
  EXPECT_EQ(frames[2], std::string(70000, 'x'));
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameTest, RandomSplitsYieldTheSameFrames) {
  const unsigned seed = 20261129;
  std::printf("seed=%u\n", seed);
  std::mt19937 rng(seed);
  std::vector<std::string> sent;
  std::string stream;
  for (int i = 0; i < 200; ++i) {
    std::string p(rng() % 3000, static_cast<char>('a' + i % 26));
    sent.push_back(p);
    ASSERT_TRUE(AppendFrame(p, &stream).ok());
  }
  FrameDecoder decoder;
  std::vector<std::string> got;
  std::string payload;
  for (size_t at = 0; at < stream.size();) {
    size_t n = std::min<size_t>(stream.size() - at, 1 + rng() % 5000);
    decoder.Feed(std::string_view(stream).substr(at, n));
    at += n;
    while (decoder.Next(&payload) == FrameDecoder::Result::kFrame) got.push_back(payload);
  }
  EXPECT_EQ(got, sent);
}

TEST(FrameTest, EncoderRefusesOversizePayload) {
  std::string out = "keep";
  absl::Status s = AppendFrame(std::string(11, 'x'), &out, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, "keep");
  EXPECT_TRUE(AppendFrame(std::string(10, 'x'), &out, 10).ok());
}

TEST(FrameTest, DecoderRefusesOversizeAnnouncementWithoutWaitingForBody) {
  FrameDecoder decoder(1024);
  decoder.Feed(std::string("\x00\x00\x04\x01", 4));  // announces 1025 bytes
  std::string payload;
  EXPECT_EQ(decoder.Next(&payload), FrameDecoder::Result::kTooLarge);
  EXPECT_EQ(decoder.announced_length(), 1025u);
  decoder.Feed("more");
  EXPECT_EQ(decoder.Next(&payload), FrameDecoder::Result::kTooLarge);
}

TEST(FrameTest, DefaultMaximumIsOneMebibyte) {
  FrameDecoder decoder;
  std::string header("\x00\x10\x00\x00", 4);  // exactly 1 MiB: allowed
  decoder.Feed(header);
  std::string payload;
  EXPECT_EQ(decoder.Next(&payload), FrameDecoder::Result::kNeedMore);
  FrameDecoder over;
  over.Feed(std::string("\x00\x10\x00\x01", 4));
  EXPECT_EQ(over.Next(&payload), FrameDecoder::Result::kTooLarge);
}

}  // namespace
}  // namespace fencelock::protocol
