// Masked self-attention (kernels/attention_mask.h: causal by position, within a
// document; keys from a buffer of their own), flash-attention style, with grouped-query
// attention: the Tq x Tk score matrix never exists in memory, and tiles no row of a block
// sees are skipped. Forward: each query row belongs to HD / 32
// threads (its lanes, 32 dimensions each in registers), which stream key/value tiles
// through shared memory with an online softmax; it keeps the row's log-sum-exp. Backward
// recomputes the probabilities from it, in two kernels that each own their outputs (key
// rows of a key/value head for dK and dV, summed over the query heads of its group; query
// rows for dQ), so no atomics and the result is deterministic. The kernels:
// attention_scalar_kernels.cuh.
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "cuda_kernels.cuh"

// 16-byte aligned: the kernels read shared rows as float4.
#define TRIDENT_STATIC_SHARED(type, name, count) __shared__ __align__(16) type name[count]

namespace trident::kernels::cuda {

namespace {

#include "attention_scalar_kernels.cuh"

// Every kernel's shared memory is static (scalar_*_shared<HD>(), under 48 KB).
template <int HD, typename T>
void forward_with(T* out, float* lse, const T* qkv, const T* kv, AttentionMask mask, int B, AttentionDims dims) {
  const dim3 grid(blocks_for(dims.Tq, kRows), B * dims.NH);
  flash_forward_kernel<HD, T><<<grid, kThreads<HD>, 0, compute_stream()>>>(out, lse, qkv, kv, mask, dims);
  CUDA_CHECK_LAUNCH();
}

template <int HD, typename T>
void backward_with(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv, const float* lse, const float* delta,
                   AttentionMask mask, int B, AttentionDims dims) {
  // dK/dV: one block row per (batch, key/value head); dQ: per (batch, query head).
  if (dims.Tk > 0) {
    flash_backward_kv_kernel<HD, T><<<dim3(blocks_for(dims.Tk, kRows), B * dims.NKV), kThreads<HD>, 0,
                                      compute_stream()>>>(dkv, dout, qkv, kv, lse, delta, mask, dims);
    CUDA_CHECK_LAUNCH();
  }
  flash_backward_q_kernel<HD, T><<<dim3(blocks_for(dims.Tq, kRows), B * dims.NH), kThreads<HD>, 0,
                                   compute_stream()>>>(dqkv, dout, qkv, kv, lse, delta, mask, dims);
  CUDA_CHECK_LAUNCH();
}

void check_heads(int NH, int NKV, int hd) {
  check(NH > 0 && NKV > 0 && NH % NKV == 0,
        "CUDA attention: the query heads must be a multiple of the key/value heads, got " + std::to_string(NH) +
            " and " + std::to_string(NKV));
  check(hd > 0 && hd <= 128, "CUDA attention supports head dimensions up to 128, got " + std::to_string(hd));
}

}  // namespace

// One block row per (batch, head): CUDA's grid y is at most 65535.
void check_attention_grid(int B, int NH) {
  check(static_cast<long>(B) * NH <= 65535, "CUDA attention: micro-batch x heads per rank must be <= 65535, got " +
                                                std::to_string(static_cast<long>(B) * NH));
}

bool use_tensor_core_attention(int HD) {
  const char* choice = std::getenv("TRIDENT_CUDA_ATTENTION");
  return tensor_core_attention_supports(HD) && (choice == nullptr || std::strcmp(choice, "scalar") != 0);
}

// The operands of one call, checked: q_pos and kv_pos are needed (device arrays of Tq
// and Tk positions), and kv's rows must hold the 2 NKV heads.
void check_operands(const void* kv, int kv_ld, const AttentionMask& mask, int Tq, int Tk, int NKV, int HD) {
  check(Tq >= 0 && Tk >= 0, "CUDA attention: negative sequence lengths");
  check(Tq == 0 || mask.q_pos != nullptr, "CUDA attention: the mask needs q_pos");
  check(Tk == 0 || (mask.kv_pos != nullptr && kv != nullptr), "CUDA attention: the mask needs kv_pos, and kv");
  check(kv_ld >= 2 * NKV * HD, "CUDA attention: kv rows (kv_ld " + std::to_string(kv_ld) + ") narrower than 2 NKV HD");
}

template <typename T>
bool tensor_cores_for(int HD, std::initializer_list<const void*> buffers, int kv_ld) {
  if constexpr (std::is_same_v<T, bf16>) return use_tensor_core_attention(HD) && tensor_core_attention_aligned(buffers, kv_ld);
  else return false;
}

template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, const T* kv, int kv_ld, AttentionMask mask, int B, int Tq,
                       int Tk, int NH, int NKV, int HD) {
  check_attention_grid(B, NH);
  check_heads(NH, NKV, HD);
  check_operands(kv, kv_ld, mask, Tq, Tk, NKV, HD);
  if (B <= 0 || Tq <= 0) return;
  if constexpr (std::is_same_v<T, bf16>)
    if (tensor_cores_for<T>(HD, {out, qkv, kv}, kv_ld))
      return tensor_core_attention_forward(out, lse, qkv, kv, kv_ld, mask, B, Tq, Tk, NH, NKV, HD);
  const AttentionDims dims{Tq, Tk, NH, NKV, HD, kv_ld};
  if (HD <= 32) forward_with<32>(out, lse, qkv, kv, mask, B, dims);
  else if (HD <= 64) forward_with<64>(out, lse, qkv, kv, mask, B, dims);
  else forward_with<128>(out, lse, qkv, kv, mask, B, dims);
}

