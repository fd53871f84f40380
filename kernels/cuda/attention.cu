// Causal self-attention, flash-attention style: the T x T score matrix never exists in
// memory. Forward: each thread owns one query row and streams key/value tiles through
// shared memory with an online softmax; it keeps the row's log-sum-exp. Backward
// recomputes the probabilities from it, in two kernels that each own their outputs
// (one thread per key row for dK and dV, one per query row for dQ), so no atomics
// and the result is deterministic.
//
// qkv[B,T,3C]: head h's q, k, v are columns h*hd, C + h*hd, 2C + h*hd; hd <= HD.
#include <cstdlib>
#include <cstring>

#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kRows = 64;      // query rows (or key rows) per block: one per thread
constexpr int kTile = 32;      // keys per shared-memory tile in the forward and dQ kernels
constexpr int kQueryTile = 16; // query rows per shared-memory tile in the dK/dV kernel

struct Head {
  size_t row_stride;  // 3C
  size_t q, k, v;     // column offsets of this head's q, k, v
  size_t batch;       // first row of this batch element
};

__device__ __forceinline__ Head head_of(int bh, int T, int C, int NH, int hd) {
  const int b = bh / NH, h = bh % NH;
  return {3 * static_cast<size_t>(C), static_cast<size_t>(h) * hd, static_cast<size_t>(C) + h * hd,
          2 * static_cast<size_t>(C) + h * hd, static_cast<size_t>(b) * T};
}

// rows [first, first + rows) of one head's column block into shared [rows][HD], zero-padded.
template <int HD, typename T>
__device__ __forceinline__ void load_tile(float* tile, const T* base, const Head& hd_, size_t column, int first, int rows,
                                          int T_, int hd) {
  for (int idx = threadIdx.x; idx < rows * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD, row = first + r;
    tile[idx] = row < T_ && d < hd ? to_float(base[(hd_.batch + row) * hd_.row_stride + column + d]) : 0.0f;
  }
}

