#include "parallel/data_parallel.h"

#include <algorithm>

#include "runtime/error.h"
#include "runtime/timer.h"

namespace trident {

std::vector<FlatRange> DataParallel::bucket_ranges(size_t n, double bucket_mb, size_t ranks) {
  // Buckets from the end, each a multiple of dp floats; the first takes the remainder.
  const size_t target = std::max<size_t>(ranks, static_cast<size_t>(bucket_mb * (1 << 20) / sizeof(float)) / ranks * ranks);
  std::vector<FlatRange> buckets;
  for (size_t end = n; end > 0;) {
    const size_t begin = end > target ? end - target : 0;
    buckets.insert(buckets.begin(), {begin, end});
    end = begin;
  }
  return buckets;
}

std::vector<FlatRange> DataParallel::sharded_ranges(const std::vector<FlatRange>& buckets, size_t ranks, size_t rank) {
  std::vector<FlatRange> owned;
  for (const FlatRange& b : buckets) {
    const size_t block = b.size() / ranks;
    owned.push_back({b.begin + rank * block, b.begin + (rank + 1) * block});
  }
  return owned;
}

DataParallel::DataParallel(Communicator& dp, kernels::Kernels& memory, size_t n, double bucket_mb, bool zero,
                           bool overlap)
    : dp_(dp), zero_(zero && dp.size() > 1), overlap_(overlap), memory_(memory) {
  const size_t ranks = dp.size();
  check(n % ranks == 0, "DataParallel: buffer size must be a multiple of dp");
  buckets_ = bucket_ranges(n, bucket_mb, ranks);
  next_bucket_ = buckets_.size();
  if (!zero_) {
    owned_ = {{0, n}};
    return;
  }
  owned_ = sharded_ranges(buckets_, ranks, dp.rank());
  size_t shard_floats = 0;
  for (const FlatRange& r : owned_) {
    shard_offset_.push_back(shard_floats);
    shard_floats += r.size();
  }
  shard_ = static_cast<float*>(memory_.alloc(shard_floats * sizeof(float)));
}

DataParallel::~DataParallel() {
  pending_.clear();  // waits for what is in flight
  if (shard_ != nullptr) memory_.free(shard_);
}

void DataParallel::start_backward(float* grads) {
  grads_ = grads;
  next_bucket_ = buckets_.size();
  pending_.clear();
}

void DataParallel::start_bucket(size_t b) {
  const FlatRange& r = buckets_[b];
  std::span<float> data(grads_ + r.begin, r.size());
  if (dp_.size() == 1) return;
  if (zero_)
    pending_.push_back(dp_.reduce_scatter_async(data, {shard_ + shard_offset_[b], r.size() / dp_.size()}));
  else
    pending_.push_back(dp_.all_reduce_async(data));
}

void DataParallel::gradients_final_from(size_t offset) {
  if (!overlap_ || grads_ == nullptr) return;
  while (next_bucket_ > 0 && buckets_[next_bucket_ - 1].begin >= offset) start_bucket(--next_bucket_);
  for (auto& p : pending_) p->test();  // MPI progresses non-blocking operations only when called
}

double DataParallel::finish_gradients() {
  check(grads_ != nullptr, "finish_gradients() without start_backward()");
  while (next_bucket_ > 0) start_bucket(--next_bucket_);
  Timer waiting;
  for (auto& p : pending_) p->wait();
  const double waited = waiting.seconds();
  pending_.clear();
  if (zero_) {
    for (size_t b = 0; b < buckets_.size(); b++)
      memory_.copy_on_device(grads_ + owned_[b].begin, shard_ + shard_offset_[b], owned_[b].size() * sizeof(float));
  }
  grads_ = nullptr;
  return waited;
}

void DataParallel::gather_parameters(float* params) {
  if (!zero_) return;
  std::vector<RequestPtr> requests;
  for (const FlatRange& b : buckets_) requests.push_back(dp_.all_gather_async({params + b.begin, b.size()}));
  for (auto& r : requests) r->wait();
}

void DataParallel::gather_gradients(float* grads) { gather_parameters(grads); }

}  // namespace trident
