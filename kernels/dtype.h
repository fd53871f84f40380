// Element types shared by the kernels and the communicators (which move activations).
#pragma once

#include <cstddef>

namespace trident::kernels {

enum class Device { cpu, cuda };      // where the kernels run
enum class Precision { fp32, bf16 };  // of the compute: fp32, or bf16 with fp32 master weights
enum class DType { f32, bf16 };       // how an element is stored
inline size_t dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

// An element of an activation buffer, float or bf16 as the backend decides
// (kernels/kernels.h); opaque, so it is never dereferenced outside a backend.
struct Act;

// p + elements, for an activation buffer of element type `type`.
inline Act* offset(Act* p, size_t elements, DType type) {
  return reinterpret_cast<Act*>(reinterpret_cast<char*>(p) + elements * dtype_bytes(type));
}
inline const Act* offset(const Act* p, size_t elements, DType type) {
  return reinterpret_cast<const Act*>(reinterpret_cast<const char*>(p) + elements * dtype_bytes(type));
}

}  // namespace trident::kernels
