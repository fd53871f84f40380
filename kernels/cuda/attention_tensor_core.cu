// Masked flash attention on tensor cores (bf16 WMMA, fp32 accumulation), for bf16
// activations and head dimensions 32, 64 and 128, with grouped-query attention: the path
// that training on a GPU takes.
// Same contract as attention.cu (whose scalar kernels serve fp32 and other head dims):
// the forward keeps each query row's log-sum-exp; the backward recomputes the
// probabilities in two kernels, one owning dK/dV of 64 key rows of a key/value head (summed
// over the query heads of its group), one owning dQ of 64 query rows, so there are no
// atomics. The kernels: attention_tensor_core_kernels.cuh.
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "cuda_kernels.cuh"
#include "shared_memory_limit.h"

#define TRIDENT_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]

namespace trident::kernels::cuda {

namespace {

#include "attention_tensor_core_kernels.cuh"

// Raises a kernel's dynamic shared-memory limit, once per kernel (and again for more
// bytes): every kernel here needs more than the default 48 KB.
SharedMemoryLimits shared_limits;

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  shared_limits.allow(kernel, bytes, [&](size_t n) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(n)));
  });
}

size_t max_shared_per_block() {
  static size_t bytes = [] {
    int device = 0, value = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return static_cast<size_t>(value);
  }();
  return bytes;
}

template <int HD>
bool fits_shared() {
  return std::max({forward_shared<HD>(), backward_kv_shared<HD>(), backward_q_shared<HD>()}) <= max_shared_per_block();
}

template <int HD>
void forward_with(bf16* out, float* lse, const bf16* qkv, const bf16* kv, AttentionMask mask, int B,
                  AttentionDims dims) {
  const size_t shared = forward_shared<HD>();
  allow_shared(tc_forward_kernel<HD>, shared);
  tc_forward_kernel<HD><<<dim3(blocks_for(dims.Tq, kRows), B * dims.NH), kThreads, shared, compute_stream()>>>(
      out, lse, qkv, kv, mask, dims);
  CUDA_CHECK_LAUNCH();
}

template <int HD>
void backward_with(bf16* dqkv, bf16* dkv, const bf16* dout, const bf16* qkv, const bf16* kv, const float* lse,
                   const float* delta, AttentionMask mask, int B, AttentionDims dims) {
  const size_t kv_shared = backward_kv_shared<HD>(), q_shared = backward_q_shared<HD>();
  allow_shared(tc_backward_kv_kernel<HD>, kv_shared);
  allow_shared(tc_backward_q_kernel<HD>, q_shared);
  // dK/dV: one block row per (batch, key/value head), over the group's query heads;
  // dQ: one per (batch, query head).
  if (dims.Tk > 0) {
    tc_backward_kv_kernel<HD><<<dim3(blocks_for(dims.Tk, kRows), B * dims.NKV), kThreads, kv_shared,
                                compute_stream()>>>(dkv, dout, qkv, kv, lse, delta, mask, dims);
    CUDA_CHECK_LAUNCH();
  }
  tc_backward_q_kernel<HD><<<dim3(blocks_for(dims.Tq, kRows), B * dims.NH), kThreads, q_shared, compute_stream()>>>(
      dqkv, dout, qkv, kv, lse, delta, mask, dims);
  CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

// Support depends on the head dimension (and the GPU's shared memory); a call also needs
// 16-byte aligned rows (tensor_core_attention_aligned).
bool tensor_core_attention_supports(int HD) {
  switch (HD) {  // head dim 128 needs ~120 KB of shared memory: more than sm_86/89 allow
    case 32: return fits_shared<32>();
    case 64: return fits_shared<64>();
    case 128: return fits_shared<128>();
    default: return false;
  }
}

// The kernels' 16-byte loads: every row stride a multiple of 8 elements (qkv's (NH + 2
// NKV) HD and out's NH HD are, for HD 32, 64, 128; kv_ld: 2 NKV HD under context
// parallelism, qkv's width for a sequence's own keys) and every buffer 16-byte aligned.
bool tensor_core_attention_aligned(std::initializer_list<const void*> buffers, int kv_ld) {
  if (kv_ld % 8 != 0) return false;
  for (const void* p : buffers)
    if (!aligned16(p)) return false;
  return true;
}

void tensor_core_attention_forward(bf16* out, float* lse, const bf16* qkv, const bf16* kv, int kv_ld,
                                   AttentionMask mask, int B, int Tq, int Tk, int NH, int NKV, int HD) {
  check(tensor_core_attention_aligned({out, qkv, kv}, kv_ld),
        "tensor-core attention: rows must be 16-byte aligned (kv_ld a multiple of 8, aligned buffers)");
  const AttentionDims dims{Tq, Tk, NH, NKV, HD, kv_ld};
  switch (HD) {
    case 32: return forward_with<32>(out, lse, qkv, kv, mask, B, dims);
    case 64: return forward_with<64>(out, lse, qkv, kv, mask, B, dims);
    default: return forward_with<128>(out, lse, qkv, kv, mask, B, dims);
  }
}

void tensor_core_attention_backward(bf16* dqkv, bf16* dkv, const bf16* dout, const bf16* qkv, const bf16* kv,
                                    int kv_ld, const float* lse, const float* delta, AttentionMask mask, int B,
                                    int Tq, int Tk, int NH, int NKV, int HD) {
  check(tensor_core_attention_aligned({dqkv, dkv, dout, qkv, kv}, kv_ld),
        "tensor-core attention: rows must be 16-byte aligned (kv_ld a multiple of 8, aligned buffers)");
  const AttentionDims dims{Tq, Tk, NH, NKV, HD, kv_ld};
  switch (HD) {
    case 32: return backward_with<32>(dqkv, dkv, dout, qkv, kv, lse, delta, mask, B, dims);
    case 64: return backward_with<64>(dqkv, dkv, dout, qkv, kv, lse, delta, mask, B, dims);
    default: return backward_with<128>(dqkv, dkv, dout, qkv, kv, lse, delta, mask, B, dims);
  }
}

}  // namespace trident::kernels::cuda
