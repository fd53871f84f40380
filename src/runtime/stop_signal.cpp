#include "runtime/stop_signal.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <thread>

namespace trident {

namespace {

std::atomic<bool> graceful{false};
std::atomic<bool> received{false};

}  // namespace

void start_stop_signal_thread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int signal = 0;
    while (sigwait(&set, &signal) == 0) {
      if (!graceful) std::_Exit(128 + signal);  // as the default action would end us
      received = true;
    }
  }).detach();
}

void enable_graceful_stop() { graceful = true; }

bool stop_signal_received() { return received; }

}  // namespace trident
