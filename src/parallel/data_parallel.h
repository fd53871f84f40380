// Data parallelism over the flat gradient buffer. The buffer is cut into buckets of
// about `bucket_mb` from its end (backward finishes the last layers first); a bucket's
// reduction starts, non-blocking, as soon as backward reports that every gradient in it
// is final, so communication overlaps the rest of the backward pass.
//
// Without ZeRO each bucket is all-reduced (summed: the loss scale already divides by the
// global batch). With ZeRO-1 each bucket is reduce-scattered: rank r owns block r of
// every bucket, updates only those parameters (its optimizer state is 1/dp of the
// model's), and the updated blocks are all-gathered into every rank's parameters.
#pragma once

#include <cstddef>
#include <vector>

#include "parallel/communicator.h"
#include "kernels/kernels.h"
#include "runtime/flat_range.h"

namespace trident {

class DataParallel {
 public:
  // memory: the kernel backend whose memory holds the gradients (ZeRO's shard goes
  // there too). n: floats in the gradient buffer, a multiple of dp's size. overlap =
  // false starts every bucket only when backward is complete (for measuring what
  // overlap buys).
  DataParallel(Communicator& dp, kernels::Kernels& memory, size_t n, double bucket_mb, bool zero, bool overlap = true);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The buckets of a buffer of n floats (a multiple of ranks), and the block of each
  // that ZeRO's rank `rank` owns: what the constructor uses, for memory plans.
  static std::vector<FlatRange> bucket_ranges(size_t n, double bucket_mb, size_t ranks);
  static std::vector<FlatRange> sharded_ranges(const std::vector<FlatRange>& buckets, size_t ranks, size_t rank);

  bool zero() const { return zero_; }
  const std::vector<FlatRange>& buckets() const { return buckets_; }
  // The ranges whose reduced gradients this rank holds after finish_gradients() and
  // whose parameters it updates: everything, or with ZeRO-1 its block of each bucket.
  const std::vector<FlatRange>& owned() const { return owned_; }

  // Call before the backward pass that completes the step's gradients.
  void start_backward(float* grads);
  // Backward's report: gradients at [offset, n) are final.
  void gradients_final_from(size_t offset);
  // Starts what is left, waits for everything; returns the seconds spent waiting.
  double finish_gradients();
  // ZeRO-1: brings every rank's updated blocks into all ranks' parameters.
  void gather_parameters(float* params);
  // ZeRO-1: the full reduced gradients on every rank (only `verify` needs them).
  void gather_gradients(float* grads);

 private:
  void start_bucket(size_t b);

  Communicator& dp_;
  bool zero_, overlap_;
  std::vector<FlatRange> buckets_, owned_;
  kernels::Kernels& memory_;
  float* shard_ = nullptr;  // ZeRO-1: reduce-scatter output, the block of each bucket in order
  std::vector<size_t> shard_offset_;
  float* grads_ = nullptr;
  size_t next_bucket_ = 0;  // buckets are started from the last one down
  std::vector<RequestPtr> pending_;
};

}  // namespace trident
