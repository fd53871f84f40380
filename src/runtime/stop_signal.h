// SIGTERM and SIGUSR1, what Slurm sends before a time limit or a preemption. They are
// blocked in every thread (compute threads, OpenMP's, MPI's, oneDNN's JIT code are
// never interrupted: an asynchronous handler there corrupted oneDNN's heap, 3 runs in
// 12) and received by one thread of their own with sigwait. During training they ask
// for a graceful stop (finish the step, checkpoint, exit 0); otherwise they end the
// process as they normally would.
#pragma once

namespace trident {

// Call first in main, before any other thread exists, so that all threads inherit the mask.
void start_stop_signal_thread();
// From now on a stop signal is a request that training polls (stop_signal_received()).
void enable_graceful_stop();
bool stop_signal_received();

}  // namespace trident
