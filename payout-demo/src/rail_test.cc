// The rail: its protocol parser, its ledger and fence, and the real payout-rail process, which
// rejects and counts a duplicate submit and never pays twice.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "payout-demo/rail.h"
#include "process/process.h"

namespace fencelock::payout {
namespace {

using ::testing::HasSubstr;
using Kind = RailReply::Kind;

class TempDirectory {
 public:
  TempDirectory() {
    path_ = std::filesystem::temp_directory_path() /
            ("rail-test-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(path_);
  }
  ~TempDirectory() { std::filesystem::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

TEST(RailProtocolTest, RoundTripsAndRejectsBadLines) {
  for (const std::string line : {"HELLO", "STATS", "SUBMIT payout/1 7 100", "STATUS payout/1 7"}) {
    auto r = ParseRailRequest(line);
    ASSERT_TRUE(r.ok()) << line << ": " << r.status();
    EXPECT_EQ(FormatRailRequest(*r), line);
  }
  for (const std::string line : {"PAID 3", "DUPLICATE 3", "FENCED 9", "UNPAID",
                                 "HELLO read_timeout_ms=500", "STATS fenced_out=1 paid=2"}) {
    auto r = ParseRailReply(line);
    ASSERT_TRUE(r.ok()) << line << ": " << r.status();
    EXPECT_EQ(FormatRailReply(*r), line);
  }
  for (const std::string& line : std::vector<std::string>{"", "PAY x 1 1", "SUBMIT payout/1 0 100", "SUBMIT payout/1 7 -5",
                                 "SUBMIT payout/1 7", "STATUS payout/1 x", "HELLO there",
                                 std::string(600, 'S')}) {
    auto r = ParseRailRequest(line);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << line;
  }
  EXPECT_FALSE(ParseRailReply("PAID").ok());
  EXPECT_FALSE(ParseRailReply("HELLO read_timeout_ms=0").ok());
}

TEST(RailLedgerTest, PaysOnceFencesStaleTokensAndCountsDuplicates) {
  TempDirectory dir;
  auto ledger = RailLedger::Open(dir / "rail.db");
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  RailLedger& rail = **ledger;

  EXPECT_EQ(rail.Status("payout/1", 5)->kind, Kind::kUnpaid);
  auto paid = rail.Submit("payout/1", 5, 100);
  ASSERT_EQ(paid->kind, Kind::kPaid);
  auto again = rail.Submit("payout/1", 5, 100);
  EXPECT_EQ(again->kind, Kind::kDuplicate);
  EXPECT_EQ(again->txn, paid->txn);
  auto status = rail.Status("payout/1", 6);  // a later holder asks, and raises the fence
  EXPECT_EQ(status->kind, Kind::kPaid);
  EXPECT_EQ(status->txn, paid->txn);
  auto stale = rail.Submit("payout/1", 5, 100);
  EXPECT_EQ(stale->kind, Kind::kFenced);
  EXPECT_EQ(stale->highest, 6u);
  EXPECT_EQ(rail.Status("payout/1", 4)->kind, Kind::kFenced);

  auto stats = rail.Stats();
  EXPECT_EQ(stats->paid, 1);
  EXPECT_EQ(stats->submits, 3);
  EXPECT_EQ(stats->duplicate_attempted, 1);
  EXPECT_EQ(stats->fenced_out, 2);
  EXPECT_EQ(stats->status_queries, 3);
  EXPECT_EQ((*rail.PaymentsPerPayout())["payout/1"], 1);
}

TEST(RailLedgerTest, AStatusQueryFencesOffAnEarlierHoldersLateSubmit) {
  TempDirectory dir;
  auto rail = std::move(*RailLedger::Open(dir / "rail.db"));
  // Holder 10 is paused before its submit; holder 11 asks, finds nothing, pays.
  EXPECT_EQ(rail->Status("payout/2", 11)->kind, Kind::kUnpaid);
  EXPECT_EQ(rail->Submit("payout/2", 10, 100)->kind, Kind::kFenced) << "the paused one wakes";
  EXPECT_EQ(rail->Submit("payout/2", 11, 100)->kind, Kind::kPaid);
  EXPECT_EQ(rail->Stats()->duplicate_attempted, 0);
  EXPECT_EQ((*rail->PaymentsPerPayout())["payout/2"], 1);
}

TEST(RailLedgerTest, LedgerAndFenceSurviveReopen) {
  TempDirectory dir;
  {
    auto rail = std::move(*RailLedger::Open(dir / "rail.db"));
    ASSERT_EQ(rail->Submit("payout/3", 8, 100)->kind, Kind::kPaid);
  }
  auto rail = std::move(*RailLedger::Open(dir / "rail.db"));
  EXPECT_EQ(rail->Submit("payout/3", 7, 100)->kind, Kind::kFenced);
  EXPECT_EQ(rail->Submit("payout/3", 8, 100)->kind, Kind::kDuplicate);
  EXPECT_EQ((*rail->PaymentsPerPayout())["payout/3"], 1);
}

// The real process, over TCP.
class RailProcessTest : public ::testing::Test {
 protected:
  void Start(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--db=" + dir_ / "rail.db", "--port=0",
                                      "--port-file=" + dir_ / "port", "--latency=5ms",
                                      "--read-timeout=300ms"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::filesystem::remove(dir_ / "port");  // a restart must not read the last run's port
    auto child = process::Child::Spawn(RAIL_BINARY, args, {.stdout_file = dir_ / "rail.log",
                                                            .stderr_file = dir_ / "rail.log"});
    ASSERT_TRUE(child.ok()) << child.status();
    rail_ = std::move(*child);
    auto port = process::AwaitPortFile(dir_ / "port", rail_, absl::Seconds(10));
    ASSERT_TRUE(port.ok()) << port.status();
    address_ = "127.0.0.1:" + std::to_string(*port);
  }
  ~RailProcessTest() override {
    if (rail_.running()) {
      EXPECT_EQ(process::DescribeStatus(rail_.Stop()), "exited 0");
    }
  }
  std::unique_ptr<RailClient> Connect() {
    auto c = RailClient::Connect(address_, absl::Seconds(5));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  TempDirectory dir_;
  process::Child rail_;
  std::string address_;
};

TEST_F(RailProcessTest, RejectsAndCountsADuplicateSubmitAndNeverPaysTwice) {
  ASSERT_NO_FATAL_FAILURE(Start());
  auto first = Connect();
  ASSERT_NE(first, nullptr);
  auto second = Connect();
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(first->read_timeout(), absl::Milliseconds(300));
  const RailRequest submit{.kind = RailRequest::Kind::kSubmit, .payout = "payout/9", .token = 3,
                           .amount_cents = 500};
  auto paid = first->Call(submit);
  ASSERT_TRUE(paid.ok()) << paid.status();
  EXPECT_EQ(paid->kind, Kind::kPaid);
  auto dup = second->Call(submit);
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_EQ(dup->kind, Kind::kDuplicate);
  EXPECT_EQ(dup->txn, paid->txn);
  auto stats = first->Call({.kind = RailRequest::Kind::kStats});
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->stats["duplicate_attempted"], 1);
  EXPECT_EQ(stats->stats["paid"], 1);

  // The counter and the ledger persist across a restart of the rail.
  EXPECT_EQ(process::DescribeStatus(rail_.Stop()), "exited 0");
  ASSERT_NO_FATAL_FAILURE(Start());
  auto after = Connect();
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(after->Call(submit)->kind, Kind::kDuplicate);
  EXPECT_EQ(after->Call({.kind = RailRequest::Kind::kStats})->stats["duplicate_attempted"], 2);
  rail_.Stop();
  auto ledger = RailLedger::Open(dir_ / "rail.db");
  EXPECT_EQ((*(*ledger)->PaymentsPerPayout())["payout/9"], 1);
}

// Sends `lines` on one raw connection and returns the reply lines (RailClient only sends
// well-formed requests).
std::vector<std::string> RawExchange(int port, const std::vector<std::string>& lines) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<std::string> replies;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return replies;
  }
  std::string pending;
  for (const std::string& line : lines) {
    const std::string out = line + "\n";
    if (write(fd, out.data(), out.size()) != static_cast<ssize_t>(out.size())) break;
    while (pending.find('\n') == std::string::npos) {
      char buf[1024];
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      pending.append(buf, static_cast<size_t>(n));
    }
    const size_t nl = pending.find('\n');
    if (nl == std::string::npos) break;
    replies.push_back(pending.substr(0, nl));
    pending.erase(0, nl + 1);
  }
  close(fd);
  return replies;
}

TEST_F(RailProcessTest, BadLinesGetAClearErrorAndTheConnectionKeepsWorking) {
  ASSERT_NO_FATAL_FAILURE(Start());
  const int port = std::stoi(address_.substr(address_.rfind(':') + 1));
  auto replies = RawExchange(port, {"PAY payout/1 1 1", "SUBMIT payout/1 -3 100",
                                    "SUBMIT payout/1 3", "STATUS payout/1 1", "HELLO"});
  ASSERT_EQ(replies.size(), 5u);
  EXPECT_THAT(replies[0], HasSubstr("ERROR bad rail line \"PAY payout/1 1 1\": unknown command"));
  EXPECT_THAT(replies[1], HasSubstr("ERROR"));
  EXPECT_THAT(replies[1], HasSubstr("token must be a positive integer"));
  EXPECT_THAT(replies[2], HasSubstr("SUBMIT takes 3 arguments"));
  EXPECT_EQ(replies[3], "UNPAID");
  EXPECT_EQ(replies[4], "HELLO read_timeout_ms=300");
  // A line longer than 512 bytes cannot be resynchronized: an error, then the connection ends.
  auto too_long = RawExchange(port, {std::string(600, 'X'), "HELLO"});
  ASSERT_EQ(too_long.size(), 1u);
  EXPECT_EQ(too_long[0], "ERROR line longer than 512 bytes");
  // Nothing was paid by any of it.
  auto stats = RawExchange(port, {"STATS"});
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_THAT(stats[0], HasSubstr("paid=0"));
}

TEST_F(RailProcessTest, ASlowRailTimesOutAtTheAnnouncedReadTimeout) {
  ASSERT_NO_FATAL_FAILURE(Start({"--latency=600ms"}));  // longer than the 300 ms read timeout
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  auto r = client->Call({.kind = RailRequest::Kind::kStatus, .payout = "payout/1", .token = 1});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  // The next call reconnects (and times out the same way; the rail itself is healthy).
  EXPECT_EQ(client->Call({.kind = RailRequest::Kind::kHello}).status().code(), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace fencelock::payout
