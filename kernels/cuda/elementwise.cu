// Element-wise kernels: casts, embeddings and positions, GELU, residual adds.
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

template <typename T>
__global__ void cast_kernel(T* out, const float* in, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = from_float<T>(in[i]);
}

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte_shard, int vocab_start,
                                         int shard_rows, size_t BT, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= BT * C) return;
  const size_t bt = i / C;
  const int c = static_cast<int>(i % C), row = tokens[bt] - vocab_start;
  out[i] = row >= 0 && row < shard_rows ? wte_shard[static_cast<size_t>(row) * C + c] : from_float<T>(0.0f);
}

// One block per distinct token row: its positions are summed in order.
template <typename T>
__global__ void embedding_backward_kernel(float* dwte_shard, const T* dout, const int32_t* rows,
                                          const int32_t* row_starts, const int32_t* positions, int C) {
  const int r = blockIdx.x;
  float* dst = dwte_shard + static_cast<size_t>(rows[r]) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = 0.0f;
    for (int k = row_starts[r]; k < row_starts[r + 1]; k++) sum += to_float(dout[static_cast<size_t>(positions[k]) * C + c]);
    dst[c] += sum;
  }
}

template <typename T>
__global__ void add_positions_kernel(T* out, const T* wpe, const int32_t* positions, size_t BT, int T_, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= BT * C) return;
  const size_t t = positions[(i / C) % T_];
  out[i] = from_float<T>(to_float(out[i]) + to_float(wpe[t * C + i % C]));
}

template <typename T>
__global__ void positions_backward_kernel(float* dwpe, const T* dout, const int32_t* positions, int B, int T_, int C) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // over T*C
  if (i >= static_cast<size_t>(T_) * C) return;
  float sum = 0.0f;
  for (int b = 0; b < B; b++) sum += to_float(dout[static_cast<size_t>(b) * T_ * C + i]);
  dwpe[static_cast<size_t>(positions[i / C]) * C + i % C] += sum;  // distinct positions: one thread per element
}

template <typename T>
__global__ void copy_columns_kernel(T* dst, int dst_ld, const T* src, int src_ld, int rows, int width) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // over rows*width
  if (i >= static_cast<size_t>(rows) * width) return;
  const size_t r = i / width, c = i % width;
  dst[r * dst_ld + c] = src[r * src_ld + c];
}

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = to_float(inp[i]);
  out[i] = from_float<T>(0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x))));
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = to_float(inp[i]);
  const float u = kGeluScale * (x + 0.044715f * x * x * x);
  const float th = tanhf(u), sech2 = 1.0f - th * th;
  const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] = from_float<T>(grad * to_float(dout[i]));
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

}  // namespace

#define TRIDENT_LAUNCH(kernel, n, ...)                                                    \
  do {                                                                                    \
    if ((n) > 0) kernel<<<blocks_for((n), kThreads), kThreads, 0, compute_stream()>>>(__VA_ARGS__); \
    CUDA_CHECK_LAUNCH();                                                                  \
  } while (0)

template <typename T>
void cast(T* out, const float* in, size_t n) {
  TRIDENT_LAUNCH(cast_kernel<T>, n, out, in, n);
}
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte_shard, int vocab_start, int shard_rows, int B,
                       int T_, int C) {
  const size_t BT = static_cast<size_t>(B) * T_;
  TRIDENT_LAUNCH(embedding_forward_kernel<T>, BT * C, out, tokens, wte_shard, vocab_start, shard_rows, BT, C);
}
template <typename T>
void embedding_backward(float* dwte_shard, const T* dout, const int32_t* rows, const int32_t* row_starts,
                        const int32_t* positions, int distinct_rows, int C) {
  if (distinct_rows > 0)
    embedding_backward_kernel<T><<<distinct_rows, kThreads, 0, compute_stream()>>>(dwte_shard, dout, rows, row_starts,
                                                                                   positions, C);
  CUDA_CHECK_LAUNCH();
}
template <typename T>
void add_positions(T* out, const T* wpe, const int32_t* positions, int B, int T_, int C) {
  const size_t BT = static_cast<size_t>(B) * T_;
  TRIDENT_LAUNCH(add_positions_kernel<T>, BT * C, out, wpe, positions, BT, T_, C);
}
template <typename T>
void positions_backward(float* dwpe, const T* dout, const int32_t* positions, int B, int T_, int C) {
  TRIDENT_LAUNCH(positions_backward_kernel<T>, static_cast<size_t>(T_) * C, dwpe, dout, positions, B, T_, C);
}
template <typename T>
void copy_columns(T* dst, int dst_ld, const T* src, int src_ld, int rows, int width) {
  TRIDENT_LAUNCH(copy_columns_kernel<T>, static_cast<size_t>(rows) * width, dst, dst_ld, src, src_ld, rows, width);
}
template <typename T>
void gelu_forward(T* out, const T* inp, size_t n) {
  TRIDENT_LAUNCH(gelu_forward_kernel<T>, n, out, inp, n);
}
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  TRIDENT_LAUNCH(gelu_backward_kernel<T>, n, dinp, inp, dout, n);
}
template <typename T>
void add(T* out, const T* a, const T* b, size_t n) {
  TRIDENT_LAUNCH(add_kernel<T>, n, out, a, b, n);
}

#define TRIDENT_INSTANTIATE(T)                                                                             \
  template void cast<T>(T*, const float*, size_t);                                                         \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int, int, int, int);               \
  template void embedding_backward<T>(float*, const T*, const int32_t*, const int32_t*, const int32_t*, int, int); \
  template void add_positions<T>(T*, const T*, const int32_t*, int, int, int);                             \
  template void positions_backward<T>(float*, const T*, const int32_t*, int, int, int);                    \
  template void copy_columns<T>(T*, int, const T*, int, int, int);                                          \
  template void gelu_forward<T>(T*, const T*, size_t);                                                     \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);                                          \
  template void add<T>(T*, const T*, const T*, size_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(bf16)

}  // namespace trident::kernels::cuda