template <int HD, typename T>
__global__ void __launch_bounds__(kRows) flash_forward_kernel(T* out, float* lse, const T* qkv, int T_, int C, int NH,
                                                               int hd) {
  __shared__ float ks[kTile * HD], vs[kTile * HD];
  const int bh = blockIdx.y;
  const Head head = head_of(bh, T_, C, NH, hd);
  const int i = blockIdx.x * kRows + threadIdx.x;
  const float scale = rsqrtf(static_cast<float>(hd));
  float q[HD], o[HD];
#pragma unroll
  for (int d = 0; d < HD; d++) {
    q[d] = i < T_ && d < hd ? to_float(qkv[(head.batch + i) * head.row_stride + head.q + d]) * scale : 0.0f;
    o[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int last_row = min(static_cast<int>(blockIdx.x) * kRows + kRows, T_) - 1;
  for (int kt = 0; kt <= last_row; kt += kTile) {
    __syncthreads();
    load_tile<HD>(ks, qkv, head, head.k, kt, kTile, T_, hd);
    load_tile<HD>(vs, qkv, head, head.v, kt, kTile, T_, hd);
    __syncthreads();
    if (i >= T_ || kt > i) continue;
    float s[kTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile; j++) {
      float dot = 0.0f;
#pragma unroll
      for (int d = 0; d < HD; d++) dot += q[d] * ks[j * HD + d];
      s[j] = kt + j <= i ? dot : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
    const float m_new = fmaxf(m, tile_max);
    const float correction = __expf(m - m_new);
    l *= correction;
#pragma unroll
    for (int d = 0; d < HD; d++) o[d] *= correction;
#pragma unroll
    for (int j = 0; j < kTile; j++) {
      const float p = __expf(s[j] - m_new);
      l += p;
#pragma unroll
      for (int d = 0; d < HD; d++) o[d] += p * vs[j * HD + d];
    }
    m = m_new;
  }
  if (i >= T_) return;
  const float inv_l = 1.0f / l;
  T* o_row = out + (head.batch + i) * static_cast<size_t>(C) + head.q;
#pragma unroll
  for (int d = 0; d < HD; d++)
    if (d < hd) o_row[d] = from_float<T>(o[d] * inv_l);
  lse[static_cast<size_t>(bh) * T_ + i] = m + logf(l);
}

// delta[bh, i] = dO_i . O_i, the softmax backward's row term.
template <typename T>
__global__ void row_dot_kernel(float* delta, const T* dout, const T* out, int B, int T_, int C, int NH, int hd) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<size_t>(B) * NH * T_) return;
  const int i = static_cast<int>(idx % T_), bh = static_cast<int>(idx / T_), b = bh / NH, h = bh % NH;
  const size_t base = (static_cast<size_t>(b) * T_ + i) * C + static_cast<size_t>(h) * hd;
  float sum = 0.0f;
  for (int d = 0; d < hd; d++) sum += to_float(dout[base + d]) * to_float(out[base + d]);
  delta[idx] = sum;
}

// One thread per key row j: dV_j = sum_i P_ij dO_i, dK_j = scale * sum_i dS_ij q_i over
// the query rows i >= j. k_j and v_j sit transposed in shared memory ([HD][kRows]:
// each thread reads its own column, no bank conflicts); the accumulators in registers.
template <int HD, typename T>
__global__ void __launch_bounds__(kRows) flash_backward_kv_kernel(T* dqkv, const T* dout, const T* qkv,
                                                                   const float* lse, const float* delta, int T_, int C,
                                                                   int NH, int hd) {
  extern __shared__ float shared[];
  float* kT = shared;                       // [HD][kRows]
  float* vT = kT + HD * kRows;              // [HD][kRows]
  float* qs = vT + HD * kRows;              // [kQueryTile][HD]
  float* dos = qs + kQueryTile * HD;        // [kQueryTile][HD]
  float* lse_s = dos + kQueryTile * HD;     // [kQueryTile]
  float* delta_s = lse_s + kQueryTile;      // [kQueryTile]
  const int bh = blockIdx.y, tid = threadIdx.x;
  const Head head = head_of(bh, T_, C, NH, hd);
  const int first_key = blockIdx.x * kRows, j = first_key + tid;
  const float scale = rsqrtf(static_cast<float>(hd));
  for (int d = 0; d < HD; d++) {
    const bool valid = j < T_ && d < hd;
    kT[d * kRows + tid] = valid ? to_float(qkv[(head.batch + j) * head.row_stride + head.k + d]) : 0.0f;
    vT[d * kRows + tid] = valid ? to_float(qkv[(head.batch + j) * head.row_stride + head.v + d]) : 0.0f;
  }
  float dk[HD], dv[HD];
#pragma unroll
  for (int d = 0; d < HD; d++) dk[d] = dv[d] = 0.0f;
  const Head out_head{static_cast<size_t>(C), head.q, 0, 0, head.batch};  // dO rows: stride C, columns h*hd
  for (int qt = first_key / kQueryTile * kQueryTile; qt < T_; qt += kQueryTile) {
    __syncthreads();
    load_tile<HD>(qs, qkv, head, head.q, qt, kQueryTile, T_, hd);
    load_tile<HD>(dos, dout, out_head, out_head.q, qt, kQueryTile, T_, hd);
    if (tid < kQueryTile) {
      const int i = qt + tid;
      lse_s[tid] = i < T_ ? lse[static_cast<size_t>(bh) * T_ + i] : 0.0f;
      delta_s[tid] = i < T_ ? delta[static_cast<size_t>(bh) * T_ + i] : 0.0f;
    }
    __syncthreads();
    if (j >= T_) continue;
    for (int r = 0; r < kQueryTile; r++) {
      const int i = qt + r;
      if (i < j || i >= T_) continue;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int d = 0; d < HD; d++) {
        s += qs[r * HD + d] * kT[d * kRows + tid];
        dp += dos[r * HD + d] * vT[d * kRows + tid];
      }
      const float p = __expf(s * scale - lse_s[r]);
      const float ds = p * (dp - delta_s[r]) * scale;
#pragma unroll
      for (int d = 0; d < HD; d++) {
        dv[d] += p * dos[r * HD + d];
        dk[d] += ds * qs[r * HD + d];
      }
    }
  }
  if (j >= T_) return;
  T* row = dqkv + (head.batch + j) * head.row_stride;
#pragma unroll
  for (int d = 0; d < HD; d++)
    if (d < hd) {
      row[head.k + d] = from_float<T>(dk[d]);
      row[head.v + d] = from_float<T>(dv[d]);
    }
}

