// The scalar flash-attention kernels (see attention.cu), as a header so that
// tests/unit/test_scalar_attention.cpp can run the very same code on CPU threads with
// stand-ins for barriers and shared memory. The includer provides bf16, to_float,
// from_float<T>, min, rsqrtf, __expf, logf, fmaxf, __forceinline__,
// TRIDENT_DYNAMIC_SHARED(name) (a dynamic shared-memory array of bytes) and
// TRIDENT_STATIC_SHARED(type, name, count) (a static one, the first and only in its
// kernel: scalar_forward_shared() bytes), and includes this inside its namespace.
//
// qkv[B, T, (NH + 2 NKV) hd]: per row q (NH heads) | k (NKV) | v (NKV); query head h
// reads key/value head h / (NH / NKV) (grouped-query attention). The template HD is
// the register capacity (32, 64 or 128), hd <= HD the real head dimension.

constexpr int kRows = 64;      // query rows (or key rows) per block: one per thread
constexpr int kTile = 32;      // keys per shared-memory tile in the forward and dQ kernels
constexpr int kQueryTile = 16; // query rows per shared-memory tile in the dK/dV kernel

struct Head {
  size_t row_stride;  // (NH + 2 NKV) hd: one qkv row
  size_t q, k, v;     // column offsets of query head h's q and of its key/value head's k, v
  size_t batch;       // first row of this batch element
};

__device__ __forceinline__ Head head_of(int b, int h, int T, int NH, int NKV, int hd) {
  const int kv = h / (NH / NKV);
  return {static_cast<size_t>(NH + 2 * NKV) * hd, static_cast<size_t>(h) * hd, static_cast<size_t>(NH + kv) * hd,
          static_cast<size_t>(NH + NKV + kv) * hd, static_cast<size_t>(b) * T};
}

// rows [first, first + rows) of one head's column block into shared [rows][HD], zero-padded.
template <int HD, typename T>
__device__ __forceinline__ void load_tile(float* tile, const T* base, size_t row_stride, size_t column,
                                          size_t batch_row, int first, int rows, int T_, int hd) {
  for (int idx = threadIdx.x; idx < rows * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD, row = first + r;
    tile[idx] = row < T_ && d < hd ? to_float(base[(batch_row + row) * row_stride + column + d]) : 0.0f;
  }
}

template <int HD>
size_t scalar_forward_shared() {
  return 2 * kTile * HD * sizeof(float);
}
template <int HD>
size_t scalar_backward_kv_shared() {
  return (2 * HD * kRows + 2 * kQueryTile * HD + 2 * kQueryTile) * sizeof(float);
}
template <int HD>
size_t scalar_backward_q_shared() {
  return (2 * HD * kRows + 2 * kTile * HD) * sizeof(float);
}

// Grid (query blocks, B * NH): one thread per query row, key/value tiles stream through
// shared memory with an online softmax.
template <int HD, typename T>
__global__ void __launch_bounds__(kRows) flash_forward_kernel(T* out, float* lse, const T* qkv, int T_, int NH,
                                                               int NKV, int hd) {
  TRIDENT_STATIC_SHARED(float, tiles, 2 * kTile * HD);  // under 48 KB: a static array (better code than dynamic)
  float* ks = tiles;                 // [kTile][HD]
  float* vs = tiles + kTile * HD;    // [kTile][HD]
  const int bh = blockIdx.y;
  const Head head = head_of(bh / NH, bh % NH, T_, NH, NKV, hd);
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
    load_tile<HD>(ks, qkv, head.row_stride, head.k, head.batch, kt, kTile, T_, hd);
    load_tile<HD>(vs, qkv, head.row_stride, head.v, head.batch, kt, kTile, T_, hd);
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
  T* o_row = out + (head.batch + i) * (static_cast<size_t>(NH) * hd) + head.q;  // out rows: NH * hd
#pragma unroll
  for (int d = 0; d < HD; d++)
    if (d < hd) o_row[d] = from_float<T>(o[d] * inv_l);
  lse[static_cast<size_t>(bh) * T_ + i] = m + logf(l);
}

// delta[bh, i] = dO_i . O_i, the softmax backward's row term (out and dout rows: NH * hd).
template <typename T>
__global__ void row_dot_kernel(float* delta, const T* dout, const T* out, int B, int T_, int NH, int hd) {
  const size_t idx = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<size_t>(B) * NH * T_) return;
  const int i = static_cast<int>(idx % T_), bh = static_cast<int>(idx / T_), b = bh / NH, h = bh % NH;
  const size_t base = (static_cast<size_t>(b) * T_ + i) * NH * hd + static_cast<size_t>(h) * hd;
  float sum = 0.0f;
  for (int d = 0; d < hd; d++) sum += to_float(dout[base + d]) * to_float(out[base + d]);
  delta[idx] = sum;
}

