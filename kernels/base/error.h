// kernels/base/ is what the kernels and src/ both build on (errors, exit codes, process
// memory): it includes nothing else of ours, so the kernels need not reach up into src/.
//
// Two kinds of failure, as in LAMMPS: bad input (config, files, layout) is the user's
// to fix and ends the job with one clear message and exit code 2 on every rank; a
// failed check of our own (a library call, an invariant) carries where it happened.
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>

namespace trident {

// Bad input from the user: exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kExitUsage = 2;

// The exit codes a scheduler acts on (docs/faults.md, "Exit codes"): 0 done or stopped by a
// signal, 2 bad input (never retry), 3 infrastructure (a timeout, a dead rank: retry;
// kExitTimeout), 4 the run diverged (retrying repeats it).
inline constexpr int kExitDiverged = 4;

// A failure of the machinery under the run, not of its input or of trident: an MPI or
// NCCL call that failed (a dead peer, a network error). Exit 3: a retry may succeed.
inline constexpr int kExitInfrastructure = 3;
class InfrastructureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The run diverged (train/divergence.h): raised by every rank together, exit 4.
class DivergedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws UsageError(message) unless `ok`.
inline void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

// An internal failure, with the file and line of the check that caught it.
[[noreturn]] void fail(const std::string& what,
                       std::source_location where = std::source_location::current());

inline void check(bool ok, const std::string& what,
                  std::source_location where = std::source_location::current()) {
  if (!ok) fail(what, where);
}

}  // namespace trident
