// The scalar flash-attention kernels (see attention.cu), as a header so that
// tests/unit/test_scalar_attention.cpp can run the very same code on CPU threads with
// stand-ins for barriers, shuffles and shared memory. The includer provides bf16, float4,
// to_float, from_float<T>, min, max, rsqrtf, __expf, logf, fmaxf, __shfl_xor_sync,
// __forceinline__, AttentionMask (kernels/attention_mask.h) and
// TRIDENT_STATIC_SHARED(type, name, count) (a static shared-memory array, 16-byte
// aligned, the first and only in its kernel: scalar_*_shared<HD>() bytes), and includes
// this inside its namespace.
//
// The operands as kernels/ops.def has them: q in qkv[B, Tq, (NH + 2 NKV) hd] (per row q
// (NH heads) | k (NKV) | v (NKV)), k and v in kv[B, Tk, kv_ld] (key/value head g's k at
// column g hd, v at (NKV + g) hd: qkv's own k, v columns, or another buffer); query head
// h reads key/value head h / (NH / NKV) (grouped-query attention). Masked by positions and
// documents (kernels/attention_mask.h, attention_visible.cuh): each block iterates only
// the tiles its rows may see, each warp computes only those its rows may see, and single
// elements are masked by their row's range. A row that sees no key gets out 0 and
// log-sum-exp -inf. The template HD is the register capacity (32, 64 or 128), hd <= HD
// the real head dimension.
//
// A query (or key) row belongs to kLanes<HD> = HD / 32 adjacent threads of one warp, its
// lanes, each holding 32 of the row's dimensions in registers (a whole row of 128 per
// thread spills). A dot product is summed over the lanes with shuffles, so each lane gets
// the same score and runs the same softmax. The lanes take the row's 4-dimension chunks
// in turn (lane l: chunks l, l + L, ...): a warp reading one shared-memory row reads
// consecutive words, 16 bytes a lane (no bank conflicts). Shuffles need every lane of the
// warp, so a warp skips work only as a whole; its rows past the sequence compute on zeros
// and write nothing.

#include "attention_visible.cuh"

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

// Rows [first, last] (inclusive).
struct RowSpan {
  int first, last;
};

