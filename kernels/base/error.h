// kernels/base/ is what the kernels and src/ both build on (the two kinds of failure a
// kernel can report, process memory): it includes nothing else of ours, so the kernels
// need not reach up into src/. How a run ends (exit codes, the run's other failures):
// src/runtime/exit_codes.h.
//
// Two kinds of failure, as in LAMMPS: bad input (config, files, layout, no GPU) is the
// user's to fix and ends the job with one clear message and exit code 2 on every rank; a
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