template <typename T>
void attention_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv, int kv_ld, const T* out,
                        const float* lse, AttentionMask mask, int B, int Tq, int Tk, int NH, int NKV, int HD,
                        float* scratch) {
  check_attention_grid(B, NH);
  check_heads(NH, NKV, HD);
  check_operands(kv, kv_ld, mask, Tq, Tk, NKV, HD);
  check(Tk == 0 || dkv != nullptr, "CUDA attention: backward needs dkv");
  if (B <= 0 || (Tq <= 0 && Tk <= 0)) return;
  if (Tq <= 0) {  // no query sees these keys: dK = dV = 0 (the kernels write no zeros without a query)
    for (int b = 0; b < B; b++)
      CUDA_CHECK(cudaMemset2DAsync(dkv + static_cast<size_t>(b) * Tk * kv_ld, static_cast<size_t>(kv_ld) * sizeof(T), 0,
                                   static_cast<size_t>(2 * NKV * HD) * sizeof(T), Tk, compute_stream()));
    return;
  }
  const size_t rows = static_cast<size_t>(B) * NH * Tq;
  row_dot_kernel<T><<<blocks_for(rows, 256), 256, 0, compute_stream()>>>(scratch, dout, out, B, Tq, NH, HD);
  CUDA_CHECK_LAUNCH();
  if constexpr (std::is_same_v<T, bf16>)
    if (tensor_cores_for<T>(HD, {dqkv, dkv, dout, qkv, kv}, kv_ld))
      return tensor_core_attention_backward(dqkv, dkv, dout, qkv, kv, kv_ld, lse, scratch, mask, B, Tq, Tk, NH, NKV,
                                            HD);
  const AttentionDims dims{Tq, Tk, NH, NKV, HD, kv_ld};
  if (HD <= 32) backward_with<32>(dqkv, dkv, dout, qkv, kv, lse, scratch, mask, B, dims);
  else if (HD <= 64) backward_with<64>(dqkv, dkv, dout, qkv, kv, lse, scratch, mask, B, dims);
  else backward_with<128>(dqkv, dkv, dout, qkv, kv, lse, scratch, mask, B, dims);
}

// One thread per (b, h, t) row: out and lse merged with a block's part (kernels/ops.def).
template <typename T>
__global__ void attention_combine_kernel(T* out, float* lse, const T* part, const float* part_lse, int B, int T_,
                                         int NH, int HD) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // (b*NH + h)*T + t
  if (idx >= static_cast<size_t>(B) * NH * T_) return;
  const int t = static_cast<int>(idx % T_), bh = static_cast<int>(idx / T_), b = bh / NH, h = bh % NH;
  const float l = lse[idx], p = part_lse[idx], m = fmaxf(l, p);
  if (m == -INFINITY) return;  // no key in either
  const float w_old = expf(l - m), w_new = expf(p - m), inv = 1.0f / (w_old + w_new);
  const size_t row = (static_cast<size_t>(b) * T_ + t) * NH * HD + static_cast<size_t>(h) * HD;
  for (int d = 0; d < HD; d++)
    out[row + d] = from_float<T>((to_float(out[row + d]) * w_old + to_float(part[row + d]) * w_new) * inv);
  lse[idx] = m + logf(w_old + w_new);
}

template <typename T>
void attention_combine(T* out, float* lse, const T* part, const float* part_lse, int B, int T_, int NH, int HD) {
  const size_t rows = static_cast<size_t>(B) * NH * T_;
  if (rows == 0) return;
  attention_combine_kernel<T><<<blocks_for(rows, 256), 256, 0, compute_stream()>>>(out, lse, part, part_lse, B, T_,
                                                                                   NH, HD);
  CUDA_CHECK_LAUNCH();
}
template void attention_combine<float>(float*, float*, const float*, const float*, int, int, int, int);
template void attention_combine<bf16>(bf16*, float*, const bf16*, const float*, int, int, int, int);

template void attention_forward<float>(float*, float*, const float*, const float*, int, AttentionMask, int, int, int,
                                       int, int, int);
template void attention_forward<bf16>(bf16*, float*, const bf16*, const bf16*, int, AttentionMask, int, int, int, int,
                                      int, int);
template void attention_backward<float>(float*, float*, const float*, const float*, const float*, int, const float*,
                                        const float*, AttentionMask, int, int, int, int, int, int, float*);
template void attention_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*, int, const bf16*,
                                       const float*, AttentionMask, int, int, int, int, int, int, float*);

}  // namespace trident::kernels::cuda
