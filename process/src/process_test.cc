// Child: what a runner relies on when it starts, waits for and stops processes.
#include "process/process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fencelock::process {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class ProcessTest : public ::testing::Test {
 protected:
  ProcessTest() {
    const char* tmp = std::getenv("TMPDIR");
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/process-test-XXXXXX";
    if (mkdtemp(dir_.data()) == nullptr) std::abort();
  }
  ~ProcessTest() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

TEST_F(ProcessTest, WaitReturnsTheExitStatus) {
  auto child = Child::Spawn("/bin/sh", {"-c", "exit 3"});
  ASSERT_TRUE(child.ok()) << child.status();
  auto status = child->Wait(absl::Seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(DescribeStatus(*status), "exited 3");
  EXPECT_FALSE(child->running());
  EXPECT_EQ(child->Wait(), status);  // reaped once, answered again
}

TEST_F(ProcessTest, WaitWithATimeoutReturnsAsSoonAsTheChildExits) {
  auto child = Child::Spawn("/bin/sh", {"-c", "sleep 0.2; exit 5"});
  ASSERT_TRUE(child.ok()) << child.status();
  // The timeout is far longer than the test's own limit: only the child's exit can end the wait.
  auto status = child->Wait(absl::Hours(1));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(DescribeStatus(*status), "exited 5");
}

TEST_F(ProcessTest, WaitTimesOutOnARunningChildAndStopEndsIt) {
  auto child = Child::Spawn("/bin/sleep", {"60"});
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->Wait(absl::Milliseconds(50)), std::nullopt);
  EXPECT_EQ(child->Wait(absl::ZeroDuration()), std::nullopt);
  EXPECT_TRUE(child->running());
  EXPECT_EQ(DescribeStatus(child->Stop()), "killed by SIGTERM");
}

TEST_F(ProcessTest, StopResumesAStoppedChildAndKillsOneThatIgnoresSigterm) {
  // exec: the sleeper is the child itself (it inherits the ignored SIGTERM), not an orphan.
  auto child = Child::Spawn("/bin/sh", {"-c", "trap '' TERM; kill -STOP $$; exec sleep 60"});
  ASSERT_TRUE(child.ok()) << child.status();
  for (int i = 0; i < 6000 && !child->stopped(); ++i) usleep(1000);
  ASSERT_TRUE(child->stopped());
  EXPECT_EQ(DescribeStatus(child->Stop(absl::Milliseconds(200))), "killed by SIGKILL");
}

TEST_F(ProcessTest, ABinaryThatCannotBeExecutedIsAnErrorOfSpawn) {
  auto missing = Child::Spawn(Path("no-such-binary"), {});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot execute " + Path("no-such-binary")));
  {
    std::ofstream(Path("not-executable")) << "#!/bin/sh\n";
  }
  auto denied = Child::Spawn(Path("not-executable"), {});
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(ProcessTest, OutputGoesToTheFilesAndABadPathIsAnErrorOfSpawn) {
  auto child = Child::Spawn("/bin/sh", {"-c", "echo out; echo err >&2"},
                            {.stdout_file = Path("both.log"), .stderr_file = Path("both.log")});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_EQ(DescribeStatus(*child->Wait()), "exited 0");
  EXPECT_EQ(ReadAll(Path("both.log")), "out\nerr\n");
  auto bad = Child::Spawn("/bin/true", {}, {.stdout_file = Path("no-such-dir/out.log")});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("cannot open " + Path("no-such-dir/out.log")));
}

TEST_F(ProcessTest, InputComesFromTheFileAndAMissingOneIsAnErrorOfSpawn) {
  std::ofstream(Path("in.txt")) << "line one\nline two\n";
  auto child = Child::Spawn("/bin/sh", {"-c", "wc -l"},
                            {.stdout_file = Path("count.log"), .stdin_file = Path("in.txt")});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_EQ(DescribeStatus(*child->Wait()), "exited 0");
  EXPECT_EQ(ReadAll(Path("count.log")), "2\n");
  auto missing = Child::Spawn("/bin/cat", {}, {.stdin_file = Path("no-such-input")});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot open " + Path("no-such-input")));
}

TEST_F(ProcessTest, TheEnvironmentIsTheParentsWithReplacements) {
  setenv("PROCESS_TEST_KEPT", "kept", 1);
  setenv("PROCESS_TEST_REPLACED", "old", 1);
  auto child = Child::Spawn(
      "/bin/sh", {"-c", "echo $PROCESS_TEST_KEPT $PROCESS_TEST_REPLACED $PROCESS_TEST_ADDED"},
      {.stdout_file = Path("env.log"),
       .environment = {"PROCESS_TEST_REPLACED=new", "PROCESS_TEST_ADDED=added"}});
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_EQ(DescribeStatus(*child->Wait()), "exited 0");
  EXPECT_EQ(ReadAll(Path("env.log")), "kept new added\n");
}

