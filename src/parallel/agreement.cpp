#include "parallel/agreement.h"

#include <mpi.h>

#include <string>
#include <vector>

namespace trident {

void run_collectively(const std::function<void()>& step) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string message;
  try {
    step();
  } catch (const UsageError& e) {
    message = e.what();
    if (size == 1) throw AgreedUsageError(message);
  }
  if (size == 1) return;
  // The lowest failing rank speaks for all.
  int failing = message.empty() ? size : rank;
  MPI_Allreduce(MPI_IN_PLACE, &failing, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (failing == size) return;
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, failing, MPI_COMM_WORLD);
  std::vector<char> text(message.begin(), message.end());
  text.resize(length);
  MPI_Bcast(text.data(), length, MPI_CHAR, failing, MPI_COMM_WORLD);
  const std::string prefix = failing == 0 ? "" : "rank " + std::to_string(failing) + ": ";
  throw AgreedUsageError(prefix + std::string(text.begin(), text.end()));
}

std::string broadcast_string(const std::string& text) {
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string out = text;
  out.resize(length);
  MPI_Bcast(out.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return out;
}

}  // namespace trident
