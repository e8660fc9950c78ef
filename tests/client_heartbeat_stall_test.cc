// A heartbeat whose reply is held does not hold up the rest of the client (issue 19): between
// the client and a real lockd sits a proxy that understands frames and keeps back only
// KeepAlive and Renew replies, until the test lets them go. Every other reply passes at once. While the
// heartbeat waits, acquire, release and checkStillHeld on the same client must all finish.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "fencelock/wire.pb.h"
#include "gtest/gtest.h"
#include "lock-client/client.h"
#include "lockd_process.h"
#include "protocol/frame.h"

namespace fencelock {
namespace {

bool WriteAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// One client connection to lockd on `upstream_port`; KeepAlive replies are kept until
// ReleaseHeld(), everything else is forwarded as it comes.
class KeepAliveReplyHolder {
 public:
  explicit KeepAliveReplyHolder(int upstream_port) : upstream_port_(upstream_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_, 1), 0);
    EXPECT_EQ(::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~KeepAliveReplyHolder() {
    ReleaseHeld();
    ::shutdown(listener_, SHUT_RDWR);
    for (int fd : {client_.load(), server_.load()}) {
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }
    acceptor_.join();
    for (std::thread& t : pumps_) t.join();
    for (int fd : {listener_, client_.load(), server_.load()}) {
      if (fd >= 0) ::close(fd);
    }
  }
  int port() const { return port_; }
  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  // Forwards the held KeepAlive replies, and every later one at once.
  void ReleaseHeld() {
    std::lock_guard<std::mutex> lock(mu_);
    holding_ = false;
    for (const std::string& frame : held_) WriteAll(client_, frame);
    held_.clear();
  }

 private:
  void Accept() {
    const int client = ::accept(listener_, nullptr, nullptr);
    if (client < 0) return;
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(upstream_port_));
    if (::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(client);
      ::close(server);
      return;
    }
    client_ = client;
    server_ = server;
    pumps_.emplace_back([this] { ToServer(); });
    pumps_.emplace_back([this] { ToClient(); });
  }
  void ToServer() {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(client_, buf, sizeof(buf), 0);
      if (n <= 0 || !WriteAll(server_, std::string(buf, static_cast<size_t>(n)))) break;
    }
    ::shutdown(server_, SHUT_WR);
  }
  void ToClient() {
    protocol::FrameDecoder decoder;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(server_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      decoder.Feed(std::string_view(buf, static_cast<size_t>(n)));
      std::string payload;
      while (decoder.Next(&payload) == protocol::FrameDecoder::Result::kFrame) {
        wire::Response response;
        std::string frame;
        EXPECT_TRUE(response.ParseFromString(payload));
        EXPECT_TRUE(protocol::AppendFrame(payload, &frame).ok());
        std::lock_guard<std::mutex> lock(mu_);
        if (holding_ && (response.has_keep_alive() || response.has_renew())) {
          held_.push_back(std::move(frame));
        } else {
          WriteAll(client_, frame);
        }
      }
    }
    ::shutdown(client_, SHUT_WR);
  }

  const int upstream_port_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<int> client_{-1}, server_{-1};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;
  std::mutex mu_;
  bool holding_ = true;             // guarded by mu_
  std::vector<std::string> held_;   // guarded by mu_; whole frames
};

template <typename T>
bool Finishes(std::future<T>& f) {
  return f.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
}

// A client through `holder`, with a 10 min lock TTL, a session of `session_ttl` and a
// heartbeat every `heartbeat`.
absl::StatusOr<std::unique_ptr<Client>> ThroughHolder(const KeepAliveReplyHolder& holder,
                                                      absl::Duration session_ttl,
                                                      absl::Duration heartbeat) {
  ClientOptions options;
  options.server = "127.0.0.1:" + std::to_string(holder.port());
  options.session_ttl = session_ttl;
  options.default_lock_ttl = absl::Minutes(10);
  options.heartbeat_interval = heartbeat;
  options.request_timeout = absl::Seconds(60);
  return Client::Create(options);
}