TEST_F(ProcessTest, TheChildStartsWithDefaultSigpipeAndNoBlockedSignals) {
  signal(SIGPIPE, SIG_IGN);
  sigset_t blocked, old;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &blocked, &old);
  auto child = Child::Spawn("/bin/sh", {"-c", "grep -E '^(SigBlk|SigIgn)' /proc/self/status"},
                            {.stdout_file = Path("signals.log")});
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  signal(SIGPIPE, SIG_DFL);
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_EQ(DescribeStatus(*child->Wait()), "exited 0");
  const std::string signals = ReadAll(Path("signals.log"));
  EXPECT_THAT(signals, HasSubstr("SigBlk:\t0000000000000000"));
  // SIGPIPE is signal 13: bit 12 of the ignored set (0x1000) must be clear.
  const size_t ign = signals.find("SigIgn:\t");
  ASSERT_NE(ign, std::string::npos) << signals;
  const uint64_t ignored = std::stoull(signals.substr(ign + 8, 16), nullptr, 16);
  EXPECT_EQ(ignored & 0x1000u, 0u) << signals;
}

// A runner that dies (killed, crashed) takes its children with it: PR_SET_PDEATHSIG.
TEST_F(ProcessTest, AChildDiesWithTheProcessThatSpawnedIt) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t runner = fork();
  ASSERT_GE(runner, 0);
  if (runner == 0) {
    auto child = Child::Spawn("/bin/sleep", {"60"});
    const pid_t pid = child.ok() ? child->Detach() : -1;
    [[maybe_unused]] ssize_t n = write(pipe_fds[1], &pid, sizeof(pid));
    pause();  // until killed
    _exit(0);
  }
  close(pipe_fds[1]);
  pid_t grandchild = -1;
  ASSERT_EQ(read(pipe_fds[0], &grandchild, sizeof(grandchild)), static_cast<ssize_t>(sizeof(grandchild)));
  close(pipe_fds[0]);
  ASSERT_GT(grandchild, 0);
  kill(runner, SIGKILL);
  waitpid(runner, nullptr, 0);
  // The sleeper is gone (reaped by whoever adopted it) or a zombie waiting to be.
  bool gone = false;
  for (int i = 0; i < 30000 && !gone; ++i) {
    const std::string stat = ReadAll(absl::StrCat("/proc/", grandchild, "/stat"));
    const size_t paren = stat.rfind(')');
    gone = stat.empty() || (paren != std::string::npos && stat[paren + 2] == 'Z');
    if (!gone) usleep(1000);
  }
  EXPECT_TRUE(gone) << "pid " << grandchild << " outlived the process that spawned it";
  if (!gone) kill(grandchild, SIGKILL);
}

TEST_F(ProcessTest, AwaitPortFileReadsThePortOrNamesTheChildsExit) {
  auto writer = Child::Spawn("/bin/sh", {"-c", "sleep 0.1; echo 4242 > " + Path("port.tmp") +
                                                   " && mv " + Path("port.tmp") + " " + Path("port") +
                                                   "; exec sleep 60"});
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto port = AwaitPortFile(Path("port"), *writer, absl::Seconds(60));
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(*port, 4242);
  auto dies = Child::Spawn("/bin/sh", {"-c", "exit 7"});
  ASSERT_TRUE(dies.ok());
  auto none = AwaitPortFile(Path("never"), *dies, absl::Hours(1));
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("exited 7 before writing " + Path("never")));
}

// A one-shot command: success is exit 0; anything else, or a command that does not end, is an
// error naming it and where its output went, never a hang.
TEST_F(ProcessTest, RunToSuccessNamesTheCommandAndHowItEnded) {
  EXPECT_TRUE(RunToSuccess("/bin/sh", {"-c", "exit 0"}).ok());
  const absl::Status failed =
      RunToSuccess("/bin/sh", {"-c", "echo no >&2; exit 3"}, {.stderr_file = Path("err.log")});
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failed.message(), HasSubstr("/bin/sh -c echo no >&2; exit 3 exited 3"));
  EXPECT_THAT(failed.message(), HasSubstr("see " + Path("err.log")));
  const absl::Status hung = RunToSuccess("/bin/sleep", {"60"}, {}, absl::Milliseconds(200));
  EXPECT_THAT(hung.message(), HasSubstr("/bin/sleep 60 did not end within 200ms"));
  EXPECT_EQ(RunToSuccess(Path("no-such-binary"), {}).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace fencelock::process
