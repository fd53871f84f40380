// The scalar flash-attention kernels (see attention.cu), as a header so that
// tests/unit/test_scalar_attention.cpp can run the very same code on CPU threads with
// stand-ins for barriers, shuffles and shared memory. The includer provides bf16, float4,
// to_float, from_float<T>, min, rsqrtf, __expf, logf, fmaxf, __shfl_xor_sync,
// __forceinline__ and TRIDENT_STATIC_SHARED(type, name, count) (a static shared-memory
// array, 16-byte aligned, the first and only in its kernel: scalar_*_shared<HD>() bytes),
// and includes this inside its namespace.
//
// qkv[B, T, (NH + 2 NKV) hd]: per row q (NH heads) | k (NKV) | v (NKV); query head h
// reads key/value head h / (NH / NKV) (grouped-query attention). The template HD is
// the register capacity (32, 64 or 128), hd <= HD the real head dimension.
//
// A query (or key) row belongs to kLanes<HD> = HD / 32 adjacent threads of one warp, its
// lanes, each holding 32 of the row's dimensions in registers (a whole row of 128 per
// thread spills). A dot product is summed over the lanes with shuffles, so each lane gets
// the same score and runs the same softmax. The lanes take the row's 4-dimension chunks
// in turn (lane l: chunks l, l + L, ...): a warp reading one shared-memory row reads
// consecutive words, 16 bytes a lane (no bank conflicts). Shuffles need every lane of the
// warp, so a warp skips work only as a whole; its rows past the sequence compute on zeros
// and write nothing.

constexpr int kRows = 64;       // query rows (or key rows) per block
constexpr int kTile = 32;       // keys per shared-memory tile in the forward and dQ kernels
constexpr int kStep = 16;       // keys per online-softmax step of the forward (see there)
constexpr int kQueryTile = 16;  // query rows per shared-memory tile in the dK/dV kernel
constexpr int kLaneDims = 32;   // dimensions of a row per thread
static_assert(kTile % kStep == 0);
template <int HD>
constexpr int kLanes = HD / kLaneDims;  // threads per row
template <int HD>
constexpr int kThreads = kRows * kLanes<HD>;  // threads per block

// A row's lanes are adjacent threads (row threadIdx.x / L of the block, lane threadIdx.x
// % L), so a warp holds 32 / L adjacent rows.
template <int HD>
constexpr int kRowsPerWarp = 32 / kLanes<HD>;

// A row's lanes lie in one warp, a block is whole warps, and at most 256 threads: the
// kernels have no __launch_bounds__ (with it, ptxas gives HD 128's forward 128 registers,
// for two blocks a multiprocessor, and spills), and 255 registers a thread fit such a block.
template <int HD>
constexpr bool kLanesFit =
    HD % kLaneDims == 0 && 32 % kLanes<HD> == 0 && kRows % kRowsPerWarp<HD> == 0 && kThreads<HD> <= 256;

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

// The last row of this thread's warp that exists (the block's rows start at first_row),
// or -1 if none does.
template <int HD>
__device__ __forceinline__ int warp_last_row(int first_row, int T_) {
  const int warp_row = first_row + static_cast<int>(threadIdx.x) / 32 * kRowsPerWarp<HD>;
  return warp_row < T_ ? min(warp_row + kRowsPerWarp<HD>, T_) - 1 : -1;
}

// Dimension k (< kLaneDims) of a row that lane `lane` of L holds.
template <int L>
__device__ __forceinline__ int lane_dim(int lane, int k) {
  return ((k / 4) * L + lane) * 4 + k % 4;
}

// x = scale * this lane's dimensions of a global row; zeros past hd, or all zeros where
// the row does not exist (row == nullptr).
template <int L, typename T>
__device__ __forceinline__ void load_lane(float (&x)[kLaneDims], const T* row, int lane, int hd, float scale = 1.0f) {
#pragma unroll
  for (int k = 0; k < kLaneDims; k++) {
    const int d = lane_dim<L>(lane, k);
    x[k] = row != nullptr && d < hd ? to_float(row[d]) * scale : 0.0f;
  }
}

template <int L, typename T>
__device__ __forceinline__ void store_lane(T* row, const float (&x)[kLaneDims], int lane, int hd, float scale = 1.0f) {
#pragma unroll
  for (int k = 0; k < kLaneDims; k++) {
    const int d = lane_dim<L>(lane, k);
    if (d < hd) row[d] = from_float<T>(x[k] * scale);
  }
}

