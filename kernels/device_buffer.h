// A buffer of a kernel backend's memory (host memory on the CPU, device memory on a
// GPU), freed with it. Sizes are in floats; activations of another type take
// as many floats as their bytes need.
#pragma once

#include <cstddef>
#include <utility>

#include "kernels/kernels.h"

namespace trident::kernels {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Kernels& k, size_t floats) : k_(&k), data_(static_cast<float*>(k.alloc(floats * sizeof(float)))), size_(floats) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : k_(other.k_), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(k_, other.k_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) k_->free(data_);
  }

  float* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Kernels* k_ = nullptr;
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace trident::kernels
