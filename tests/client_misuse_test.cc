// Misuse of the client library is an error, never a crash (issue 34): a ScopedLock that
// outlives its Client, a Client destroyed inside one of its own callbacks, a handle released
// through a Client that did not acquire it, and a Client used in a child after fork(). Against
// a real lockd.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <string>

#include "lock-client/client.h"
#include "lockd_process.h"

namespace fencelock {
namespace {

using testing::LockdProcess;

class ClientMisuseTest : public ::testing::Test {
 protected:
  std::unique_ptr<Client> NewClient(Clock* clock = nullptr) {
    ClientOptions options;
    options.server = lockd_.tcp_address();
    options.clock = clock;
    options.log = [](LogLevel, const std::string&) {};
    auto client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  LockdProcess lockd_;
};

TEST_F(ClientMisuseTest, AScopedLockThatOutlivesItsClientHoldsNothingAndSaysWhy) {
  auto client = NewClient();
  auto guard = client->acquireScoped("outlived", absl::Seconds(5));
  ASSERT_TRUE(guard.ok()) << guard.status();
  EXPECT_TRUE(guard->owns());
  client.reset();  // the session closes; lockd releases the lock with it
  try {
    guard->checkStillHeld();
    ADD_FAILURE() << "checkStillHeld passed on a lock whose client is gone";
  } catch (const LockLostException& e) {
    EXPECT_EQ(e.reason(), LossReason::kReleased);
    EXPECT_NE(std::string(e.what()).find("was destroyed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(guard->remaining(), absl::ZeroDuration());
  absl::Status released = guard->release();
  EXPECT_TRUE(absl::IsFailedPrecondition(released)) << released;
  EXPECT_NE(released.message().find("was destroyed"), std::string::npos) << released;
  // And the lock is free for the next one.
  auto other = NewClient();
  auto next = other->tryAcquire("outlived");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->has_value());
}

TEST_F(ClientMisuseTest, AScopedLockDestroyedAfterItsClientDoesNothing) {
  auto client = NewClient();
  {
    auto guard = client->acquireScoped("outlived-too", absl::Seconds(5));
    ASSERT_TRUE(guard.ok()) << guard.status();
    client.reset();
  }  // destroyed here, after its client: nothing to do, nothing touched
  SUCCEED();
}

TEST_F(ClientMisuseTest, AClientMayBeDestroyedInsideItsOwnOnLostCallback) {
  SimulatedClock clock;
  auto client = NewClient(&clock);
  auto lock = client->acquire("destroyed-in-callback", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  auto second = client->acquire("destroyed-in-callback-2", absl::Seconds(5));
  ASSERT_TRUE(second.ok()) << second.status();
  // std::promise rather than absl::Notification: Debian's Abseil is not built for TSan, which
  // would not see the hand-over.
  std::promise<void> destroyed;
  std::atomic<int> calls{0};
  auto callback = [&](LossReason) {
    if (calls.fetch_add(1) > 0) return;  // the other lease's callback: dropped, never run
    client.reset();  // from the client's own watcher thread
    destroyed.set_value();
  };
  ASSERT_TRUE(client->onLost(*lock, callback).ok());
  ASSERT_TRUE(client->onLost(*second, callback).ok());
  clock.Advance(absl::Hours(1));  // both deadlines pass at once
  auto done = destroyed.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(client, nullptr);
  EXPECT_EQ(calls.load(), 1);
  // The lock was released with the session: another client gets it.
  auto other = NewClient();
  auto next = other->acquire("destroyed-in-callback", absl::Seconds(5));
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST_F(ClientMisuseTest, AClientMayBeDestroyedInsideAnAsynchronousCallback) {
  auto client = NewClient();
  std::promise<void> destroyed;
  client->acquireAsync("destroyed-in-done", absl::Seconds(5), absl::ZeroDuration(),
                       [&](absl::StatusOr<LockHandle> lock) {
                         EXPECT_TRUE(lock.ok()) << lock.status();
                         client.reset();  // from the client's own callback thread
                         destroyed.set_value();
                       });
  auto done = destroyed.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  auto other = NewClient();
  auto next = other->acquire("destroyed-in-done", absl::Seconds(5));
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST_F(ClientMisuseTest, AHandleReleasedThroughAnotherClientIsRefusedAndStaysHeld) {
  auto owner = NewClient();
  auto stranger = NewClient();
  auto lock = owner->acquire("foreign", absl::Seconds(5));
  ASSERT_TRUE(lock.ok()) << lock.status();
  absl::Status s = stranger->release(*lock);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("another Client"), std::string::npos) << s;
  s = stranger->releaseWithNextRequest(*lock);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  std::promise<absl::Status> async;
  stranger->releaseAsync(*lock, [&](absl::Status status) { async.set_value(status); });
  s = async.get_future().get();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THROW(stranger->checkStillHeld(*lock, Confirm::kWithServer), LockLostException);
  // The owner still holds it, and releases it.
  EXPECT_NO_THROW(owner->checkStillHeld(*lock, Confirm::kWithServer));
  EXPECT_TRUE(owner->release(*lock).ok());
  auto next = stranger->tryAcquire("foreign");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->has_value());
}

TEST_F(ClientMisuseTest, AForkedChildCannotUseItsParentsClientButMayMakeItsOwn) {
  auto client = NewClient();
  auto held = client->acquire("forked", absl::Seconds(5));
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string address = lockd_.tcp_address();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: exit codes, not gtest (whose state is the parent's). A hang fails too.
    ::alarm(20);
    int code = 0;
    auto other = client->tryAcquire("forked-other");
    if (!absl::IsFailedPrecondition(other.status())) code = 10;
    try {
      client->checkStillHeld(*held);
      code = 11;
    } catch (const LockLostException& e) {
      if (std::string(e.what()).find("fork()") == std::string::npos) code = 12;
    }
    if (client->remaining(*held) != absl::ZeroDuration()) code = 13;
    if (!absl::IsFailedPrecondition(client->release(*held))) code = 14;
    std::promise<absl::Status> refused;
    client->acquireAsync("forked-async", absl::Seconds(1), absl::ZeroDuration(),
                         [&](absl::StatusOr<LockHandle> r) { refused.set_value(r.status()); });
    auto answer = refused.get_future();
    if (answer.wait_for(std::chrono::seconds(5)) != std::future_status::ready ||
        !absl::IsFailedPrecondition(answer.get())) {
      code = 18;
    }
    client.reset();  // the parent's connection and threads: let go of, never touched
    ClientOptions options;
    options.server = address;
    options.log = [](LogLevel, const std::string&) {};
    auto own = Client::Create(options);
    if (!own.ok()) {
      code = 15;
    } else {
      auto mine = (*own)->tryAcquire("forked-child");
      if (!mine.ok() || !mine->has_value()) code = 16;
      auto parents = (*own)->tryAcquire("forked");
      if (!parents.ok() || parents->has_value()) code = 17;  // still the parent's
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The parent's Client, its connection and its lock are unharmed.
  EXPECT_NO_THROW(client->checkStillHeld(*held, Confirm::kWithServer));
  EXPECT_TRUE(client->release(*held).ok());
  auto again = client->tryAcquire("forked-child");
  ASSERT_TRUE(again.ok()) << again.status();
}

// exec() after a Client: no descriptor of the client's lives on in the new program (a lockd
// connection held open by a program that never speaks the protocol).
TEST_F(ClientMisuseTest, NoDescriptorOfTheClientSurvivesExec) {
  auto client = NewClient();
  auto held = client->tryAcquire("cloexec");
  ASSERT_TRUE(held.ok()) << held.status();
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec || (target.rfind("socket:", 0) != 0 && target.rfind("anon_inode:", 0) != 0)) continue;
    const int fd = std::stoi(entry.path().filename().string());
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0) continue;  // the directory's own descriptor, closed meanwhile
    ++checked;
    EXPECT_NE(flags & FD_CLOEXEC, 0) << "descriptor " << fd << " (" << target
                                     << ") would survive exec";
  }
  EXPECT_GE(checked, 2);  // at least the connection and the runtime's epoll set
}

}  // namespace
}  // namespace fencelock
