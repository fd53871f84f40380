#include "storage/background_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

namespace trident {

namespace {

using Clock = std::chrono::steady_clock;

// When this thread went to idle priority (it or the thread that started it); epoch: not.
thread_local Clock::time_point idle_since{};
// Threads started by a background thread inherit SCHED_IDLE but not idle_since: they
// count from their first check.
thread_local bool checked = false;

bool at_idle_priority() {
  int policy = 0;
  sched_param param{};
  return pthread_getschedparam(pthread_self(), &policy, &param) == 0 && policy == SCHED_IDLE;
}

}  // namespace

void run_in_background() {
  const sched_param param{};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &param) == 0) {
    idle_since = Clock::now();
    checked = true;
  }
}

void keep_background_moving() {
  if (!checked) {
    checked = true;
    if (at_idle_priority()) idle_since = Clock::now();
  }
  if (idle_since == Clock::time_point{}) return;
  if (std::chrono::duration<double>(Clock::now() - idle_since).count() < kStarvedAfterSeconds) return;
  const sched_param param{};
  pthread_setschedparam(pthread_self(), SCHED_OTHER, &param);
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
  idle_since = Clock::time_point{};
}

}  // namespace trident
