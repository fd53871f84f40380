// The communication interface of trident: the collectives and point-to-point
// operations on typed views (element counts, never bytes), one communicator per group
// of the rank grid. Backends: MPI on host memory (mpi_communicator.cpp); NCCL on device
// memory (nccl_communicator.cpp). Every wait is bounded by the watchdog's timeout: a
// rank stuck past it names the operation, the group, its rank and the step, and aborts
// the whole job instead of hanging.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "monitor/step_trace.h"
#include "parallel/mesh_axes.h"
#include "parallel/progress_board.h"

namespace trident {

// A buffer of activations in the kernel backend's storage type (float, or bf16 under
// mixed precision on CUDA): what tensor- and pipeline-parallel layers exchange.
struct ActivationSpan {
  kernels::Act* data;
  size_t count;  // elements
  kernels::DType type;
  size_t bytes() const { return count * kernels::dtype_bytes(type); }
};

enum class ReduceOp { sum, max };

// What a wait needs to know to report a stuck rank: the bound and the current step
// (set by the training loop; -1 outside of it).
struct Watchdog {
  double timeout_s = 600;
  int step = -1;
};

// A started non-blocking operation. wait() is bounded by the watchdog; the destructor
// of an unfinished request waits for it.
class Request {
 public:
  virtual ~Request() = default;
  virtual bool test() = 0;  // makes progress; true once complete
  virtual void wait() = 0;
};
using RequestPtr = std::unique_ptr<Request>;

// Waits for `request`, if one is in flight, and clears it.
inline void finish(RequestPtr& request) {
  if (request) request->wait();
  request.reset();
}

// Several operations in flight as one: complete when every one is.
class AllOf final : public Request {
 public:
  explicit AllOf(std::vector<RequestPtr> parts) : parts_(std::move(parts)) {}
  bool test() override {
    bool done = true;
    for (RequestPtr& p : parts_) done = p->test() && done;
    return done;
  }
  void wait() override {
    for (RequestPtr& p : parts_) p->wait();
  }

 private:
  std::vector<RequestPtr> parts_;
};

// Operation counts and payload bytes (the size of the buffer each call reduces,
// gathers or sends), per kind, as counted by this rank.
// connect: NCCL's set-up of a communicator and of its connections to the peers.
// all_to_all: each rank's blocks to every rank (a mixture of experts' token exchange).
enum class CommOp { all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier, connect, all_to_all };
inline constexpr int kCommOps = 9;
const char* comm_op_name(CommOp op);

struct CommStats {
  std::array<uint64_t, kCommOps> calls{}, bytes{};
  void add(CommOp op, uint64_t payload_bytes) {
    calls[static_cast<int>(op)]++;
    bytes[static_cast<int>(op)] += payload_bytes;
  }
  uint64_t total_bytes() const;
};

class Communicator {
 public:
  static constexpr int kGatherLengthTag = 2, kGatherTextTag = 3;  // gather_strings' messages
  virtual ~Communicator() = default;
  virtual const std::string& name() const = 0;  // "world", "dp", "tp", "pp", "node"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data = op over all ranks of data (in place)
  virtual RequestPtr all_reduce_async(std::span<float> data, ReduceOp op = ReduceOp::sum) = 0;
  virtual RequestPtr all_reduce_async(std::span<double> data, ReduceOp op = ReduceOp::sum) = 0;
  // out = block `rank()` of the sum of every rank's `in`; in.size() == size() * out.size()
  virtual RequestPtr reduce_scatter_async(std::span<const float> in, std::span<float> out) = 0;
  // data holds size() equal blocks; block rank() is this rank's input, the others are
  // filled with the other ranks' blocks (in place, as after a reduce-scatter)
  virtual RequestPtr all_gather_async(std::span<float> data) = 0;
  virtual RequestPtr send_async(std::span<const float> data, int peer, int tag) = 0;
  virtual RequestPtr recv_async(std::span<float> data, int peer, int tag) = 0;
  virtual RequestPtr all_reduce_async(ActivationSpan data, ReduceOp op = ReduceOp::sum) = 0;
  // The same two on activations (sequence parallelism): out = this rank's block of the
  // sum of every rank's `in`; `data` filled with every rank's block, in place.
  virtual RequestPtr reduce_scatter_async(ActivationSpan in, ActivationSpan out) = 0;
  virtual RequestPtr all_gather_async(ActivationSpan data) = 0;
  virtual RequestPtr send_async(ActivationSpan data, int peer, int tag) = 0;
  virtual RequestPtr recv_async(ActivationSpan data, int peer, int tag) = 0;
  // One hop of a ring: `send` to rank `to` and `recv` from rank `from`, as one request.
  // Here both started apart (MPI: an Isend and an Irecv); NCCL issues them in one group,
  // since apart on one stream the receive would finish before the send starts, and every
  // rank's hop would wait for the one before (context_parallel.cpp's ring).
  virtual RequestPtr send_recv_async(ActivationSpan send, int to, ActivationSpan recv, int from, int tag) {
    std::vector<RequestPtr> both;
    both.push_back(recv_async(recv, from, tag));
    both.push_back(send_async(send, to, tag));
    return std::make_unique<AllOf>(std::move(both));
  }
  // Every rank sends block p of `send` (send_counts[p] elements, the blocks one after the
  // other in rank order) to rank p, and receives rank p's block for it into block p of
  // `recv` (recv_counts[p] elements): the tokens of a mixture of experts going to the
  // ranks that hold their experts, and back. A block may be empty.
  virtual RequestPtr all_to_all_v_async(ActivationSpan send, const std::vector<size_t>& send_counts,
                                        ActivationSpan recv, const std::vector<size_t>& recv_counts) = 0;
  virtual void broadcast(std::span<float> data, int root) = 0;
  virtual void barrier() = 0;
  // Bytes in host memory, on every backend (the runtime's own messages: checkpoint
  // pieces, reports), each under 2 GiB.
  virtual RequestPtr send_async(std::span<const std::byte> data, int peer, int tag) = 0;
  virtual RequestPtr recv_async(std::span<std::byte> data, int peer, int tag) = 0;
  virtual void broadcast(std::span<std::byte> data, int root) = 0;

