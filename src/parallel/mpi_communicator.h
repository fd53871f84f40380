// The MPI backend of the communicator layer: non-blocking MPI operations on host
// memory, waited on by polling so that every wait can be bounded.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>

#include "parallel/communicator.h"
#include "runtime/exit_codes.h"

namespace trident {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor unless it is MPI_COMM_WORLD or
  // MPI_COMM_SELF).
  MpiCommunicator(MPI_Comm comm, std::string name, std::shared_ptr<Watchdog> watchdog);
  ~MpiCommunicator() override;

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<int> world_ranks() const override;
  MPI_Comm comm() const { return comm_; }

  RequestPtr all_reduce_async(std::span<float> data, ReduceOp op) override;
  RequestPtr all_reduce_async(std::span<double> data, ReduceOp op) override;
  RequestPtr reduce_scatter_async(std::span<const float> in, std::span<float> out) override;
  RequestPtr all_gather_async(std::span<float> data) override;
  RequestPtr send_async(std::span<const float> data, int peer, int tag) override;
  RequestPtr recv_async(std::span<float> data, int peer, int tag) override;
  // Host activations are float (the CPU backend stores bf16-emulated values in floats).
  RequestPtr all_reduce_async(ActivationSpan data, ReduceOp op) override;
  RequestPtr reduce_scatter_async(ActivationSpan in, ActivationSpan out) override;
  RequestPtr all_gather_async(ActivationSpan data) override;
  RequestPtr send_async(ActivationSpan data, int peer, int tag) override;
  RequestPtr recv_async(ActivationSpan data, int peer, int tag) override;
  RequestPtr all_to_all_v_async(ActivationSpan send, const std::vector<size_t>& send_counts, ActivationSpan recv,
                                const std::vector<size_t>& recv_counts) override;
  void broadcast(std::span<float> data, int root) override;
  void barrier() override;
  RequestPtr send_async(std::span<const std::byte> data, int peer, int tag) override;
  RequestPtr recv_async(std::span<std::byte> data, int peer, int tag) override;
  void broadcast(std::span<std::byte> data, int root) override;

 private:
  RequestPtr started(MPI_Request request, CommOp op, size_t count, int peer = -1);
  uint64_t last_started_ = 0;  // count_started()'s number for the request started() wraps next
  RequestPtr start_all_reduce(void* data, size_t count, size_t bytes, MPI_Datatype type, ReduceOp op);

  MPI_Comm comm_;
  std::string name_;
  std::shared_ptr<Watchdog> watchdog_;
  int rank_ = 0, size_ = 1;
};

// Exit code of a job aborted by the watchdog.
inline constexpr int kExitTimeout = kExitInfrastructure;

// The wait of every backend: polls `done` (which makes progress) until it returns true.
// Past the watchdog's bound it names the operation, the group, this rank and the step on
// stderr, calls `before_abort` (NCCL aborts its communicators there), and aborts the job
// with kExitTimeout.
// seq: the operation's number among the group's collectives (0: point-to-point); with it
// the message also says which members on this machine had not started it (their numbers
// on the machine's progress board) and which members it cannot see (other machines).
// peer: a send's or receive's other side (group rank), named in the message.
void wait_bounded(const std::function<bool()>& done, const char* backend, CommOp op, size_t count,
                  const Communicator& group, const Watchdog& watchdog, const std::function<void()>& before_abort = {},
                  uint64_t seq = 0, int peer = -1);
// The members of `group` on this machine that had not started its collective number
// `seq`, or that started it and then went silent for `silent_s` (no wait of theirs polled:
// stopped), from the progress board, for a timeout's message and health verdict.
struct MissingMembers {
  std::vector<int> here;  // their world ranks, but live ones waiting in another operation themselves
  std::string nodes;      // their nodes, comma-separated
  int last_step = -1;     // the latest step any of them was at (-1: none had started)
  std::string report;     // the message's second line
};
MissingMembers missing_members(const Communicator& group, CommOp op, uint64_t seq, int world_rank, double silent_s);
// A send's or receive's other side (`peer`, a group rank) when it is on this machine and
// has been silent for `silent_s` (stopped), for the same message and verdict.
MissingMembers stopped_peer(const Communicator& group, CommOp op, int peer, int world_rank, double silent_s);

}  // namespace trident