// Grid (key blocks, B * NKV): one thread per key row j of one key/value head: dV_j =
// sum_i P_ij dO_i, dK_j = scale * sum_i dS_ij q_i over the query rows i >= j of every
// query head of the group, in order, into the same registers (so the head's dK, dV are
// written once, no atomics). k_j and v_j sit transposed in shared memory ([HD][kRows]:
// each thread reads its own column, no bank conflicts).
template <int HD, typename T>
__global__ void __launch_bounds__(kRows) flash_backward_kv_kernel(T* dqkv, const T* dout, const T* qkv,
                                                                   const float* lse, const float* delta, int T_, int NH,
                                                                   int NKV, int hd) {
  TRIDENT_DYNAMIC_SHARED(smem);
  float* kT = reinterpret_cast<float*>(smem);  // [HD][kRows]
  float* vT = kT + HD * kRows;                 // [HD][kRows]
  float* qs = vT + HD * kRows;                 // [kQueryTile][HD]
  float* dos = qs + kQueryTile * HD;           // [kQueryTile][HD]
  float* lse_s = dos + kQueryTile * HD;        // [kQueryTile]
  float* delta_s = lse_s + kQueryTile;         // [kQueryTile]
  const int b = blockIdx.y / NKV, kv = blockIdx.y % NKV, group = NH / NKV, tid = threadIdx.x;
  const Head head = head_of(b, kv * group, T_, NH, NKV, hd);  // k, v: the group's shared head
  const size_t out_stride = static_cast<size_t>(NH) * hd;     // dO rows
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
  for (int g = 0; g < group; g++) {
    const int h = kv * group + g;
    const size_t q_col = static_cast<size_t>(h) * hd, bh = static_cast<size_t>(b) * NH + h;
    for (int qt = first_key / kQueryTile * kQueryTile; qt < T_; qt += kQueryTile) {
      __syncthreads();
      load_tile<HD>(qs, qkv, head.row_stride, q_col, head.batch, qt, kQueryTile, T_, hd);
      load_tile<HD>(dos, dout, out_stride, q_col, head.batch, qt, kQueryTile, T_, hd);
      if (tid < kQueryTile) {
        const int i = qt + tid;
        lse_s[tid] = i < T_ ? lse[bh * T_ + i] : 0.0f;
        delta_s[tid] = i < T_ ? delta[bh * T_ + i] : 0.0f;
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

// Grid (query blocks, B * NH): one thread per query row i: dQ_i = scale * sum_{j <= i}
// dS_ij k_j, from the query head's key/value head. q_i and dO_i sit transposed in shared
// memory, key/value tiles stream through it.
template <int HD, typename T>
__global__ void __launch_bounds__(kRows) flash_backward_q_kernel(T* dqkv, const T* dout, const T* qkv,
                                                                  const float* lse, const float* delta, int T_, int NH,
                                                                  int NKV, int hd) {
  TRIDENT_DYNAMIC_SHARED(smem);
  float* qT = reinterpret_cast<float*>(smem);  // [HD][kRows]
  float* doT = qT + HD * kRows;                // [HD][kRows]
  float* ks = doT + HD * kRows;                // [kTile][HD]
  float* vs = ks + kTile * HD;                 // [kTile][HD]
  const int bh = blockIdx.y, tid = threadIdx.x;
  const Head head = head_of(bh / NH, bh % NH, T_, NH, NKV, hd);
  const size_t out_stride = static_cast<size_t>(NH) * hd;
  const int i = blockIdx.x * kRows + tid;
  const float scale = rsqrtf(static_cast<float>(hd));
  for (int d = 0; d < HD; d++) {
    const bool valid = i < T_ && d < hd;
    qT[d * kRows + tid] = valid ? to_float(qkv[(head.batch + i) * head.row_stride + head.q + d]) : 0.0f;
    doT[d * kRows + tid] = valid ? to_float(dout[(head.batch + i) * out_stride + head.q + d]) : 0.0f;
  }
  const float row_lse = i < T_ ? lse[static_cast<size_t>(bh) * T_ + i] : 0.0f;
  const float row_delta = i < T_ ? delta[static_cast<size_t>(bh) * T_ + i] : 0.0f;
  float dq[HD];
#pragma unroll
  for (int d = 0; d < HD; d++) dq[d] = 0.0f;
  const int last_row = min(static_cast<int>(blockIdx.x) * kRows + kRows, T_) - 1;
  for (int kt = 0; kt <= last_row; kt += kTile) {
    __syncthreads();
    load_tile<HD>(ks, qkv, head.row_stride, head.k, head.batch, kt, kTile, T_, hd);
    load_tile<HD>(vs, qkv, head.row_stride, head.v, head.batch, kt, kTile, T_, hd);
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