// This lane's part of x . row, row a shared-memory row of HD floats; four sums, for four
// independent FMA chains.
template <int L>
__device__ __forceinline__ float lane_dot(const float (&x)[kLaneDims], const float* row, int lane) {
  const float4* chunks = reinterpret_cast<const float4*>(row) + lane;
  float a = 0.0f, b = 0.0f, c = 0.0f, d = 0.0f;
#pragma unroll
  for (int k = 0; k < kLaneDims / 4; k++) {
    const float4 y = chunks[k * L];
    a += x[4 * k] * y.x;
    b += x[4 * k + 1] * y.y;
    c += x[4 * k + 2] * y.z;
    d += x[4 * k + 3] * y.w;
  }
  return (a + b) + (c + d);
}

// x += w * this lane's dimensions of a shared-memory row.
template <int L>
__device__ __forceinline__ void lane_axpy(float (&x)[kLaneDims], float w, const float* row, int lane) {
  const float4* chunks = reinterpret_cast<const float4*>(row) + lane;
#pragma unroll
  for (int k = 0; k < kLaneDims / 4; k++) {
    const float4 y = chunks[k * L];
    x[4 * k] += w * y.x;
    x[4 * k + 1] += w * y.y;
    x[4 * k + 2] += w * y.z;
    x[4 * k + 3] += w * y.w;
  }
}

// The sum of a row's L partial sums, the same bits in each lane (a butterfly: each step
// adds the same two numbers in both lanes, a + b == b + a). Every lane of the warp calls it.
template <int L>
__device__ __forceinline__ float row_sum(float partial) {
#pragma unroll
  for (int offset = L / 2; offset > 0; offset /= 2) partial += __shfl_xor_sync(0xffffffffu, partial, offset);
  return partial;
}

// Rows [first, first + rows) of one head's column block into shared [rows][HD],
// zero-padded; `sequence` points at the block's row 0 of this batch element.
template <int HD, typename T>
__device__ __forceinline__ void load_tile(float* tile, const T* sequence, size_t row_stride, int first, int rows,
                                          int T_, int hd) {
  for (int idx = threadIdx.x; idx < rows * HD; idx += kThreads<HD>) {
    const int r = idx / HD, d = idx % HD, row = first + r;
    tile[idx] = row < T_ && d < hd ? to_float(sequence[row * row_stride + d]) : 0.0f;
  }
}

// Each kernel's static shared memory in bytes (the simulator's launch takes it).
template <int HD>
constexpr size_t scalar_forward_shared() {
  return 2 * kTile * HD * sizeof(float);
}
template <int HD>
constexpr size_t scalar_backward_kv_shared() {
  return (2 * kQueryTile * HD + 2 * kQueryTile) * sizeof(float);
}
template <int HD>
constexpr size_t scalar_backward_q_shared() {
  return 2 * kTile * HD * sizeof(float);
}
// Static shared memory: at most 48 KB a block (HD 128 the largest).
static_assert(scalar_forward_shared<128>() <= 48 * 1024 && scalar_backward_kv_shared<128>() <= 48 * 1024 &&
              scalar_backward_q_shared<128>() <= 48 * 1024);