TEST(ClientHeartbeatStallTest, AHeldHeartbeatReplyHoldsUpNoAcquireReleaseOrCheck) {
  testing::LockdProcess lockd;
  KeepAliveReplyHolder holder(lockd.port());
  // The test sends the one heartbeat: the background one is a minute away. The leases are
  // long enough that no grant needs a renewal before it is returned (that would be a KeepAlive
  // too, and held).
  auto client = ThroughHolder(holder, absl::Minutes(10), absl::Minutes(1));
  ASSERT_TRUE(client.ok()) << client.status();
  auto a = (*client)->acquire("a", absl::Seconds(5));
  auto c = (*client)->acquire("c", absl::Seconds(5));
  ASSERT_TRUE(a.ok() && c.ok());
  ASSERT_EQ(holder.held(), 0u);

  std::future<absl::Status> heartbeat =
      std::async(std::launch::async, [&] { return (*client)->renewNow(); });
  for (int i = 0; i < 10'000 && holder.held() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(holder.held(), 1u) << "the heartbeat's reply never reached the proxy";

  // While that reply is held: a new lock, its release, a check, and the release of a lock the
  // held heartbeat renews.
  auto acquired = std::async(std::launch::async, [&] { return (*client)->acquire("b", absl::Seconds(5)); });
  ASSERT_TRUE(Finishes(acquired)) << "acquire waited for the held heartbeat";
  auto b = acquired.get();
  ASSERT_TRUE(b.ok()) << b.status();
  auto released = std::async(std::launch::async, [&] { return (*client)->release(*b); });
  ASSERT_TRUE(Finishes(released)) << "release waited for the held heartbeat";
  EXPECT_TRUE(released.get().ok());
  EXPECT_NO_THROW((*client)->checkStillHeld(*a));
  auto released_c = std::async(std::launch::async, [&] { return (*client)->release(*c); });
  ASSERT_TRUE(Finishes(released_c)) << "releasing a lock the held heartbeat names waited for its reply";
  EXPECT_TRUE(released_c.get().ok());
  EXPECT_EQ(holder.held(), 1u);  // all of it happened while the reply was still held
  EXPECT_EQ(heartbeat.wait_for(std::chrono::seconds(0)), std::future_status::timeout);

  holder.ReleaseHeld();
  ASSERT_TRUE(Finishes(heartbeat));
  EXPECT_TRUE(heartbeat.get().ok());
  EXPECT_NO_THROW((*client)->checkStillHeld(*a));
  // lockd saw the KeepAlive that named c before c's release: nothing was fenced out.
  EXPECT_EQ((*client)->metrics()->GetCounter("lock_client_fenced_out_total", "").value(), 0);
  EXPECT_TRUE((*client)->release(*a).ok());
}

// The background heartbeat (a Renew on protocol 6, ADR 0014): while its reply is held the
// client goes on, and once it arrives every lease's deadline counts from when it was sent.
TEST(ClientHeartbeatStallTest, AHeldRenewHoldsUpNothingAndCountsFromItsSend) {
  testing::LockdProcess lockd;
  KeepAliveReplyHolder holder(lockd.port());
  // The session outlasts the lock, so that the lock's own lease decides its deadline.
  auto client = ThroughHolder(holder, absl::Minutes(20), absl::Milliseconds(300));
  ASSERT_TRUE(client.ok()) << client.status();
  auto a = (*client)->acquire("a", absl::Seconds(5));
  ASSERT_TRUE(a.ok()) << a.status();
  const absl::Duration before = (*client)->remaining(*a);
  for (int i = 0; i < 10'000 && holder.held() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(holder.held(), 1u) << "no heartbeat reply reached the proxy";
  absl::SleepFor(absl::Seconds(1));  // three periods: still the one heartbeat in flight
  EXPECT_EQ(holder.held(), 1u);
  auto b = (*client)->acquire("b", absl::Seconds(5));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE((*client)->release(*b).ok());
  EXPECT_NO_THROW((*client)->checkStillHeld(*a));
  // Nothing was renewed meanwhile: what is left only shrank.
  EXPECT_LT((*client)->remaining(*a), before);
  const absl::Duration held = (*client)->remaining(*a);
  holder.ReleaseHeld();
  for (int i = 0; i < 10'000 && (*client)->remaining(*a) <= held; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  // Renewed, and counted from the send (over 1 s ago: before the sleep), not from the reply.
  const absl::Duration after = (*client)->remaining(*a);
  EXPECT_GT(after, held);
  EXPECT_LT(after, absl::Minutes(10) * 0.7 - absl::Seconds(1));
  EXPECT_EQ((*client)->metrics()->GetCounter("lock_client_fenced_out_total", "").value(), 0);
  EXPECT_TRUE((*client)->release(*a).ok());
}

}  // namespace
}  // namespace fencelock