  // Blocking forms: start, then wait (bounded).
  void all_reduce(std::span<float> data, ReduceOp op = ReduceOp::sum) { all_reduce_async(data, op)->wait(); }
  void all_reduce(std::span<double> data, ReduceOp op = ReduceOp::sum) { all_reduce_async(data, op)->wait(); }
  double all_reduce(double value, ReduceOp op = ReduceOp::sum) {
    all_reduce(std::span<double>(&value, 1), op);
    return value;
  }
  void reduce_scatter(std::span<const float> in, std::span<float> out) { reduce_scatter_async(in, out)->wait(); }
  void all_gather(std::span<float> data) { all_gather_async(data)->wait(); }
  void send(std::span<const float> data, int peer, int tag = 0) { send_async(data, peer, tag)->wait(); }
  void recv(std::span<float> data, int peer, int tag = 0) { recv_async(data, peer, tag)->wait(); }
  void all_reduce(ActivationSpan data, ReduceOp op = ReduceOp::sum) { all_reduce_async(data, op)->wait(); }
  void reduce_scatter(ActivationSpan in, ActivationSpan out) { reduce_scatter_async(in, out)->wait(); }
  void all_gather(ActivationSpan data) { all_gather_async(data)->wait(); }
  void send(ActivationSpan data, int peer, int tag = 0) { send_async(data, peer, tag)->wait(); }
  void recv(ActivationSpan data, int peer, int tag = 0) { recv_async(data, peer, tag)->wait(); }
  void all_to_all_v(ActivationSpan send, const std::vector<size_t>& send_counts, ActivationSpan recv,
                    const std::vector<size_t>& recv_counts) {
    all_to_all_v_async(send, send_counts, recv, recv_counts)->wait();
  }
  void send(std::span<const std::byte> data, int peer, int tag = 0) { send_async(data, peer, tag)->wait(); }
  void recv(std::span<std::byte> data, int peer, int tag = 0) { recv_async(data, peer, tag)->wait(); }
  // Every rank's `text` on rank 0, in rank order (empty elsewhere): reports, host names.
  std::vector<std::string> gather_strings(const std::string& text) {
    std::vector<std::string> all;
    if (rank() != 0) {
      const uint64_t length = text.size();
      send(std::as_bytes(std::span(&length, 1)), 0, kGatherLengthTag);
      send(std::as_bytes(std::span(text.data(), length)), 0, kGatherTextTag);
      return all;
    }
    all.resize(size());
    all[0] = text;
    for (int r = 1; r < size(); r++) {
      uint64_t length = 0;
      recv(std::as_writable_bytes(std::span(&length, 1)), r, kGatherLengthTag);
      all[r].resize(length);
      recv(std::as_writable_bytes(std::span(all[r].data(), length)), r, kGatherTextTag);
    }
    return all;
  }

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  // The members' ranks in MPI_COMM_WORLD, in group rank order (for the timeout's report).
  virtual std::vector<int> world_ranks() const = 0;
  // Where this communicator's collective numbers go on the progress board: its name, or
  // more where two communicators of a rank share one (NCCL's over its MPI group).
  virtual std::string board_key() const { return name(); }

 protected:
  // Counts an operation this rank starts; a collective also gets its number on this group,
  // put on the machine's progress board (parallel/progress_board.h) with the step.
  // Returns that number (0 for point-to-point: those are not matched by order).
  uint64_t count_started(CommOp op, uint64_t payload_bytes, int step) {
    stats_.add(op, payload_bytes);
    if (trace::on())
      trace::instant(std::string(comm_op_name(op)) + " " + name() + " starts", "communication",
                     "{\"bytes\":" + std::to_string(payload_bytes) + ",\"group\":\"" + name() + "\"}");
    if (op == CommOp::send || op == CommOp::recv) return 0;
    progress_board::record(board_key(), ++collectives_started_, step);
    return collectives_started_;
  }

  CommStats stats_;

 private:
  uint64_t collectives_started_ = 0;
};

// The communicator of the ranks an axis set spans (ParallelState::group, or a test's own).
using GroupOf = std::function<Communicator&(AxisSet)>;

}  // namespace trident
