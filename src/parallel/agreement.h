// Bad input seen by some ranks must end every rank the same way (exit 2, one message),
// not leave the others waiting in a collective.
#pragma once

#include <functional>
#include <string>

#include "runtime/exit_codes.h"

namespace trident {

// A UsageError that every rank raised together (so rank 0 alone prints it).
class AgreedUsageError : public UsageError {
 public:
  using UsageError::UsageError;
};

// An infrastructure failure every rank saw together (exit 3; rank 0 alone says it).
class AgreedInfrastructureError : public InfrastructureError {
 public:
  using InfrastructureError::InfrastructureError;
};

// Runs `step` on every rank of MPI_COMM_WORLD. If it throws UsageError on any rank,
// every rank throws AgreedUsageError with the message of the lowest such rank. An
// InfrastructureError is not agreed (it may come from a collective that timed out, whose
// peers would never reach the agreement): it ends the job through MPI_Abort, exit 3.
void run_collectively(const std::function<void()>& step);

// Rank 0's `text` on every rank.
std::string broadcast_string(const std::string& text);

}  // namespace trident
