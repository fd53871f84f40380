// How a run ends, for the scheduler that launched it (docs/faults.md, "Exit codes"): 0 done
// or stopped by a signal, 2 bad input (never retry), 3 infrastructure (a timeout, a dead
// rank: retry), 4 the run diverged (retrying repeats it). Each failure but bad input has
// its error type here; bad input is kernels/base/error.h's UsageError, which the kernels
// raise too (no GPU, out of its memory).
#pragma once

#include <stdexcept>

#include "kernels/base/error.h"

namespace trident {

inline constexpr int kExitUsage = 2;
inline constexpr int kExitInfrastructure = 3;
inline constexpr int kExitDiverged = 4;

// A failure of the machinery under the run, not of its input or of trident: an MPI or
// NCCL call that failed (a dead peer, a network error). Exit 3: a retry may succeed.
class InfrastructureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The run diverged (train/divergence.h): raised by every rank together, exit 4.
class DivergedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace trident