// Grid (query blocks, B * NH), kThreads<HD> threads: query rows, their lanes holding q
// and the output in registers; key/value tiles stream through shared memory with an
// online softmax.
template <int HD, typename T>
__global__ void flash_forward_kernel(T* out, float* lse, const T* qkv, int T_, int NH, int NKV, int hd) {
  constexpr int L = kLanes<HD>;
  static_assert(kLanesFit<HD>, "HD: 32, 64 or 128");
  TRIDENT_STATIC_SHARED(float, tiles, 2 * kTile * HD);
  float* ks = tiles;               // [kTile][HD]
  float* vs = tiles + kTile * HD;  // [kTile][HD]
  const int bh = blockIdx.y, lane = threadIdx.x % L;
  const Head head = head_of(bh / NH, bh % NH, T_, NH, NKV, hd);
  const int first_row = blockIdx.x * kRows, i = first_row + threadIdx.x / L;
  const int warp_last = warp_last_row<HD>(first_row, T_);
  const T* sequence = qkv + head.batch * head.row_stride;  // this batch element's qkv rows
  const float scale = rsqrtf(static_cast<float>(hd));
  float q[kLaneDims], o[kLaneDims];
  load_lane<L>(q, i < T_ ? sequence + i * head.row_stride + head.q : nullptr, lane, hd, scale);
#pragma unroll
  for (int k = 0; k < kLaneDims; k++) o[k] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int last_row = min(first_row + kRows, T_) - 1;
  for (int kt = 0; kt <= last_row; kt += kTile) {
    __syncthreads();
    load_tile<HD>(ks, sequence + head.k, head.row_stride, kt, kTile, T_, hd);
    load_tile<HD>(vs, sequence + head.v, head.row_stride, kt, kTile, T_, hd);
    __syncthreads();
    // Steps of kStep keys, not unrolled: nvcc leaves the float4 loads of a fully unrolled
    // 32-key tile as scalar loads. Each row sees key 0 in its first step, so m is finite
    // after it. The whole warp or none of it skips (its rows share shuffles).
#pragma unroll 1
    for (int step = kt; step < kt + kTile && step <= warp_last; step += kStep) {
      const float* k_rows = ks + (step - kt) * HD;
      const float* v_rows = vs + (step - kt) * HD;
      float s[kStep];
      float step_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kStep; j++) {
        const float dot = row_sum<L>(lane_dot<L>(q, k_rows + j * HD, lane));
        s[j] = step + j <= i ? dot : -INFINITY;
        step_max = fmaxf(step_max, s[j]);
      }
      const float m_new = fmaxf(m, step_max);
      const float correction = __expf(m - m_new);
      l *= correction;
#pragma unroll
      for (int k = 0; k < kLaneDims; k++) o[k] *= correction;
#pragma unroll
      for (int j = 0; j < kStep; j++) {
        const float p = __expf(s[j] - m_new);
        l += p;
        lane_axpy<L>(o, p, v_rows + j * HD, lane);
      }
      m = m_new;
    }
  }
  if (i >= T_) return;
  // out rows: NH * hd
  store_lane<L>(out + (head.batch + i) * (static_cast<size_t>(NH) * hd) + head.q, o, lane, hd, 1.0f / l);
  if (lane == 0) lse[static_cast<size_t>(bh) * T_ + i] = m + logf(l);
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

// Grid (key blocks, B * NKV), kThreads<HD> threads: key rows j of one key/value head,
// their lanes holding k_j, v_j, dK_j and dV_j in registers: dV_j = sum_i P_ij dO_i, dK_j =
// scale * sum_i dS_ij q_i over the query rows i >= j of every query head of the group, in
// order, into the same registers (so the head's dK, dV are written once, no atomics).
// Query and dO tiles stream through shared memory.
template <int HD, typename T>
__global__ void flash_backward_kv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta,
                                         int T_, int NH, int NKV, int hd) {
  constexpr int L = kLanes<HD>;
  static_assert(kLanesFit<HD>, "HD: 32, 64 or 128");
  TRIDENT_STATIC_SHARED(float, tiles, 2 * kQueryTile * HD + 2 * kQueryTile);
  float* qs = tiles;                     // [kQueryTile][HD]
  float* dos = qs + kQueryTile * HD;     // [kQueryTile][HD]
  float* lse_s = dos + kQueryTile * HD;  // [kQueryTile]
  float* delta_s = lse_s + kQueryTile;   // [kQueryTile]
  const int b = blockIdx.y / NKV, kv = blockIdx.y % NKV, group = NH / NKV, lane = threadIdx.x % L;
  const Head head = head_of(b, kv * group, T_, NH, NKV, hd);  // k, v: the group's shared head
  const size_t out_stride = static_cast<size_t>(NH) * hd;     // dO rows
  const int first_key = blockIdx.x * kRows, j = first_key + threadIdx.x / L;
  // Query rows before the warp's first key see none of its keys.
  const int warp_key = first_key + static_cast<int>(threadIdx.x) / 32 * kRowsPerWarp<HD>;
  const float scale = rsqrtf(static_cast<float>(hd));
  const T* sequence = qkv + head.batch * head.row_stride;  // this batch element's qkv rows
  const T* dout_sequence = dout + head.batch * out_stride;
  float k[kLaneDims], v[kLaneDims], dk[kLaneDims], dv[kLaneDims];
  const T* key_row = j < T_ ? sequence + j * head.row_stride : nullptr;
  load_lane<L>(k, key_row ? key_row + head.k : nullptr, lane, hd);
  load_lane<L>(v, key_row ? key_row + head.v : nullptr, lane, hd);
#pragma unroll
  for (int c = 0; c < kLaneDims; c++) dk[c] = dv[c] = 0.0f;
  for (int g = 0; g < group; g++) {
    const int h = kv * group + g;
    const size_t q_col = static_cast<size_t>(h) * hd, bh = static_cast<size_t>(b) * NH + h;
    for (int qt = first_key / kQueryTile * kQueryTile; qt < T_; qt += kQueryTile) {
      __syncthreads();
      load_tile<HD>(qs, sequence + q_col, head.row_stride, qt, kQueryTile, T_, hd);
      load_tile<HD>(dos, dout_sequence + q_col, out_stride, qt, kQueryTile, T_, hd);
      if (threadIdx.x < kQueryTile) {
        const int i = qt + threadIdx.x;
        lse_s[threadIdx.x] = i < T_ ? lse[bh * T_ + i] : 0.0f;
        delta_s[threadIdx.x] = i < T_ ? delta[bh * T_ + i] : 0.0f;
      }
      __syncthreads();
      const int rows = min(kQueryTile, T_ - qt);
      for (int r = warp_key > qt ? warp_key - qt : 0; r < rows; r++) {  // the same for the whole warp
        const int i = qt + r;
        const float s = row_sum<L>(lane_dot<L>(k, qs + r * HD, lane));
        const float dp = row_sum<L>(lane_dot<L>(v, dos + r * HD, lane));
        const float p = i >= j ? __expf(s * scale - lse_s[r]) : 0.0f;
        const float ds = p * (dp - delta_s[r]) * scale;
        lane_axpy<L>(dv, p, dos + r * HD, lane);
        lane_axpy<L>(dk, ds, qs + r * HD, lane);
      }
    }
  }
  if (j >= T_) return;
  T* row = dqkv + (head.batch + j) * head.row_stride;
  store_lane<L>(row + head.k, dk, lane, hd);
  store_lane<L>(row + head.v, dv, lane, hd);
}

