#include "parallel/data_parallel.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <utility>

#include "kernels/base/error.h"
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
                           bool overlap, Communicator* replica, std::vector<GradientRegion> regions)
    : dp_(dp), replica_(replica != nullptr && replica->size() > 1 ? replica : nullptr),
      stage_(zero && dp.size() > 1 ? 1 : 0), overlap_(overlap), n_(n), memory_(memory) {
  check(replica_ == nullptr || stage_ == 1, "hybrid sharding needs ZeRO over a shard group of 2 or more ranks");
  check(replica_ == nullptr || regions.empty(), "hybrid sharding with regions reduced over other ranks");
  const size_t ranks = dp.size();
  check(n % ranks == 0, "DataParallel: buffer size must be a multiple of dp");
  buckets_ = bucket_ranges(n, bucket_mb, ranks);
  assign_groups(regions);
  next_bucket_ = buckets_.size();
  if (stage_ == 0) {
    owned_ = {{0, n}};
    return;
  }
  shard_buckets();
}

DataParallel::DataParallel(Communicator& dp, kernels::Kernels& memory, size_t n, GradientUnits units,
                           Communicator* replica, int stage, std::vector<GradientRegion> regions)
    : dp_(dp), replica_(replica != nullptr && replica->size() > 1 ? replica : nullptr), stage_(stage), n_(n),
      buckets_(units.units), memory_(memory), units_(std::move(units)) {
  const size_t ranks = dp.size();
  check(stage == 2 || stage == 3, "DataParallel: gradient units are for ZeRO-2 and -3");
  check(ranks > 1, "ZeRO-2 and -3 need dp > 1");
  check(replica_ == nullptr || regions.empty(), "hybrid sharding with regions reduced over other ranks");
  for (const FlatRange& u : buckets_) check(u.size() % ranks == 0, "ZeRO-2/3: a unit must be a multiple of dp");
  // The buckets are the units' pieces (a unit of its own without regions).
  const std::vector<FlatRange>& all = units_.units;
  assign_groups(regions);
  unit_pieces_ = first_pieces(all, buckets_);
  shard_buckets();
  reductions_.assign(all.size(), 0);
  armed_.assign(all.size(), false);
  for (size_t u = 0; u < all.size(); u++)
    if (units_.windowed[u]) window_shard_floats_ = std::max(window_shard_floats_, unit_shard_floats(u));
  if (!units_.accumulates) {
    if (units_.reduced_twice >= 0)
      temporaries_.emplace_back(nullptr, static_cast<float*>(memory_.alloc(window_shard_floats_ * sizeof(float))));
    return;
  }
  for (size_t u = 0; u < all.size(); u++) {
    if (!units_.windowed[u]) continue;
    const float* window = units_.locate(all[u].begin);
    const auto known = [&](const auto& e) { return e.first == window; };
    if (std::find_if(temporaries_.begin(), temporaries_.end(), known) == temporaries_.end())
      temporaries_.emplace_back(window, static_cast<float*>(memory_.alloc(window_shard_floats_ * sizeof(float))));
  }
}

