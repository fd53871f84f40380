// A run that a test starts in the background and then waits on: for a line of its
// output (read through a pipe as it comes) or for its end (waitpid), never for a fixed
// time. Every wait has a deadline and, when it passes, a message saying what was waited
// for and what the run printed. However the test ends, the run does not outlive it.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "cli_helpers.h"

namespace trident {

class ChildProcess {
 public:
  // Starts `command` (a shell command line, e.g. "mpirun -np 2 build/trident train ...")
  // without this test's MPI environment, in a process group of its own (mpirun's ranks
  // included), stdin from /dev/null, stdout and stderr into one pipe. The shell execs
  // the command: pid() is the command's own process, the one to send signals to.
  explicit ChildProcess(const std::string& command) : command_(command) {
    int out[2], done[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      start_error_ = std::strerror(errno);
      return;
    }
    if (pipe2(done, O_CLOEXEC) != 0) {
      start_error_ = std::strerror(errno);
      close(out[0]);
      close(out[1]);
      return;
    }
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&files, out[1], 1);
    posix_spawn_file_actions_adddup2(&files, out[1], 2);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setpgroup(&attributes, 0);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    const std::string script = "exec " + without_mpi_environment() + " " + command;
    const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
    const int spawned = posix_spawn(&pid_, "/bin/sh", &files, &attributes, const_cast<char* const*>(argv), environ);
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attributes);
    close(out[1]);  // the child's copies stay open: the pipe ends when the run and its children are gone
    out_ = out[0];
    if (spawned != 0) {
      start_error_ = std::strerror(spawned);
      pid_ = -1;
      close(done[0]);
      close(done[1]);
      return;
    }
    // waitpid blocks, so it waits in a thread of its own; closing `done` is what poll()
    // below sees when the run ends.
    done_ = done[0];
    waiter_ = std::thread([this, write_end = done[1]] {
      int status = 0;
      pid_t reaped;
      while ((reaped = waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
      }
      status_ = reaped == pid_ ? status : -1;
      close(write_end);
    });
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // SIGKILL to the whole group (mpirun and any rank it left behind), then reaped.
  ~ChildProcess() {
    if (pid_ > 0) kill(-pid_, SIGKILL);
    if (waiter_.joinable()) waiter_.join();
    for (const int fd : {out_, done_})
      if (fd >= 0) close(fd);
  }

  int pid() const { return pid_; }
  const std::string& output() const { return output_; }
  bool ended() const { return ended_; }
  // After the end: the exit code, or 128 + the signal that ended it (as a shell says it).
  int exit_code() const {
    if (!ended_ || status_ < 0) return -1;  // status_ is the waiter's until the end is seen
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }

  // Reads the output until it holds `text`; fails if the run ends first or `seconds` pass.
  testing::AssertionResult wait_for_output(const std::string& text, double seconds) {
    if (!start_error_.empty()) return not_started();
    const Clock::time_point deadline = after(seconds);
    while (output_.find(text) == std::string::npos) {
      if (ended_)
        return failure() << "ended (exit " << exit_code() << ") without printing \"" << text << "\"; its output:\n"
                         << output_;
      if (!read_until(deadline))
        return failure() << "printed no \"" << text << "\" within " << in_seconds(seconds)
                         << " (still running); its output so far:\n" << output_;
    }
    return testing::AssertionSuccess();
  }

  // Waits for the end (reading the output meanwhile); fails if `seconds` pass first.
  testing::AssertionResult wait_for_exit(double seconds) {
    if (!start_error_.empty()) return not_started();
    const Clock::time_point deadline = after(seconds);
    while (!ended_)
      if (!read_until(deadline))
        return failure() << "still running after " << in_seconds(seconds) << "; its output so far:\n" << output_;
    return testing::AssertionSuccess();
  }

  // Lets it run `seconds` (reading its output), or less if it ends first: for a test that
  // acts at a chosen moment of a run, not for waiting on something.
  void run_for(double seconds) {
    const Clock::time_point until = after(seconds);
    while (!ended_ && read_until(until)) {
    }
  }

 private:
  using Clock = std::chrono::steady_clock;

  static std::string in_seconds(double seconds) {  // "0.2 s", not 0.20000000000000001
    char text[32];
    std::snprintf(text, sizeof text, "%g s", seconds);
    return text;
  }

  static Clock::time_point after(double seconds) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  testing::AssertionResult failure() const { return testing::AssertionFailure() << "`" << command_ << "` "; }
  testing::AssertionResult not_started() const { return failure() << "could not be started: " << start_error_; }

  // One wait for whatever comes first: output (read), the end (reaped, and the output
  // that is already in the pipe read), or the deadline (false).
  bool read_until(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd fds[2] = {{out_, POLLIN, 0}, {done_, POLLIN, 0}};  // a closed one is -1: poll skips it
    const int ready = poll(fds, 2, static_cast<int>(std::min<long long>(left, 60'000)) + 1);
    if (ready < 0 && errno != EINTR) {
      ADD_FAILURE() << "poll: " << std::strerror(errno);
      return false;
    }
    if (ready <= 0) return true;  // interrupted, or a minute passed: the caller checks again
    if (fds[0].revents != 0) read_output();
    if (fds[1].revents != 0) {
      waiter_.join();
      close(done_);
      done_ = -1;
      ended_ = true;
      // Whatever it wrote before it ended (its children may hold the pipe open longer).
      for (pollfd p{out_, POLLIN, 0}; out_ >= 0 && poll(&p, 1, 0) > 0;) read_output();
    }
    return true;
  }

  void read_output() {
    char buffer[65536];
    const ssize_t n = read(out_, buffer, sizeof buffer);
    if (n > 0) {
      output_.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {  // the end of the pipe: every writer is gone
      close(out_);
      out_ = -1;
    }
  }

  std::string command_, start_error_, output_;
  pid_t pid_ = -1;
  int out_ = -1, done_ = -1;
  int status_ = -1;
  bool ended_ = false;
  std::thread waiter_;
};

}  // namespace trident
