// See naive_attention.h: one thread per output element, nothing tiled or fused.
#include "cuda_common.cuh"
#include "kernels/cuda/naive_attention.h"

namespace trident::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;

struct Dims {
  int B, T, NH, NKV, hd;
  // part 0: query head h's q; 1, 2: the k, v of its key/value head h / (NH / NKV).
  __device__ size_t qkv_at(int b, int t, int part, int h, int d) const {
    const int kv = h / (NH / NKV);
    const int head = part == 0 ? h : part == 1 ? NH + kv : NH + NKV + kv;
    return (static_cast<size_t>(b) * T + t) * (NH + 2 * NKV) * hd + static_cast<size_t>(head) * hd + d;
  }
  // key/value head kv's k (part 1) or v (part 2)
  __device__ size_t kv_at(int b, int t, int part, int kv, int d) const {
    const int head = part == 1 ? NH + kv : NH + NKV + kv;
    return (static_cast<size_t>(b) * T + t) * (NH + 2 * NKV) * hd + static_cast<size_t>(head) * hd + d;
  }
  __device__ size_t out_at(int b, int t, int h, int d) const {
    return (static_cast<size_t>(b) * T + t) * NH * hd + static_cast<size_t>(h) * hd + d;
  }
};

template <typename T>
__global__ void scores_kernel(float* probs, const T* qkv, Dims s) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // (bh, i, j)
  if (idx >= static_cast<size_t>(s.B) * s.NH * s.T * s.T) return;
  const int j = idx % s.T, i = (idx / s.T) % s.T, bh = static_cast<int>(idx / (static_cast<size_t>(s.T) * s.T));
  if (j > i) return;
  const int b = bh / s.NH, h = bh % s.NH;
  float dot = 0.0f;
  for (int d = 0; d < s.hd; d++) dot += to_float(qkv[s.qkv_at(b, i, 0, h, d)]) * to_float(qkv[s.qkv_at(b, j, 1, h, d)]);
  probs[idx] = dot * rsqrtf(static_cast<float>(s.hd));
}

__global__ void softmax_kernel(float* probs, Dims s) {
  const size_t row = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // (bh, i)
  if (row >= static_cast<size_t>(s.B) * s.NH * s.T) return;
  const int i = row % s.T;
  float* p = probs + row * s.T;
  float m = -INFINITY;
  for (int j = 0; j <= i; j++) m = fmaxf(m, p[j]);
  float sum = 0.0f;
  for (int j = 0; j <= i; j++) {
    p[j] = __expf(p[j] - m);
    sum += p[j];
  }
  for (int j = 0; j < s.T; j++) p[j] = j <= i ? p[j] / sum : 0.0f;
}

template <typename T>
__global__ void weighted_sum_kernel(T* out, const float* probs, const T* qkv, Dims s) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // (bh, i, d)
  if (idx >= static_cast<size_t>(s.B) * s.NH * s.T * s.hd) return;
  const int d = idx % s.hd, i = (idx / s.hd) % s.T, bh = static_cast<int>(idx / (static_cast<size_t>(s.hd) * s.T));
  const int b = bh / s.NH, h = bh % s.NH;
  const float* p = probs + (static_cast<size_t>(bh) * s.T + i) * s.T;
  float sum = 0.0f;
  for (int j = 0; j <= i; j++) sum += p[j] * to_float(qkv[s.qkv_at(b, j, 2, h, d)]);
  out[s.out_at(b, i, h, d)] = from_float<T>(sum);
}

template <typename T>
__global__ void dprobs_kernel(float* dprobs, const T* dout, const T* qkv, Dims s) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // (bh, i, j)
  if (idx >= static_cast<size_t>(s.B) * s.NH * s.T * s.T) return;
  const int j = idx % s.T, i = (idx / s.T) % s.T, bh = static_cast<int>(idx / (static_cast<size_t>(s.T) * s.T));
  if (j > i) {
    dprobs[idx] = 0.0f;
    return;
  }
  const int b = bh / s.NH, h = bh % s.NH;
  float dot = 0.0f;
  for (int d = 0; d < s.hd; d++) dot += to_float(dout[s.out_at(b, i, h, d)]) * to_float(qkv[s.qkv_at(b, j, 2, h, d)]);
  dprobs[idx] = dot;
}

// dS = P (dP - sum_k P dP), in place; scaled by 1/sqrt(hd) for the scores' gradient.
__global__ void softmax_backward_kernel(float* dprobs, const float* probs, Dims s) {
  const size_t row = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (row >= static_cast<size_t>(s.B) * s.NH * s.T) return;
  const int i = row % s.T;
  const float* p = probs + row * s.T;
  float* dp = dprobs + row * s.T;
  float dot = 0.0f;
  for (int j = 0; j <= i; j++) dot += p[j] * dp[j];
  const float scale = rsqrtf(static_cast<float>(s.hd));
  for (int j = 0; j <= i; j++) dp[j] = p[j] * (dp[j] - dot) * scale;
}

