// Data parallelism over the flat gradient buffer. The buffer is cut into buckets of
// about `bucket_mb` from its end (backward finishes the last layers first); a bucket's
// reduction starts, non-blocking, as soon as backward reports that every gradient in it
// is final, so communication overlaps the rest of the backward pass.
//
// Without ZeRO each bucket is all-reduced (summed: the loss scale already divides by the
// global batch). With ZeRO-1 each bucket is reduce-scattered: rank r owns block r of
// every bucket, updates only those parameters (its optimizer state is 1/dp of the
// model's), and the updated blocks are all-gathered into every rank's parameters.
//
// ZeRO-2 also shards the gradients (DeepSpeed's stage 2, FSDP's SHARD_GRAD_OP): the
// buckets are the layout's units (model/parameters.h: embeddings, each block, head),
// and the store keeps a block's gradients only in one of two windows (parallel/param_grad_store.h).
// After each micro-batch's backward of a block, its window is reduce-scattered into
// this rank's shard (added to what earlier micro-batches left there); the embeddings'
// and head's gradients accumulate where they are and are reduce-scattered once, at the
// end. No full-size gradient exists, and accumulation stays exact.
//
// ZeRO-3 (FSDP's FULL_SHARD) reduces the gradients as ZeRO-2 does; the parameters are
// sharded the same way, by the store, which gathers each unit before the model uses it
// (parallel/param_grad_store.h). The optimizer then updates this rank's shard only and nothing is
// gathered after the step. Ends the store keeps in the windows are reduced as the blocks
// are (a tied table twice per micro-batch: after the head and after the embedding).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "parallel/communicator.h"
#include "kernels/kernels.h"
#include "runtime/flat_range.h"