// One thread per query row i: dQ_i = scale * sum_{j <= i} dS_ij k_j. q_i and dO_i sit
// transposed in shared memory, key/value tiles stream through it.
template <int HD, typename T>
__global__ void __launch_bounds__(kRows) flash_backward_q_kernel(T* dqkv, const T* dout, const T* qkv,
                                                                  const float* lse, const float* delta, int T_, int C,
                                                                  int NH, int hd) {
  extern __shared__ float shared[];
  float* qT = shared;                 // [HD][kRows]
  float* doT = qT + HD * kRows;       // [HD][kRows]
  float* ks = doT + HD * kRows;       // [kTile][HD]
  float* vs = ks + kTile * HD;        // [kTile][HD]
  const int bh = blockIdx.y, tid = threadIdx.x;
  const Head head = head_of(bh, T_, C, NH, hd);
  const int i = blockIdx.x * kRows + tid;
  const float scale = rsqrtf(static_cast<float>(hd));
  for (int d = 0; d < HD; d++) {
    const bool valid = i < T_ && d < hd;
    qT[d * kRows + tid] = valid ? to_float(qkv[(head.batch + i) * head.row_stride + head.q + d]) : 0.0f;
    doT[d * kRows + tid] = valid ? to_float(dout[(head.batch + i) * static_cast<size_t>(C) + head.q + d]) : 0.0f;
  }
  const float row_lse = i < T_ ? lse[static_cast<size_t>(bh) * T_ + i] : 0.0f;
  const float row_delta = i < T_ ? delta[static_cast<size_t>(bh) * T_ + i] : 0.0f;
  float dq[HD];
#pragma unroll
  for (int d = 0; d < HD; d++) dq[d] = 0.0f;
  const int last_row = min(static_cast<int>(blockIdx.x) * kRows + kRows, T_) - 1;
  for (int kt = 0; kt <= last_row; kt += kTile) {
    __syncthreads();
    load_tile<HD>(ks, qkv, head, head.k, kt, kTile, T_, hd);
    load_tile<HD>(vs, qkv, head, head.v, kt, kTile, T_, hd);
    __syncthreads();
    if (i >= T_) continue;
    for (int j = 0; j < kTile && kt + j <= i; j++) {
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int d = 0; d < HD; d++) {
        s += qT[d * kRows + tid] * ks[j * HD + d];
        dp += doT[d * kRows + tid] * vs[j * HD + d];
      }
      const float p = __expf(s * scale - row_lse);
      const float ds = p * (dp - row_delta) * scale;
#pragma unroll
      for (int d = 0; d < HD; d++) dq[d] += ds * ks[j * HD + d];
    }
  }
  if (i >= T_) return;
  T* row = dqkv + (head.batch + i) * head.row_stride;
#pragma unroll
  for (int d = 0; d < HD; d++)
    if (d < hd) row[head.q + d] = from_float<T>(dq[d]);
}

template <int HD, typename T>
void forward_with(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH) {
  const dim3 grid(blocks_for(T_, kRows), B * NH);
  flash_forward_kernel<HD, T><<<grid, kRows, 0, compute_stream()>>>(out, lse, qkv, T_, C, NH, C / NH);
  CUDA_CHECK_LAUNCH();
}

