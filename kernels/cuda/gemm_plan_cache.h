// The policy of gemm.cu's cache of cuBLASLt matmul plans, kept free of CUDA types so that a
// unit test can run it without a GPU (tests/unit/test_gemm_plan_cache.cpp).
// The experts' GEMMs see a new row count for almost every expert at every step; planned per
// exact shape, each would cost a heuristic call and descriptors kept forever. So the
// dimensions that carry rows are rounded up to a few sizes per octave (the plan's
// algorithm, chosen for the rounded shape, runs the exact one when cuBLASLt accepts it),
// and the cache holds at most `capacity` plans, destroying the least recently used.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <utility>

namespace trident::kernels::cuda {

// A row count rounded up to the next 2^k or 3 * 2^(k-1) (at most 1.5x larger: two keys per
// octave), at least kMinPlanRows.
inline constexpr int kMinPlanRows = 64;
inline int plan_rows(int rows) {
  int size = kMinPlanRows;
  while (size < rows && size <= (1 << 29)) {
    if (size / 2 * 3 >= rows) return size / 2 * 3;  // 3 * 2^(k-1), between 2^k and 2^(k+1)
    size *= 2;
  }
  return size < rows ? rows : size;  // past 2^30 rows: exact
}

// Plans by Key (ordered), created by the `make` given to get() and destroyed by `destroy`
// when evicted or with the cache. Not thread-safe: the caller locks.
template <typename Key, typename Plan>
class GemmPlanCache {
 public:
  GemmPlanCache(size_t capacity, std::function<void(Plan&)> destroy)
      : capacity_(capacity), destroy_(std::move(destroy)) {}
  GemmPlanCache(const GemmPlanCache&) = delete;
  GemmPlanCache& operator=(const GemmPlanCache&) = delete;
  ~GemmPlanCache() {
    for (auto& [key, plan] : order_) destroy_(plan);
  }

  // The plan for `key`, made by make() if absent; valid until the next get() (which may
  // evict it).
  template <typename Make>
  Plan& get(const Key& key, Make make) {
    auto found = index_.find(key);
    if (found != index_.end()) {
      order_.splice(order_.begin(), order_, found->second);  // now the most recently used
      return found->second->second;
    }
    order_.emplace_front(key, make());
    created_++;
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {  // the least recently used goes
      destroy_(order_.back().second);
      index_.erase(order_.back().first);
      order_.pop_back();
      evicted_++;
    }
    return order_.front().second;
  }

  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }
  size_t created() const { return created_; }  // plans made over the cache's life
  size_t evicted() const { return evicted_; }  // and destroyed before its end

 private:
  size_t capacity_;
  std::function<void(Plan&)> destroy_;
  std::list<std::pair<Key, Plan>> order_;  // most recently used first
  std::map<Key, typename std::list<std::pair<Key, Plan>>::iterator> index_;
  size_t created_ = 0, evicted_ = 0;
};

}  // namespace trident::kernels::cuda
