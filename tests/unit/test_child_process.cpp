// The tests' own background runs (child_process.h): a line waited for is seen as it comes,
// a run that ends without it or outlives a deadline fails with a message naming what was
// waited for, exit codes read as a shell reads them, and nothing of a run outlives it.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>
#include <string>

#include "child_process.h"

namespace trident {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(ChildProcess, WaitsForALineThenForTheExit) {
  // The line comes first; the run goes on until it reads its stdin's end (/dev/null: at once) and exits 3.
  ChildProcess child("sh -c 'echo first; echo to stderr >&2; cat; exit 3'");
  ASSERT_TRUE(child.wait_for_output("first\n", 30));
  ASSERT_TRUE(child.wait_for_exit(30));
  EXPECT_TRUE(child.ended());
  EXPECT_EQ(child.exit_code(), 3);
  EXPECT_EQ(child.output(), "first\nto stderr\n");
}

TEST(ChildProcess, ARunThatEndsWithoutTheLineFailsAtOnceWithItsOutput) {
  const auto start = std::chrono::steady_clock::now();
  ChildProcess child("sh -c 'echo something else; exit 5'");
  const testing::AssertionResult r = child.wait_for_output("never printed", 60);
  EXPECT_FALSE(r);
  EXPECT_LT(seconds_since(start), 30.0) << "waited for the deadline, not for the end";
  EXPECT_NE(std::string(r.message()).find("ended (exit 5) without printing \"never printed\""), std::string::npos)
      << r.message();
  EXPECT_NE(std::string(r.message()).find("something else"), std::string::npos) << r.message();
}

TEST(ChildProcess, DeadlinesFailWithWhatWasWaitedFor) {
  ChildProcess child("sh -c 'echo started; exec sleep 600'");
  ASSERT_TRUE(child.wait_for_output("started", 30));
  const testing::AssertionResult line = child.wait_for_output("done", 0.2);
  EXPECT_FALSE(line);
  EXPECT_NE(std::string(line.message()).find("printed no \"done\" within 0.2 s (still running)"), std::string::npos)
      << line.message();
  const testing::AssertionResult end = child.wait_for_exit(0.2);
  EXPECT_FALSE(end);
  EXPECT_NE(std::string(end.message()).find("still running after 0.2 s"), std::string::npos) << end.message();
  EXPECT_FALSE(child.ended());
}

TEST(ChildProcess, ASignalledRunExitsWith128PlusTheSignal) {
  ChildProcess child("sh -c 'echo ready; exec sleep 600'");
  ASSERT_TRUE(child.wait_for_output("ready", 30));
  kill(child.pid(), SIGTERM);  // pid() is the command itself (sleep, exec'd), not a shell around it
  ASSERT_TRUE(child.wait_for_exit(30));
  EXPECT_EQ(child.exit_code(), 128 + SIGTERM);
}

// A child of the run (as mpirun's ranks are) ends with it when the test lets go of it.
TEST(ChildProcess, NothingOfARunOutlivesIt) {
  std::optional<ChildProcess> child;
  child.emplace("sh -c 'sleep 600 & echo grandchild $!; wait'");
  ASSERT_TRUE(child->wait_for_output("\n", 30));
  const int grandchild = std::stoi(child->output().substr(child->output().find(' ') + 1));
  // Not our child: its end is seen through a pidfd.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, grandchild, 0));
  if (pidfd < 0 && errno == ENOSYS) GTEST_SKIP() << "no pidfd_open (Linux before 5.3)";
  ASSERT_GE(pidfd, 0) << "pidfd_open: " << std::strerror(errno);
  child.reset();
  pollfd p{pidfd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 30'000), 1) << "the grandchild " << grandchild << " still runs";
  close(pidfd);
}

}  // namespace
}  // namespace trident