void DataParallel::assign_groups(const std::vector<GradientRegion>& regions) {
  if (regions.empty()) return;
  std::vector<FlatRange> edges;
  for (const GradientRegion& r : regions) edges.insert(edges.end(), r.ranges.begin(), r.ranges.end());
  std::sort(edges.begin(), edges.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  buckets_ = split_at(buckets_, edges);
  for (const FlatRange& b : buckets_) {
    const auto region = std::find_if(regions.begin(), regions.end(), [&](const GradientRegion& r) { return within(b, r.ranges); });
    bucket_group_.push_back(region != regions.end() ? region->group : &dp_);
    check(b.size() % bucket_group_.back()->size() == 0, "DataParallel: a bucket not a multiple of its group");
  }
}

size_t DataParallel::unit_shard_floats(size_t u) const {
  size_t floats = 0;
  for (size_t p = unit_pieces_[u]; p < unit_pieces_[u + 1]; p++) floats += owned_[p].size();
  return floats;
}

RequestPtr DataParallel::reduce_unit(size_t u, const float* from, float* to) {
  // Each piece over its group, into its block of the unit's shard (the pieces' blocks one
  // after the other); a piece no other rank holds is copied.
  std::vector<RequestPtr> parts;
  const FlatRange& unit = units_.units[u];
  for (size_t p = unit_pieces_[u]; p < unit_pieces_[u + 1]; p++) {
    const float* in = from + (buckets_[p].begin - unit.begin);
    float* out = to + (shard_offset_[p] - shard_offset_[unit_pieces_[u]]);
    Communicator& group = group_of(p);
    if (group.size() == 1) memory_.copy_on_device(out, in, buckets_[p].size() * sizeof(float));
    else parts.push_back(reduce_to_shard(group, {in, buckets_[p].size()}, {out, owned_[p].size()}));
  }
  if (parts.size() == 1) return std::move(parts[0]);
  return std::make_unique<AllOf>(std::move(parts));
}

void DataParallel::shard_buckets() {
  owned_.clear();
  for (size_t b = 0; b < buckets_.size(); b++) {
    Communicator& group = group_of(b);
    const std::vector<FlatRange> block = sharded_ranges({buckets_[b]}, group.size(), group.rank());
    owned_.push_back(block[0]);
  }
  size_t shard_floats = 0;
  for (const FlatRange& r : owned_) {
    shard_offset_.push_back(shard_floats);
    shard_floats += r.size();
  }
  shard_ = static_cast<float*>(memory_.alloc(shard_floats * sizeof(float)));
}

DataParallel::~DataParallel() {
  pending_.clear();  // waits for what is in flight
  for (BlockReduction& r : in_flight_) r.request.reset();
  for (auto& [window, temporary] : temporaries_) memory_.free(temporary);
  if (shard_ != nullptr) memory_.free(shard_);
}

// Hybrid sharding's two steps: a reduce-scatter within the shard group, then the
// all-reduce of its block over the replicas. The second steps must start in the same
// order on every rank (the replicas pair them by order), so they start strictly in the
// order the chains were made, the same program order everywhere, never as each rank's
// timing happens to complete the first steps.
class DataParallel::ReplicaChain final : public Request {
 public:
  ReplicaChain(RequestPtr first, std::function<RequestPtr()> then, std::deque<ReplicaChain*>& order)
      : first_(std::move(first)), then_(std::move(then)), order_(order) {
    order_.push_back(this);
  }
  bool test() override {
    // Promote from the front while the front's first step is done.
    while (!order_.empty() && order_.front()->first_->test()) order_.front()->start_second();
    return second_ && second_->test();
  }
  void wait() override {
    while (!second_) order_.front()->start_second(true);  // everything made before this one first
    second_->wait();
  }
  ~ReplicaChain() override {
    if (!second_) wait();  // a started chain always finishes, in order
  }

 private:
  void start_second(bool wait_first = false) {
    if (wait_first) first_->wait();
    second_ = then_();
    order_.pop_front();  // this chain is the front
  }
  RequestPtr first_;
  std::function<RequestPtr()> then_;
  std::deque<ReplicaChain*>& order_;
  RequestPtr second_;
};

RequestPtr DataParallel::reduce_to_shard(Communicator& group, std::span<const float> in, std::span<float> out) {
  RequestPtr scatter = group.reduce_scatter_async(in, out);
  if (replica_ == nullptr) return scatter;
  Communicator* replica = replica_;
  return std::make_unique<ReplicaChain>(std::move(scatter), [replica, out] { return replica->all_reduce_async(out); },
                                        replica_order_);
}

namespace {

size_t index_of(const std::vector<FlatRange>& ranges, size_t offset) {
  const auto u = std::upper_bound(ranges.begin(), ranges.end(), offset,
                                  [](size_t o, const FlatRange& r) { return o < r.end; });
  check(u != ranges.end() && offset >= u->begin, "DataParallel: offset outside the buckets");
  return static_cast<size_t>(u - ranges.begin());
}

}  // namespace

size_t DataParallel::unit_at(size_t offset) const { return index_of(units_.units, offset); }

float* DataParallel::gradient_at(size_t offset) const {
  if (stage_ < 2) return grads_ + offset;
  const size_t i = index_of(buckets_, offset);
  check(offset >= owned_[i].begin && offset < owned_[i].end, "gradient_at: not an owned offset");
  return shard_ + shard_offset_[i] + (offset - owned_[i].begin);
}

void DataParallel::start_backward(float* grads) {
  grads_ = grads;
  next_bucket_ = buckets_.size();
  pending_.clear();
  admission_wait_s_ = 0;
  std::fill(reductions_.begin(), reductions_.end(), 0);
}

void DataParallel::finish(BlockReduction& r) {
  if (!r.request) return;
  r.request->wait();
  r.request.reset();
  if (r.temporary != nullptr) memory_.add_f32(r.shard, r.temporary, r.floats);
}

float* DataParallel::temporary_for(const float* window, size_t u) {
  auto t = std::find_if(temporaries_.begin(), temporaries_.end(), [&](const auto& e) { return e.first == window; });
  if (t == temporaries_.end() && static_cast<int>(u) == units_.reduced_twice)  // the one shared temporary
    t = std::find_if(temporaries_.begin(), temporaries_.end(), [](const auto& e) { return e.first == nullptr; });
  check(t != temporaries_.end(), "ZeRO-2/3: a second micro-batch, but GradientUnits::accumulates was false");
  for (BlockReduction& r : in_flight_)
    if (r.temporary == t->second) finish(r);  // another window's sum still uses it
  return t->second;
}

void DataParallel::finish_oldest_window_reductions(size_t keep) {
  std::vector<BlockReduction*> running;
  for (BlockReduction& e : in_flight_)
    if (e.request) running.push_back(&e);
  std::sort(running.begin(), running.end(), [](const auto* a, const auto* b) { return a->started < b->started; });
  for (size_t i = 0; i + keep < running.size(); i++) finish(*running[i]);
}

void DataParallel::unit_begins(size_t offset) {
  if (stage_ < 2) return;
  const size_t u = unit_at(offset);
  if (!units_.windowed[u]) return;
  float* window = units_.locate(units_.units[u].begin);
  for (BlockReduction& r : in_flight_)
    if (r.window == window) finish(r);
  memory_.fill_zero(window, units_.units[u].size() * sizeof(float));
  armed_[u] = true;
}

void DataParallel::admit(RequestPtr request) {
  if (max_in_flight_ > 0 && pending_.size() >= max_in_flight_) {
    Timer waiting;
    pending_.front()->wait();  // the oldest: its temporary is freed before the next is taken
    pending_.erase(pending_.begin());
    admission_wait_s_ += waiting.seconds();
  }
  pending_.push_back(std::move(request));
}

void DataParallel::start_bucket(size_t b) {
  const FlatRange& r = buckets_[b];
  std::span<float> data(grads_ + r.begin, r.size());
  Communicator& group = group_of(b);
  if (group.size() == 1) {  // a region no other rank holds (its axes' group is this rank)
    if (stage_ == 1) memory_.copy_on_device(shard_ + shard_offset_[b], data.data(), data.size_bytes());
    return;
  }
  if (stage_ == 1) admit(reduce_to_shard(group, data, {shard_ + shard_offset_[b], r.size() / group.size()}));
  else admit(group.all_reduce_async(data));
}

void DataParallel::gradients_final_from(size_t offset) {
  if (stage_ >= 2) {
    if (offset >= n_) return;
    const size_t u = unit_at(offset);
    // The kept units go at the end; a windowed unit once per unit_begins() (backward also
    // reports offset 0 at its end, a block's own offset on a stage without embeddings).
    if (!units_.windowed[u] || units_.units[u].begin != offset || !armed_[u]) return;
    armed_[u] = false;
    const float* window = units_.locate(offset);
    const size_t floats = unit_shard_floats(u);
    BlockReduction r{window, nullptr, nullptr, shard_ + shard_offset_[unit_pieces_[u]], floats};
    if (reductions_[u]++ > 0) r.temporary = temporary_for(window, u);  // an earlier sum is in the shard: add to it
    if (max_window_reductions_ > 0) finish_oldest_window_reductions(max_window_reductions_ - 1);
    r.started = reductions_started_++;
    r.request = reduce_unit(u, window, r.temporary ? r.temporary : r.shard);
    auto slot = std::find_if(in_flight_.begin(), in_flight_.end(), [&](const BlockReduction& e) { return e.window == window; });
    if (slot == in_flight_.end()) in_flight_.push_back(std::move(r));
    else *slot = std::move(r);  // unit_begins() finished the one before
    for (BlockReduction& f : in_flight_)
      if (f.request) f.request->test();  // MPI progresses non-blocking operations only when called
    return;
  }
  if (!overlap_ || grads_ == nullptr) return;
  while (next_bucket_ > 0 && buckets_[next_bucket_ - 1].begin >= offset) start_bucket(--next_bucket_);
  for (auto& p : pending_) p->test();  // MPI progresses non-blocking operations only when called
}

double DataParallel::finish_gradients() {
  check(grads_ != nullptr, "finish_gradients() without start_backward()");
  Timer waiting;
  if (stage_ >= 2) {
    for (BlockReduction& r : in_flight_) finish(r);
    for (size_t u = 0; u < units_.units.size(); u++)
      if (!units_.windowed[u])
        admit(reduce_unit(u, units_.locate(units_.units[u].begin), shard_ + shard_offset_[unit_pieces_[u]]));
    for (auto& p : pending_) p->wait();
    pending_.clear();
    return waiting.seconds() + std::exchange(admission_wait_s_, 0.0);
  }
  while (next_bucket_ > 0) start_bucket(--next_bucket_);
  waiting = Timer();
  for (auto& p : pending_) p->wait();
  const double waited = waiting.seconds() + std::exchange(admission_wait_s_, 0.0);
  pending_.clear();
  if (stage_ == 1) {
    for (size_t b = 0; b < buckets_.size(); b++)
      memory_.copy_on_device(grads_ + owned_[b].begin, shard_ + shard_offset_[b], owned_[b].size() * sizeof(float));
  }
  return waited;
}

void DataParallel::gather_parameters(float* params) {
  if (stage_ == 0) return;
  std::vector<RequestPtr> requests;  // within max_in_flight_, as the reductions
  for (size_t i = 0; i < buckets_.size(); i++) {
    const FlatRange& b = buckets_[i];
    if (group_of(i).size() == 1) continue;
    if (max_in_flight_ > 0 && requests.size() >= max_in_flight_) {
      requests.front()->wait();
      requests.erase(requests.begin());
    }
    requests.push_back(group_of(i).all_gather_async({params + b.begin, b.size()}));
  }
  for (auto& r : requests) r->wait();
}

void DataParallel::gather_host_buffer(float* host) {
  if (stage_ == 0) return;
  for (size_t i = 0; i < buckets_.size(); i++)
    if (group_of(i).size() > 1) group_of(i).all_gather(std::span<float>(host + buckets_[i].begin, buckets_[i].size()));
}

std::vector<float> DataParallel::gathered_gradients() {
  std::vector<float> full(n_, 0.0f);
  if (stage_ < 2) {
    gather_parameters(grads_);  // ZeRO-1: the owned blocks are in place; everything else in full
    memory_.copy_to_host(full.data(), grads_, n_ * sizeof(float));
    return full;
  }
  for (size_t b = 0; b < buckets_.size(); b++)
    memory_.copy_to_host(full.data() + owned_[b].begin, shard_ + shard_offset_[b], owned_[b].size() * sizeof(float));
  for (size_t b = 0; b < buckets_.size(); b++)
    if (group_of(b).size() > 1) group_of(b).all_gather(std::span<float>(full.data() + buckets_[b].begin, buckets_[b].size()));
  return full;
}

}  // namespace trident
