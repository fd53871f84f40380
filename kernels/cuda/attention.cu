// Causal self-attention, flash-attention style, with grouped-query attention: the
// T x T score matrix never exists in memory. Forward: each query row belongs to HD / 32
// threads (its lanes, 32 dimensions each in registers), which stream key/value tiles
// through shared memory with an online softmax; it keeps the row's log-sum-exp. Backward
// recomputes the probabilities from it, in two kernels that each own their outputs (key
// rows of a key/value head for dK and dV, summed over the query heads of its group; query
// rows for dQ), so no atomics and the result is deterministic. The kernels:
// attention_scalar_kernels.cuh.
#include <cstdlib>
#include <cstring>

#include "cuda_kernels.cuh"

// 16-byte aligned: the kernels read shared rows as float4.
#define TRIDENT_STATIC_SHARED(type, name, count) __shared__ __align__(16) type name[count]

namespace trident::kernels::cuda {

namespace {

#include "attention_scalar_kernels.cuh"

// Every kernel's shared memory is static (scalar_*_shared<HD>(), under 48 KB).
template <int HD, typename T>
void forward_with(T* out, float* lse, const T* qkv, int B, int T_, int NH, int NKV, int hd) {
  const dim3 grid(blocks_for(T_, kRows), B * NH);
  flash_forward_kernel<HD, T><<<grid, kThreads<HD>, 0, compute_stream()>>>(out, lse, qkv, T_, NH, NKV, hd);
  CUDA_CHECK_LAUNCH();
}

template <int HD, typename T>
void backward_with(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta, int B, int T_, int NH,
                   int NKV, int hd) {
  // dK/dV: one block row per (batch, key/value head); dQ: per (batch, query head).
  flash_backward_kv_kernel<HD, T><<<dim3(blocks_for(T_, kRows), B * NKV), kThreads<HD>, 0, compute_stream()>>>(
      dqkv, dout, qkv, lse, delta, T_, NH, NKV, hd);
  CUDA_CHECK_LAUNCH();
  flash_backward_q_kernel<HD, T><<<dim3(blocks_for(T_, kRows), B * NH), kThreads<HD>, 0, compute_stream()>>>(
      dqkv, dout, qkv, lse, delta, T_, NH, NKV, hd);
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

// The kernels take a sequence's own keys at positions 0..T-1 (mask.q_pos = mask.kv_pos =
// 0..T-1 is the caller's promise); separate key blocks and document masks are not here yet.
template <typename T>
void check_plain_causal(const T* qkv, const T* kv, int kv_ld, const AttentionMask& mask, int Tq, int Tk, int NH,
                        int NKV, int HD) {
  check(kv == qkv + static_cast<size_t>(NH) * HD && kv_ld == (NH + 2 * NKV) * HD && Tq == Tk &&
            mask.doc_start == nullptr,
        "CUDA attention: document masking and key blocks of other ranks are not supported on CUDA yet");
}

template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, const T* kv, int kv_ld, AttentionMask mask, int B, int Tq,
                       int Tk, int NH, int NKV, int HD) {
  check_attention_grid(B, NH);
  check_heads(NH, NKV, HD);
  check_plain_causal(qkv, kv, kv_ld, mask, Tq, Tk, NH, NKV, HD);
  const int T_ = Tq;
  if (B <= 0 || T_ <= 0) return;
  if constexpr (std::is_same_v<T, bf16>)
    if (use_tensor_core_attention(HD)) return tensor_core_attention_forward(out, lse, qkv, B, T_, NH, NKV, HD);
  if (HD <= 32) forward_with<32>(out, lse, qkv, B, T_, NH, NKV, HD);
  else if (HD <= 64) forward_with<64>(out, lse, qkv, B, T_, NH, NKV, HD);
  else forward_with<128>(out, lse, qkv, B, T_, NH, NKV, HD);
}

template <typename T>
void attention_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv, int kv_ld, const T* out,
                        const float* lse, AttentionMask mask, int B, int Tq, int Tk, int NH, int NKV, int HD,
                        float* scratch) {
  check_attention_grid(B, NH);
  check_heads(NH, NKV, HD);
  check_plain_causal(qkv, kv, kv_ld, mask, Tq, Tk, NH, NKV, HD);
  check(dkv == dqkv + static_cast<size_t>(NH) * HD, "CUDA attention: dkv must be dqkv's key/value columns");
  const int T_ = Tq;
  if (B <= 0 || T_ <= 0) return;
  const size_t rows = static_cast<size_t>(B) * NH * T_;
  row_dot_kernel<T><<<blocks_for(rows, 256), 256, 0, compute_stream()>>>(scratch, dout, out, B, T_, NH, HD);
  CUDA_CHECK_LAUNCH();
  if constexpr (std::is_same_v<T, bf16>)
    if (use_tensor_core_attention(HD))
      return tensor_core_attention_backward(dqkv, dout, qkv, lse, scratch, B, T_, NH, NKV, HD);
  if (HD <= 32) backward_with<32>(dqkv, dout, qkv, lse, scratch, B, T_, NH, NKV, HD);
  else if (HD <= 64) backward_with<64>(dqkv, dout, qkv, lse, scratch, B, T_, NH, NKV, HD);
  else backward_with<128>(dqkv, dout, qkv, lse, scratch, B, T_, NH, NKV, HD);
}

template void attention_forward<float>(float*, float*, const float*, const float*, int, AttentionMask, int, int, int,
                                       int, int, int);
template void attention_forward<bf16>(bf16*, float*, const bf16*, const bf16*, int, AttentionMask, int, int, int, int,
                                      int, int);
template void attention_backward<float>(float*, float*, const float*, const float*, const float*, int, const float*,
                                        const float*, AttentionMask, int, int, int, int, int, int, float*);
template void attention_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*, int, const bf16*,
                                       const float*, AttentionMask, int, int, int, int, int, int, float*);

}  // namespace trident::kernels::cuda