// Grid (query blocks, B * NH), kThreads<HD> threads: query rows i, their lanes holding
// q_i, dO_i and dQ_i in registers: dQ_i = scale * sum_{j <= i} dS_ij k_j, from the query
// head's key/value head, whose tiles stream through shared memory.
template <int HD, typename T>
__global__ void flash_backward_q_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta,
                                        int T_, int NH, int NKV, int hd) {
  constexpr int L = kLanes<HD>;
  static_assert(kLanesFit<HD>, "HD: 32, 64 or 128");
  TRIDENT_STATIC_SHARED(float, tiles, 2 * kTile * HD);
  float* ks = tiles;               // [kTile][HD]
  float* vs = tiles + kTile * HD;  // [kTile][HD]
  const int bh = blockIdx.y, lane = threadIdx.x % L;
  const Head head = head_of(bh / NH, bh % NH, T_, NH, NKV, hd);
  const size_t out_stride = static_cast<size_t>(NH) * hd;
  const int first_row = blockIdx.x * kRows, i = first_row + threadIdx.x / L;
  const int warp_last = warp_last_row<HD>(first_row, T_);
  const T* sequence = qkv + head.batch * head.row_stride;  // this batch element's qkv rows
  const float scale = rsqrtf(static_cast<float>(hd));
  float q[kLaneDims], dO[kLaneDims], dq[kLaneDims];
  load_lane<L>(q, i < T_ ? sequence + i * head.row_stride + head.q : nullptr, lane, hd);
  load_lane<L>(dO, i < T_ ? dout + (head.batch + i) * out_stride + head.q : nullptr, lane, hd);
#pragma unroll
  for (int c = 0; c < kLaneDims; c++) dq[c] = 0.0f;
  const float row_lse = i < T_ ? lse[static_cast<size_t>(bh) * T_ + i] : 0.0f;
  const float row_delta = i < T_ ? delta[static_cast<size_t>(bh) * T_ + i] : 0.0f;
  const int last_row = min(first_row + kRows, T_) - 1;
  for (int kt = 0; kt <= last_row; kt += kTile) {
    __syncthreads();
    load_tile<HD>(ks, sequence + head.k, head.row_stride, kt, kTile, T_, hd);
    load_tile<HD>(vs, sequence + head.v, head.row_stride, kt, kTile, T_, hd);
    __syncthreads();
    const int keys = min(kTile, warp_last - kt + 1);  // the same for the whole warp
    for (int j = 0; j < keys; j++) {
      const float s = row_sum<L>(lane_dot<L>(q, ks + j * HD, lane));
      const float dp = row_sum<L>(lane_dot<L>(dO, vs + j * HD, lane));
      const float p = kt + j <= i ? __expf(s * scale - row_lse) : 0.0f;
      const float ds = p * (dp - row_delta) * scale;
      lane_axpy<L>(dq, ds, ks + j * HD, lane);
    }
  }
  if (i >= T_) return;
  store_lane<L>(dqkv + (head.batch + i) * head.row_stride + head.q, dq, lane, hd);
}