namespace trident {

// Hybrid sharding (FSDP's HYBRID_SHARD, MiCS): with `replica` given, the communicator
// passed as dp is a shard group (parallel.shard_size consecutive dp ranks, one node) and
// the states are sharded within it and replicated across the groups: each bucket is
// reduce-scattered within the group, then its block all-reduced over `replica` (the
// ranks holding the same block in the other groups); parameters are gathered within the
// group only.

// A region of the buffer whose gradients are summed over other ranks than dp's (the
// layout's data regions, model/parameters.h: tensors sharded over ep, over the ranks
// holding each), and ZeRO shards them over those; buckets never straddle a region's edge.
struct GradientRegion {
  std::vector<FlatRange> ranges;
  Communicator* group = nullptr;
};

// Gradient-bucket reductions in flight at once on the CPU backend (MPI): each holds a
// temporary of its size in Open MPI (DataParallel::set_max_in_flight).
constexpr size_t kMpiReductionsInFlight = 2;
// ZeRO-2/3's windowed units on the CPU backend: one reduction in flight, the last one
// overlapping the next unit's backward. Each takes Open MPI temporaries of twice its window
// (a reduce-scatter over more than 2 ranks), and the process keeps freed memory in its heap
// (kernels/base/memory.h): two at once, of slightly different sizes (an embedding's
// window and a block's), left holes the next could not reuse and grew the heap by a
// window's reduction now and then (issue 43: 752-801 MiB for 744 planned).
constexpr size_t kMpiWindowReductionsInFlight = 1;
// A blocking sum of one large tensor (a tied embedding's between the pipeline's ends) runs
// in pieces of at most this many floats: Open MPI's temporary is one piece, not the tensor
// (GPT-2 124M's 147 MiB table took 82 MiB more than planned at pp 2 before).
constexpr size_t kReductionPieceFloats = size_t{4} << 20;

// ZeRO-2's view of the model's gradients.
struct GradientUnits {
  std::vector<FlatRange> units;             // the layout's units, in order
  std::vector<bool> windowed;               // per unit: a block, kept in a window
  std::function<float*(size_t)> locate;     // where the gradient of a flat offset lives
  // More than one micro-batch per step: the later micro-batches' sums of a window go
  // through a temporary per window, allocated with the rest (not mid-backward).
  bool accumulates = false;
  // The unit reduced twice per micro-batch (a tied table in the windows), or -1: its
  // second sum goes through a temporary too (one, unless accumulates gives one per window).
  int reduced_twice = -1;
};

class DataParallel {
 public:
  // memory: the kernel backend whose memory holds the gradients (ZeRO's shard goes
  // there too). n: floats in the gradient buffer, a multiple of dp's size. overlap =
  // false starts every bucket only when backward is complete (for measuring what
  // overlap buys).
  DataParallel(Communicator& dp, kernels::Kernels& memory, size_t n, double bucket_mb, bool zero, bool overlap = true,
               Communicator* replica = nullptr, std::vector<GradientRegion> regions = {});
  // ZeRO-2 over the units of a layout of n floats (each unit a multiple of dp); stage 3
  // reduces the gradients the same way (the model shards and gathers its parameters).
  DataParallel(Communicator& dp, kernels::Kernels& memory, size_t n, GradientUnits units,
               Communicator* replica = nullptr, int stage = 2, std::vector<GradientRegion> regions = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The buckets of a buffer of n floats (a multiple of ranks), and the block of each
  // that ZeRO's rank `rank` owns: what the constructor uses, for memory plans.
  static std::vector<FlatRange> bucket_ranges(size_t n, double bucket_mb, size_t ranks);
  static std::vector<FlatRange> sharded_ranges(const std::vector<FlatRange>& buckets, size_t ranks, size_t rank);

  // 0 to 3 (0 with one rank: nothing to shard).
  int zero_stage() const { return stage_; }
  // ZeRO at any stage: each rank updates (and keeps optimizer state for) its shard only.
  bool shards_optimizer_state() const { return stage_ > 0; }
  // The ranks the states are sharded over (dp, or the shard group when hybrid): what a
  // sum over this rank's owned ranges must be reduced over to cover the model once.
  Communicator& shard_group() const { return dp_; }
  const std::vector<FlatRange>& buckets() const { return buckets_; }
  // The ranges whose reduced gradients this rank holds after finish_gradients() and
  // whose parameters it updates: everything, or with ZeRO its block of each bucket.
  const std::vector<FlatRange>& owned() const { return owned_; }
  // After finish_gradients(): the reduced gradient of a flat offset in owned().
  float* gradient_at(size_t offset) const;

  // Call before the backward passes of a step (grads: ParamGradStore::grads(), the model's).
  void start_backward(float* grads);
  // ZeRO-2/3: the windowed unit starting at `offset` is about to get gradients: its window
  // must be free (its last reduction done) and zeroed. Nothing for a kept unit.
  void unit_begins(size_t offset);
  // Backward's report: gradients at [offset, n) are final (ZeRO-2/3: the windowed unit at
  // `offset` is complete for this micro-batch).
  void gradients_final_from(size_t offset);
  // At most `n` bucket reductions in flight (0: no bound): the oldest is waited for
  // before another starts. For MPI: Open MPI's non-blocking collectives take a temporary
  // the size of their message, so an unbounded backward held one for every bucket at once.
  void set_max_in_flight(size_t n) { max_in_flight_ = n; }
  size_t max_in_flight() const { return max_in_flight_; }
  // ZeRO-2/3: at most `n` windowed units' reductions in flight (0: one per window); the
  // oldest is finished before another starts.
  void set_max_window_reductions(size_t n) { max_window_reductions_ = n; }
  // Whether gradients_final_from() wants every micro-batch's reports, not only the last's.
  bool reduces_every_micro_batch() const { return stage_ >= 2; }
  // Starts what is left, waits for everything; returns the seconds spent waiting.
  double finish_gradients();
  // ZeRO: brings every rank's updated blocks into all ranks' parameters.
  void gather_parameters(float* params);
  // The same on a buffer of the layout in host memory (the checkpoint's moments), one
  // bucket at a time (a NCCL communicator stages one host buffer at a time).
  void gather_host_buffer(float* host);
  // The full reduced gradients, in host memory, on every rank (only `verify` needs them).
  std::vector<float> gathered_gradients();

 private:
  // A block unit's reduction in flight: from its window, into the shard (through a
  // temporary when an earlier micro-batch's sum is there already).
  struct BlockReduction {
    const float* window = nullptr;
    RequestPtr request;
    float* temporary = nullptr;  // null: the shard received the sum directly
    float* shard = nullptr;
    size_t floats = 0;
    uint64_t started = 0;  // the order the reductions started in
  };
  class ReplicaChain;
  // ZeRO: owned_ = this rank's block of every bucket, and the shard that holds them.
  void shard_buckets();
  // The ranks that sum bucket b's gradients: dp, or its region's group.
  Communicator& group_of(size_t b) const { return bucket_group_.empty() ? dp_ : *bucket_group_[b]; }
  void start_bucket(size_t b);
  // A sum of `in` over dp into this rank's block `out`: reduce-scatter over the shard
  // group, then (hybrid) all-reduce of the block over the replicas.
  RequestPtr reduce_to_shard(Communicator& group, std::span<const float> in, std::span<float> out);
  void admit(RequestPtr request);  // into pending_, within max_in_flight_
  size_t unit_at(size_t offset) const;  // ZeRO-2/3: the index of the unit holding `offset`
  // The buckets cut where the regions begin and end, and each bucket's group
  // (bucket_group_), its region's or dp's.
  void assign_groups(const std::vector<GradientRegion>& regions);
  // ZeRO-2/3: unit u's floats in the shard (its pieces' blocks), and its reduction from
  // `from` (the unit's gradients) into `to` (where its shard begins, or a temporary).
  size_t unit_shard_floats(size_t u) const;
  RequestPtr reduce_unit(size_t u, const float* from, float* to);
  void finish(BlockReduction& r);

  Communicator& dp_;
  Communicator* replica_ = nullptr;
  std::deque<ReplicaChain*> replica_order_;  // hybrid: chains whose all-reduce has not started, in order
  int stage_ = 0;
  bool overlap_ = true;
  size_t n_ = 0;
  std::vector<FlatRange> buckets_, owned_;
  std::vector<Communicator*> bucket_group_;  // with regions: per bucket (empty: dp for all)
  kernels::Kernels& memory_;
  float* shard_ = nullptr;  // ZeRO: the block of each bucket, in order
  std::vector<size_t> shard_offset_;
  float* grads_ = nullptr;
  size_t next_bucket_ = 0;  // buckets are started from the last one down
  std::vector<RequestPtr> pending_;
  size_t max_in_flight_ = 0;
  double admission_wait_s_ = 0;  // waited in admit() this step
  // ZeRO-2: the buckets are the units' pieces (split where the regions begin and end);
  // unit u's are buckets_[unit_pieces_[u] .. unit_pieces_[u + 1]).
  GradientUnits units_;
  std::vector<size_t> unit_pieces_;
  std::vector<int> reductions_;              // per unit, this step
  std::vector<bool> armed_;                  // per unit: gradients written since its last reduction
  std::vector<BlockReduction> in_flight_;    // at most one per window
  size_t max_window_reductions_ = 0;
  uint64_t reductions_started_ = 0;
  // Per window; or one for any window (key null) when only a twice-reduced unit needs one.
  std::vector<std::pair<const float*, float*>> temporaries_;
  float* temporary_for(const float* window, size_t u);  // free for unit u's sum from `window`
  void finish_oldest_window_reductions(size_t keep);     // all but the `keep` latest
  size_t window_shard_floats_ = 0;                            // a temporary's size
};

}  // namespace trident
