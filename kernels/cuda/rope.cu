// Rotary position embeddings (rotate-half convention, as Hugging Face's Llama), in place
// on the q and k heads of the fused qkv rows [q (NH heads) | k (NKV) | v (NKV)]: within a
// head, element i < HD/2 pairs with element i + HD/2 and the pair turns by the angle
// whose cos and sin are rope_table[t][i]. One thread per pair; the backward is the
// transposed rotation (sin negated).
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxRowBlocks = 65535;  // grid y; more rows loop

// Grid x over the (head, pair) positions of one row, grid y over rows (strided).
template <typename T>
__global__ void rope_kernel(T* qkv, const float* table, int rows, int T_, int heads, int HD, int row_stride,
                            float direction) {
  const int half = HD / 2;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= heads * half) return;
  const int head = idx / half, i = idx % half;
  for (int row = blockIdx.y; row < rows; row += gridDim.y) {
    const float2 cs = reinterpret_cast<const float2*>(table)[static_cast<size_t>(row % T_) * half + i];
    const float c = cs.x, s = direction * cs.y;
    T* x = qkv + static_cast<size_t>(row) * row_stride + static_cast<size_t>(head) * HD;
    const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
    x[i] = from_float<T>(x1 * c - x2 * s);
    x[i + half] = from_float<T>(x2 * c + x1 * s);
  }
}

template <typename T>
void rotate(T* qkv, const float* table, int B, int T_, int NH, int NKV, int HD, float direction) {
  const int rows = B * T_, heads = NH + NKV, pairs = heads * (HD / 2);
  if (rows <= 0 || pairs <= 0) return;
  const dim3 grid(blocks_for(pairs, kThreads), rows < static_cast<int>(kMaxRowBlocks) ? rows : kMaxRowBlocks);
  rope_kernel<T><<<grid, kThreads, 0, compute_stream()>>>(qkv, table, rows, T_, heads, HD, (NH + 2 * NKV) * HD,
                                                          direction);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void rope_forward(T* qkv, const float* rope_table, int B, int T_, int NH, int NKV, int HD) {
  rotate(qkv, rope_table, B, T_, NH, NKV, HD, 1.0f);
}

template <typename T>
void rope_backward(T* dqkv, const float* rope_table, int B, int T_, int NH, int NKV, int HD) {
  rotate(dqkv, rope_table, B, T_, NH, NKV, HD, -1.0f);
}

template void rope_forward<float>(float*, const float*, int, int, int, int, int);
template void rope_forward<bf16>(bf16*, const float*, int, int, int, int, int);
template void rope_backward<float>(float*, const float*, int, int, int, int, int);
template void rope_backward<bf16>(bf16*, const float*, int, int, int, int, int);

}  // namespace trident::kernels::cuda