// The rows of this thread's warp that exist (the block's rows start at first_row, the
// sequence has `rows`; first > last when none does).
template <int HD>
__device__ __forceinline__ RowSpan warp_rows(int first_row, int rows) {
  const int first = first_row + static_cast<int>(threadIdx.x) / 32 * kRowsPerWarp<HD>;
  return {first, min(first + kRowsPerWarp<HD>, rows) - 1};
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
// zero-padded (past hd, and rows from `end` on); `sequence` points at the block's row 0 of
// this batch element.
template <int HD, typename T>
__device__ __forceinline__ void load_tile(float* tile, const T* sequence, size_t row_stride, int first, int rows,
                                          int end, int hd) {
  for (int idx = threadIdx.x; idx < rows * HD; idx += kThreads<HD>) {
    const int r = idx / HD, d = idx % HD, row = first + r;
    tile[idx] = row < end && d < hd ? to_float(sequence[row * row_stride + d]) : 0.0f;
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
// and the output in registers; the key/value tiles the block's rows may see stream
// through shared memory with an online softmax.
template <int HD, typename T>
__global__ void flash_forward_kernel(T* out, float* lse, const T* qkv, const T* kv, AttentionMask mask,
                                     AttentionDims dims) {
  constexpr int L = kLanes<HD>;
  static_assert(kLanesFit<HD>, "HD: 32, 64 or 128");
  TRIDENT_STATIC_SHARED(float, tiles, 2 * kTile * HD);
  float* ks = tiles;               // [kTile][HD]
  float* vs = tiles + kTile * HD;  // [kTile][HD]
  const int Tq = dims.Tq, Tk = dims.Tk, hd = dims.hd;
  const int bh = blockIdx.y, b = bh / dims.NH, h = bh % dims.NH, g = h / dims.group(), lane = threadIdx.x % L;
  const int first_row = blockIdx.x * kRows, i = first_row + threadIdx.x / L;
  const RowSpan warp = warp_rows<HD>(first_row, Tq);
  const IndexRange block_keys = visible_keys(mask, b, Tq, Tk, first_row, min(first_row + kRows, Tq) - 1);
  const IndexRange warp_keys = visible_keys(mask, b, Tq, Tk, warp.first, warp.last);
  const IndexRange row_keys = visible_keys(mask, b, Tq, Tk, i, i < Tq ? i : -1);
  const T* kv_sequence = kv + static_cast<size_t>(b) * Tk * dims.kv_ld;  // this batch element's key rows
  const float scale = rsqrtf(static_cast<float>(hd));
  float q[kLaneDims], o[kLaneDims];
  load_lane<L>(q, i < Tq ? qkv + (static_cast<size_t>(b) * Tq + i) * dims.q_ld() + static_cast<size_t>(h) * hd : nullptr,
               lane, hd, scale);
#pragma unroll
  for (int k = 0; k < kLaneDims; k++) o[k] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int kt = block_keys.begin; kt < block_keys.end; kt += kTile) {
    __syncthreads();
    load_tile<HD>(ks, kv_sequence + static_cast<size_t>(g) * hd, dims.kv_ld, kt, kTile, block_keys.end, hd);
    load_tile<HD>(vs, kv_sequence + static_cast<size_t>(dims.NKV + g) * hd, dims.kv_ld, kt, kTile, block_keys.end, hd);
    if (threadIdx.x == 0) TRIDENT_ATTENTION_COUNT_TILE();
    __syncthreads();
    // Steps of kStep keys over the part of the tile the warp's rows may see, not unrolled:
    // nvcc leaves the float4 loads of a fully unrolled 32-key tile as scalar loads. The
    // whole warp or none of it skips (its rows share shuffles).
    const int warp_begin = max(kt, warp_keys.begin), warp_end = min(kt + kTile, warp_keys.end);
    if (warp_begin >= warp_end) continue;
    if (threadIdx.x % 32 == 0) TRIDENT_ATTENTION_COUNT_WARP_TILE();
#pragma unroll 1
    for (int step = kt + (warp_begin - kt) / kStep * kStep; step < warp_end; step += kStep) {
      const float* k_rows = ks + (step - kt) * HD;
      const float* v_rows = vs + (step - kt) * HD;
      float s[kStep];
      float step_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kStep; j++) {
        const float dot = row_sum<L>(lane_dot<L>(q, k_rows + j * HD, lane));
        s[j] = step + j >= row_keys.begin && step + j < row_keys.end ? dot : -INFINITY;
        step_max = fmaxf(step_max, s[j]);
      }
      // m_new stays -inf while the row has seen no key: exponents from 0 then (all 0).
      const float m_new = fmaxf(m, step_max), m_base = m_new == -INFINITY ? 0.0f : m_new;
      const float correction = __expf(m - m_base);
      l *= correction;
#pragma unroll
      for (int k = 0; k < kLaneDims; k++) o[k] *= correction;
#pragma unroll
      for (int j = 0; j < kStep; j++) {
        const float p = __expf(s[j] - m_base);
        l += p;
        lane_axpy<L>(o, p, v_rows + j * HD, lane);
      }
      m = m_new;
    }
  }
  if (i >= Tq) return;
  // A row that sees no key: out 0, log-sum-exp -inf.
  store_lane<L>(out + (static_cast<size_t>(b) * Tq + i) * dims.out_ld() + static_cast<size_t>(h) * hd, o, lane, hd,
                l > 0.0f ? 1.0f / l : 0.0f);
  if (lane == 0) lse[static_cast<size_t>(bh) * Tq + i] = l > 0.0f ? m + logf(l) : -INFINITY;
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
// scale * sum_i dS_ij q_i over the query rows i that see key j, of every query head of
// the group, in order, into the same registers (so the head's dK, dV are written once, no
// atomics). The query and dO tiles the block's keys may be seen from stream through
// shared memory. P = exp(S - lse) with the rows' final log-sum-exp (never renormalized
// here: a block of keys is a part of the whole).
template <int HD, typename T>
__global__ void flash_backward_kv_kernel(T* dkv, const T* dout, const T* qkv, const T* kv, const float* lse,
                                         const float* delta, AttentionMask mask, AttentionDims dims) {
  constexpr int L = kLanes<HD>;
  static_assert(kLanesFit<HD>, "HD: 32, 64 or 128");
  TRIDENT_STATIC_SHARED(float, tiles, 2 * kQueryTile * HD + 2 * kQueryTile);
  float* qs = tiles;                     // [kQueryTile][HD]
  float* dos = qs + kQueryTile * HD;     // [kQueryTile][HD]
  float* lse_s = dos + kQueryTile * HD;  // [kQueryTile]
  float* delta_s = lse_s + kQueryTile;   // [kQueryTile]
  const int Tq = dims.Tq, Tk = dims.Tk, hd = dims.hd, NH = dims.NH;
  const int b = blockIdx.y / dims.NKV, g = blockIdx.y % dims.NKV, group = dims.group(), lane = threadIdx.x % L;
  const size_t q_ld = dims.q_ld(), out_ld = dims.out_ld();
  const int first_key = blockIdx.x * kRows, j = first_key + threadIdx.x / L;
  const RowSpan warp = warp_rows<HD>(first_key, Tk);
  const IndexRange block_queries = seeing_queries(mask, b, Tq, first_key, min(first_key + kRows, Tk) - 1);
  const IndexRange warp_queries = seeing_queries(mask, b, Tq, warp.first, warp.last);
  const IndexRange key_queries = seeing_queries(mask, b, Tq, j, j < Tk ? j : -1);
  const float scale = rsqrtf(static_cast<float>(hd));
  const T* q_sequence = qkv + static_cast<size_t>(b) * Tq * q_ld;  // this batch element's qkv rows
  const T* dout_sequence = dout + static_cast<size_t>(b) * Tq * out_ld;
  const size_t k_col = static_cast<size_t>(g) * hd, v_col = static_cast<size_t>(dims.NKV + g) * hd;
  float k[kLaneDims], v[kLaneDims], dk[kLaneDims], dv[kLaneDims];
  const T* key_row = j < Tk ? kv + (static_cast<size_t>(b) * Tk + j) * dims.kv_ld : nullptr;
  load_lane<L>(k, key_row ? key_row + k_col : nullptr, lane, hd);
  load_lane<L>(v, key_row ? key_row + v_col : nullptr, lane, hd);
#pragma unroll
  for (int c = 0; c < kLaneDims; c++) dk[c] = dv[c] = 0.0f;
  for (int hg = 0; hg < group; hg++) {
    const int h = g * group + hg;
    const size_t q_col = static_cast<size_t>(h) * hd, bh = static_cast<size_t>(b) * NH + h;
    for (int qt = block_queries.begin; qt < block_queries.end; qt += kQueryTile) {
      __syncthreads();
      load_tile<HD>(qs, q_sequence + q_col, q_ld, qt, kQueryTile, block_queries.end, hd);
      load_tile<HD>(dos, dout_sequence + q_col, out_ld, qt, kQueryTile, block_queries.end, hd);
      if (threadIdx.x < kQueryTile) {
        const int i = qt + threadIdx.x;
        lse_s[threadIdx.x] = i < block_queries.end ? lse[bh * Tq + i] : 0.0f;
        delta_s[threadIdx.x] = i < block_queries.end ? delta[bh * Tq + i] : 0.0f;
      }
      if (threadIdx.x == 0) TRIDENT_ATTENTION_COUNT_TILE();
      __syncthreads();
      const int r0 = max(warp_queries.begin - qt, 0), r1 = min(kQueryTile, warp_queries.end - qt);
      if (r0 < r1 && threadIdx.x % 32 == 0) TRIDENT_ATTENTION_COUNT_WARP_TILE();
      for (int r = r0; r < r1; r++) {  // the same for the whole warp
        const int i = qt + r;
        const float s = row_sum<L>(lane_dot<L>(k, qs + r * HD, lane));
        const float dp = row_sum<L>(lane_dot<L>(v, dos + r * HD, lane));
        const float p = i >= key_queries.begin && i < key_queries.end ? __expf(s * scale - lse_s[r]) : 0.0f;
        const float ds = p * (dp - delta_s[r]) * scale;
        lane_axpy<L>(dv, p, dos + r * HD, lane);
        lane_axpy<L>(dk, ds, qs + r * HD, lane);
      }
    }
  }
  if (j >= Tk) return;
  T* row = dkv + (static_cast<size_t>(b) * Tk + j) * dims.kv_ld;
  store_lane<L>(row + k_col, dk, lane, hd);
  store_lane<L>(row + v_col, dv, lane, hd);
}

// Grid (query blocks, B * NH), kThreads<HD> threads: query rows i, their lanes holding
// q_i, dO_i and dQ_i in registers: dQ_i = scale * sum_j dS_ij k_j over the keys j the row
// sees, of the query head's key/value head, whose tiles stream through shared memory.
template <int HD, typename T>
__global__ void flash_backward_q_kernel(T* dqkv, const T* dout, const T* qkv, const T* kv, const float* lse,
                                        const float* delta, AttentionMask mask, AttentionDims dims) {
  constexpr int L = kLanes<HD>;
  static_assert(kLanesFit<HD>, "HD: 32, 64 or 128");
  TRIDENT_STATIC_SHARED(float, tiles, 2 * kTile * HD);
  float* ks = tiles;               // [kTile][HD]
  float* vs = tiles + kTile * HD;  // [kTile][HD]
  const int Tq = dims.Tq, Tk = dims.Tk, hd = dims.hd;
  const int bh = blockIdx.y, b = bh / dims.NH, h = bh % dims.NH, g = h / dims.group(), lane = threadIdx.x % L;
  const size_t q_ld = dims.q_ld(), out_ld = dims.out_ld();
  const int first_row = blockIdx.x * kRows, i = first_row + threadIdx.x / L;
  const RowSpan warp = warp_rows<HD>(first_row, Tq);
  const IndexRange block_keys = visible_keys(mask, b, Tq, Tk, first_row, min(first_row + kRows, Tq) - 1);
  const IndexRange warp_keys = visible_keys(mask, b, Tq, Tk, warp.first, warp.last);
  const IndexRange row_keys = visible_keys(mask, b, Tq, Tk, i, i < Tq ? i : -1);
  const T* kv_sequence = kv + static_cast<size_t>(b) * Tk * dims.kv_ld;
  const float scale = rsqrtf(static_cast<float>(hd));
  const size_t q_row = static_cast<size_t>(b) * Tq + i;
  float q[kLaneDims], dO[kLaneDims], dq[kLaneDims];
  load_lane<L>(q, i < Tq ? qkv + q_row * q_ld + static_cast<size_t>(h) * hd : nullptr, lane, hd);
  load_lane<L>(dO, i < Tq ? dout + q_row * out_ld + static_cast<size_t>(h) * hd : nullptr, lane, hd);
#pragma unroll
  for (int c = 0; c < kLaneDims; c++) dq[c] = 0.0f;
  const float row_lse = i < Tq ? lse[static_cast<size_t>(bh) * Tq + i] : 0.0f;
  const float row_delta = i < Tq ? delta[static_cast<size_t>(bh) * Tq + i] : 0.0f;
  for (int kt = block_keys.begin; kt < block_keys.end; kt += kTile) {
    __syncthreads();
    load_tile<HD>(ks, kv_sequence + static_cast<size_t>(g) * hd, dims.kv_ld, kt, kTile, block_keys.end, hd);
    load_tile<HD>(vs, kv_sequence + static_cast<size_t>(dims.NKV + g) * hd, dims.kv_ld, kt, kTile, block_keys.end, hd);
    if (threadIdx.x == 0) TRIDENT_ATTENTION_COUNT_TILE();
    __syncthreads();
    // The keys of the tile the warp's rows may see: the same for the whole warp.
    const int j0 = max(warp_keys.begin - kt, 0), j1 = min(kTile, warp_keys.end - kt);
    if (j0 < j1 && threadIdx.x % 32 == 0) TRIDENT_ATTENTION_COUNT_WARP_TILE();
    for (int j = j0; j < j1; j++) {
      const float s = row_sum<L>(lane_dot<L>(q, ks + j * HD, lane));
      const float dp = row_sum<L>(lane_dot<L>(dO, vs + j * HD, lane));
      const bool visible = kt + j >= row_keys.begin && kt + j < row_keys.end;
      const float p = visible ? __expf(s * scale - row_lse) : 0.0f;
      const float ds = p * (dp - row_delta) * scale;
      lane_axpy<L>(dq, ds, ks + j * HD, lane);
    }
  }
  if (i >= Tq) return;
  store_lane<L>(dqkv + q_row * q_ld + static_cast<size_t>(h) * hd, dq, lane, hd);
}