template <int HD, typename T>
void backward_with(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta, int B, int T_, int C,
                   int NH) {
  const dim3 grid(blocks_for(T_, kRows), B * NH);
  const size_t kv_shared = (2 * HD * kRows + 2 * kQueryTile * HD + 2 * kQueryTile) * sizeof(float);
  const size_t q_shared = (2 * HD * kRows + 2 * kTile * HD) * sizeof(float);
  CUDA_CHECK(cudaFuncSetAttribute(flash_backward_kv_kernel<HD, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kv_shared)));
  CUDA_CHECK(cudaFuncSetAttribute(flash_backward_q_kernel<HD, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(q_shared)));
  flash_backward_kv_kernel<HD, T><<<grid, kRows, kv_shared, compute_stream()>>>(dqkv, dout, qkv, lse, delta, T_, C, NH,
                                                                                C / NH);
  CUDA_CHECK_LAUNCH();
  flash_backward_q_kernel<HD, T><<<grid, kRows, q_shared, compute_stream()>>>(dqkv, dout, qkv, lse, delta, T_, C, NH,
                                                                              C / NH);
  CUDA_CHECK_LAUNCH();
}

void check_head_dim(int C, int NH) {
  check(C % NH == 0 && C / NH <= 128, "CUDA attention supports head dimensions up to 128, got " +
                                          std::to_string(C / NH));
}

}  // namespace

// One block row per (batch, head): CUDA's grid y is at most 65535.
void check_attention_grid(int B, int NH) {
  check(static_cast<long>(B) * NH <= 65535, "CUDA attention: micro-batch x heads per rank must be <= 65535, got " +
                                                std::to_string(static_cast<long>(B) * NH));
}

namespace {

}  // namespace

bool use_tensor_core_attention(int C, int NH) {
  const char* choice = std::getenv("TRIDENT_CUDA_ATTENTION");
  return tensor_core_attention_supports(C, NH) && (choice == nullptr || std::strcmp(choice, "scalar") != 0);
}

template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH) {
  check_attention_grid(B, NH);
  if constexpr (std::is_same_v<T, bf16>)
    if (use_tensor_core_attention(C, NH)) return tensor_core_attention_forward(out, lse, qkv, B, T_, C, NH);
  check_head_dim(C, NH);
  const int hd = C / NH;
  if (hd <= 32) forward_with<32>(out, lse, qkv, B, T_, C, NH);
  else if (hd <= 64) forward_with<64>(out, lse, qkv, B, T_, C, NH);
  else forward_with<128>(out, lse, qkv, B, T_, C, NH);
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_, int C,
                        int NH, float* scratch) {
  check_attention_grid(B, NH);
  check_head_dim(C, NH);
  const int hd = C / NH;
  const size_t rows = static_cast<size_t>(B) * NH * T_;
  row_dot_kernel<T><<<blocks_for(rows, 256), 256, 0, compute_stream()>>>(scratch, dout, out, B, T_, C, NH, hd);
  CUDA_CHECK_LAUNCH();
  if constexpr (std::is_same_v<T, bf16>)
    if (use_tensor_core_attention(C, NH))
      return tensor_core_attention_backward(dqkv, dout, qkv, lse, scratch, B, T_, C, NH);
  if (hd <= 32) backward_with<32>(dqkv, dout, qkv, lse, scratch, B, T_, C, NH);
  else if (hd <= 64) backward_with<64>(dqkv, dout, qkv, lse, scratch, B, T_, C, NH);
  else backward_with<128>(dqkv, dout, qkv, lse, scratch, B, T_, C, NH);
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int);
template void attention_forward<bf16>(bf16*, float*, const bf16*, int, int, int, int);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int, int, int,
                                        int, float*);
template void attention_backward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, const float*, int, int, int, int,
                                       float*);

}  // namespace trident::kernels::cuda