template <typename T>
__global__ void q_gradient_kernel(T* dqkv, const float* dscores, const T* qkv, Dims s) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // (bh, row, d)
  if (idx >= static_cast<size_t>(s.B) * s.NH * s.T * s.hd) return;
  const int d = idx % s.hd, r = (idx / s.hd) % s.T, bh = static_cast<int>(idx / (static_cast<size_t>(s.hd) * s.T));
  const int b = bh / s.NH, h = bh % s.NH;
  const size_t plane = static_cast<size_t>(bh) * s.T * s.T;
  float dq = 0.0f;
  for (int j = 0; j <= r; j++) dq += dscores[plane + static_cast<size_t>(r) * s.T + j] * to_float(qkv[s.qkv_at(b, j, 1, h, d)]);
  dqkv[s.qkv_at(b, r, 0, h, d)] = from_float<T>(dq);
}

// dK, dV of a key/value head: summed over the query heads of its group.
template <typename T>
__global__ void kv_gradient_kernel(T* dqkv, const float* dscores, const float* probs, const T* dout, const T* qkv,
                                   Dims s) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;  // (b, kv, row, d)
  if (idx >= static_cast<size_t>(s.B) * s.NKV * s.T * s.hd) return;
  const int d = idx % s.hd, r = (idx / s.hd) % s.T, bkv = static_cast<int>(idx / (static_cast<size_t>(s.hd) * s.T));
  const int b = bkv / s.NKV, kv = bkv % s.NKV, group = s.NH / s.NKV;
  float dk = 0.0f, dv = 0.0f;
  for (int h = kv * group; h < (kv + 1) * group; h++) {
    const size_t plane = (static_cast<size_t>(b) * s.NH + h) * s.T * s.T;
    for (int i = r; i < s.T; i++) {
      const size_t at = plane + static_cast<size_t>(i) * s.T + r;
      dk += dscores[at] * to_float(qkv[s.qkv_at(b, i, 0, h, d)]);
      dv += probs[at] * to_float(dout[s.out_at(b, i, h, d)]);
    }
  }
  dqkv[s.kv_at(b, r, 1, kv, d)] = from_float<T>(dk);
  dqkv[s.kv_at(b, r, 2, kv, d)] = from_float<T>(dv);
}

template <typename T>
void forward(T* out, float* probs, const T* qkv, Dims s) {
  const size_t pairs = static_cast<size_t>(s.B) * s.NH * s.T * s.T, rows = static_cast<size_t>(s.B) * s.NH * s.T;
  scores_kernel<T><<<blocks_for(pairs, kThreads), kThreads, 0, compute_stream()>>>(probs, qkv, s);
  softmax_kernel<<<blocks_for(rows, kThreads), kThreads, 0, compute_stream()>>>(probs, s);
  weighted_sum_kernel<T><<<blocks_for(rows * s.hd, kThreads), kThreads, 0, compute_stream()>>>(out, probs, qkv, s);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward(T* dqkv, float* dprobs, const T* dout, const T* qkv, const float* probs, Dims s) {
  const size_t pairs = static_cast<size_t>(s.B) * s.NH * s.T * s.T, rows = static_cast<size_t>(s.B) * s.NH * s.T;
  dprobs_kernel<T><<<blocks_for(pairs, kThreads), kThreads, 0, compute_stream()>>>(dprobs, dout, qkv, s);
  softmax_backward_kernel<<<blocks_for(rows, kThreads), kThreads, 0, compute_stream()>>>(dprobs, probs, s);
  q_gradient_kernel<T><<<blocks_for(rows * s.hd, kThreads), kThreads, 0, compute_stream()>>>(dqkv, dprobs, qkv, s);
  const size_t kv_rows = static_cast<size_t>(s.B) * s.NKV * s.T;
  kv_gradient_kernel<T><<<blocks_for(kv_rows * s.hd, kThreads), kThreads, 0, compute_stream()>>>(dqkv, dprobs, probs,
                                                                                                 dout, qkv, s);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void naive_attention_forward(DType type, Act* out, float* probs, const Act* qkv, int B, int T, int NH, int NKV,
                             int HD) {
  const Dims s{B, T, NH, NKV, HD};
  if (type == DType::f32) forward(reinterpret_cast<float*>(out), probs, reinterpret_cast<const float*>(qkv), s);
  else forward(reinterpret_cast<bf16*>(out), probs, reinterpret_cast<const bf16*>(qkv), s);
}

void naive_attention_backward(DType type, Act* dqkv, float* dprobs, const Act* dout, const Act* qkv,
                              const float* probs, int B, int T, int NH, int NKV, int HD) {
  const Dims s{B, T, NH, NKV, HD};
  if (type == DType::f32)
    backward(reinterpret_cast<float*>(dqkv), dprobs, reinterpret_cast<const float*>(dout),
             reinterpret_cast<const float*>(qkv), probs, s);
  else
    backward(reinterpret_cast<bf16*>(dqkv), dprobs, reinterpret_cast<const bf16*>(dout),
             reinterpret_cast<const bf16*>(qkv), probs, s);
}

}  // namespace trident::kernels::cuda
