// Raising a kernel's dynamic shared-memory limit (cudaFuncAttributeMaxDynamicSharedMemorySize)
// once per kernel, keyed on the kernel's address: kernels of one signature (each head
// dimension's instance, say) share a function-pointer type but not a limit. Plain C++
// (the setter is a callable), so the logic is tested without CUDA.
#pragma once

#include <cstddef>
#include <mutex>
#include <unordered_map>

namespace trident::kernels::cuda {

class SharedMemoryLimits {
 public:
  // Calls set(bytes) unless `kernel` was already allowed `bytes` or more; records the
  // bytes only once set returns (a throwing set is retried next time). Thread-safe.
  template <typename Kernel, typename Set>
  void allow(Kernel kernel, size_t bytes, Set&& set) {
    const void* key = reinterpret_cast<const void*>(kernel);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = allowed_.find(key);
    if (it != allowed_.end() && it->second >= bytes) return;
    set(bytes);
    allowed_[key] = bytes;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<const void*, size_t> allowed_;
};

}  // namespace trident::kernels::cuda
