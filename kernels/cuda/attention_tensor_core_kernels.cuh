// The tensor-core flash-attention kernels (see attention_tensor_core.cu), as a header so
// that tests/unit/test_tensor_core_attention.cpp can run the very same code on CPU
// threads with stand-ins for WMMA, warps and barriers. The includer provides bf16,
// nvcuda::wmma and TRIDENT_DYNAMIC_SHARED(name) (a dynamic shared-memory array), and
// includes this inside its namespace.
//
// A block is 4 warps over 64 rows, each warp owning 16; tiles of 64 keys (or queries)
// stream through shared memory. Rows of bf16 tiles are padded by 8 elements and rows of
// fp32 tiles by 4, which keeps every 16 x 16 fragment 32-byte aligned (WMMA's rule) and
// spreads rows over the shared-memory banks.
//
// qkv[B, T, (NH + 2 NKV) HD]: per row q (NH heads) | k (NKV) | v (NKV); query head h
// reads key/value head h / (NH / NKV) (grouped-query attention); out and dout rows are
// NH * HD wide.

constexpr int kRows = 64;      // rows per block and per tile
constexpr int kWarps = 4;      // 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kLdS = kRows + 4;  // fp32 [16][64] score tiles
constexpr int kLdP = kRows + 8;  // bf16 [16][64] probability tiles

using namespace nvcuda;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // a transposed operand
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int HD>
struct Tiles {
  static constexpr int kLd = HD + 8;   // bf16 [64][HD] tiles
  static constexpr int kLdO = HD + 4;  // fp32 [16][HD] per-warp tiles
  static constexpr size_t tile_bytes = size_t(kRows) * kLd * sizeof(bf16);
  static constexpr size_t scores_bytes = size_t(16) * kLdS * sizeof(float);  // per warp
  static constexpr size_t probs_bytes = size_t(16) * kLdP * sizeof(bf16);    // per warp
  static constexpr size_t out_bytes = size_t(16) * kLdO * sizeof(float);     // per warp
  // The backward kernels stage their output through two adjacent score tiles.
  static_assert(out_bytes <= 2 * scores_bytes, "the output stage does not fit");
};

// Where one query head and its key/value head sit in a qkv row.
template <int HD>
struct HeadColumns {
  size_t stride;      // (NH + 2 NKV) HD: one qkv row
  size_t out_stride;  // NH HD: one row of out / dout
  size_t q, k, v;     // column offsets of head h's q and of its key/value head's k, v
};
template <int HD>
__device__ HeadColumns<HD> head_columns(int h, int NH, int NKV) {
  const int kv = h / (NH / NKV);
  return {static_cast<size_t>(NH + 2 * NKV) * HD, static_cast<size_t>(NH) * HD, static_cast<size_t>(h) * HD,
          static_cast<size_t>(NH + kv) * HD, static_cast<size_t>(NH + NKV + kv) * HD};
}

// Rows [first, first + 64) of one head's column block (q, k or v; or dO) into a bf16
// tile, zeros past the sequence. 16-byte loads: hd and the row stride are multiples of 8.
template <int HD>
__device__ void load_rows(bf16* tile, const bf16* base, size_t row_stride, size_t column, size_t batch_row, int first,
                          int T_) {
  constexpr int chunks = kRows * HD / 8;
  for (int idx = threadIdx.x; idx < chunks; idx += kThreads) {
    const int r = idx / (HD / 8), c = (idx % (HD / 8)) * 8, row = first + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < T_) v = *reinterpret_cast<const uint4*>(base + (batch_row + row) * row_stride + column + c);
    *reinterpret_cast<uint4*>(tile + r * Tiles<HD>::kLd + c) = v;
  }
}

// C[16][64] (fp32, ld kLdS) = A[16][HD] (rows of a tile) x B[64][HD]^T (a tile).
template <int HD>
__device__ void scores(float* out, const bf16* a, const bf16* b) {
  constexpr int ld = Tiles<HD>::kLd;
  FragA fa[HD / 16];  // the 16 rows of A, loaded once for the 4 column blocks
  for (int k = 0; k < HD / 16; k++) wmma::load_matrix_sync(fa[k], a + k * 16, ld);
  for (int n = 0; n < kRows / 16; n++) {
    FragC c;
    wmma::fill_fragment(c, 0.0f);
    for (int k = 0; k < HD / 16; k++) {
      FragBt fb;
      wmma::load_matrix_sync(fb, b + n * 16 * ld + k * 16, ld);
      wmma::mma_sync(c, fa[k], fb, c);
    }
    wmma::store_matrix_sync(out + n * 16, c, kLdS, wmma::mem_row_major);
  }
}

// acc[n] += P[16][64] (bf16, ld kLdP) x B[64][HD] (a tile), n over HD/16 column blocks.
template <int HD>
__device__ void accumulate(FragC (&acc)[HD / 16], const bf16* p, const bf16* b) {
  constexpr int ld = Tiles<HD>::kLd;
  for (int k = 0; k < kRows / 16; k++) {
    FragA fa;
    wmma::load_matrix_sync(fa, p + k * 16, kLdP);
    for (int n = 0; n < HD / 16; n++) {
      FragB fb;
      wmma::load_matrix_sync(fb, b + k * 16 * ld + n * 16, ld);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes a warp's 16 x hd accumulators as bf16 rows of dqkv/out (through shared `stage`).
template <int HD>
__device__ void store_rows(bf16* dst, size_t row_stride, size_t column, size_t batch_row, int first, int T_,
                           FragC (&acc)[HD / 16], float* stage) {
  constexpr int ldo = Tiles<HD>::kLdO;
  for (int n = 0; n < HD / 16; n++) wmma::store_matrix_sync(stage + n * 16, acc[n], ldo, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int idx = lane; idx < 16 * HD; idx += 32) {
    const int r = idx / HD, d = idx % HD;
    if (first + r < T_) dst[(batch_row + first + r) * row_stride + column + d] = __float2bfloat16_rn(stage[r * ldo + d]);
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads) tc_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T_, int NH,
                                                              int NKV) {
  using L = Tiles<HD>;
  TRIDENT_DYNAMIC_SHARED(smem);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem + L::tile_bytes);
  bf16* vs = reinterpret_cast<bf16*>(smem + 2 * L::tile_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* mine = smem + 3 * L::tile_bytes + warp * (L::scores_bytes + L::probs_bytes + L::out_bytes);
  float* ss = reinterpret_cast<float*>(mine);
  bf16* ps = reinterpret_cast<bf16*>(mine + L::scores_bytes);
  float* os = reinterpret_cast<float*>(mine + L::scores_bytes + L::probs_bytes);

  // The last query rows have the most keys: their blocks start first.
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, q0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const HeadColumns<HD> col = head_columns<HD>(h, NH, NKV);
  const size_t stride = col.stride, batch_row = static_cast<size_t>(b) * T_;
  const size_t q_col = col.q, k_col = col.k, v_col = col.v;
  const float scale = rsqrtf(static_cast<float>(HD));
  load_rows<HD>(qs, qkv, stride, q_col, batch_row, q0, T_);
  for (int i = lane; i < 16 * L::kLdO; i += 32) os[i] = 0.0f;
  // Lanes 2r and 2r+1 share the warp's row r, alternate columns each (fewer bank conflicts).
  const int r = lane / 2, side = lane % 2, qi = q0 + warp * 16 + r;
  float m = -INFINITY, l = 0.0f;
  for (int kt = 0; kt <= q0; kt += kRows) {  // every tile holds a key <= each of the block's rows
    __syncthreads();
    load_rows<HD>(ks, qkv, stride, k_col, batch_row, kt, T_);
    load_rows<HD>(vs, qkv, stride, v_col, batch_row, kt, T_);
    __syncthreads();
    scores<HD>(ss, qs + warp * 16 * L::kLd, ks);
    __syncwarp();
    float* srow = ss + r * kLdS;
    float tile_max = -INFINITY;
    for (int c = side; c < kRows; c += 2) {
      const float s = kt + c <= qi ? srow[c] * scale : -INFINITY;
      srow[c] = s;
      tile_max = fmaxf(tile_max, s);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max), correction = __expf(m - m_new);
    float sum = 0.0f;
    for (int c = side; c < kRows; c += 2) {
      const float p = __expf(srow[c] - m_new);
      ps[r * kLdP + c] = __float2bfloat16_rn(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * correction + sum;
    m = m_new;
    for (int d = side; d < HD; d += 2) os[r * L::kLdO + d] *= correction;
    __syncwarp();
    FragC acc[HD / 16];
    for (int n = 0; n < HD / 16; n++) wmma::load_matrix_sync(acc[n], os + n * 16, L::kLdO, wmma::mem_row_major);
    accumulate<HD>(acc, ps, vs);
    for (int n = 0; n < HD / 16; n++) wmma::store_matrix_sync(os + n * 16, acc[n], L::kLdO, wmma::mem_row_major);
    __syncwarp();
  }
  if (qi >= T_) return;
  const float inv_l = 1.0f / l;
  bf16* o_row = out + (batch_row + qi) * col.out_stride + q_col;
  for (int d = side; d < HD; d += 2) o_row[d] = __float2bfloat16_rn(os[r * L::kLdO + d] * inv_l);
  if (side == 0) lse[static_cast<size_t>(bh) * T_ + qi] = m + logf(l);
}

// dK, dV of 64 key rows of one key/value head (grid y: B * NKV): for each query head of
// its group in turn, over the query tiles at and after them,
// P^T = exp(scale K Q^T - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta) scale,
// dK += dS^T Q, into the same accumulators: the head's dK, dV are written once.
template <int HD>
__global__ void __launch_bounds__(kThreads) tc_backward_kv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                                  const float* lse, const float* delta, int T_, int NH,
                                                                  int NKV) {
  using L = Tiles<HD>;
  TRIDENT_DYNAMIC_SHARED(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = reinterpret_cast<bf16*>(smem + L::tile_bytes);
  bf16* qs = reinterpret_cast<bf16*>(smem + 2 * L::tile_bytes);
  bf16* dos = reinterpret_cast<bf16*>(smem + 3 * L::tile_bytes);
  float* lse_s = reinterpret_cast<float*>(smem + 4 * L::tile_bytes);
  float* delta_s = lse_s + kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* mine = smem + 4 * L::tile_bytes + 2 * kRows * sizeof(float) +
                        warp * (2 * L::scores_bytes + 2 * L::probs_bytes);
  float* pt = reinterpret_cast<float*>(mine);                      // P^T, fp32
  float* dpt = reinterpret_cast<float*>(mine + L::scores_bytes);  // dP^T
  bf16* pt16 = reinterpret_cast<bf16*>(mine + 2 * L::scores_bytes);
  bf16* dst16 = reinterpret_cast<bf16*>(mine + 2 * L::scores_bytes + L::probs_bytes);

  const int b = blockIdx.y / NKV, kv = blockIdx.y % NKV, group = NH / NKV, k0 = blockIdx.x * kRows;
  const HeadColumns<HD> first_col = head_columns<HD>(kv * group, NH, NKV);  // k, v: the group's shared head
  const size_t stride = first_col.stride, batch_row = static_cast<size_t>(b) * T_;
  const size_t k_col = first_col.k, v_col = first_col.v;
  const float scale = rsqrtf(static_cast<float>(HD));
  load_rows<HD>(ks, qkv, stride, k_col, batch_row, k0, T_);
  load_rows<HD>(vs, qkv, stride, v_col, batch_row, k0, T_);
  FragC dk[HD / 16], dv[HD / 16];
  for (int n = 0; n < HD / 16; n++) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  const int r = lane / 2, side = lane % 2, kj = k0 + warp * 16 + r;
  for (int g = 0; g < group; g++) {
    const int h = kv * group + g;
    const size_t q_col = static_cast<size_t>(h) * HD, bh = static_cast<size_t>(b) * NH + h;
    for (int qt = k0; qt < T_; qt += kRows) {  // earlier queries see none of these keys
      __syncthreads();
      load_rows<HD>(qs, qkv, stride, q_col, batch_row, qt, T_);
      load_rows<HD>(dos, dout, first_col.out_stride, q_col, batch_row, qt, T_);
      for (int i = threadIdx.x; i < kRows; i += kThreads) {
        const bool valid = qt + i < T_;
        lse_s[i] = valid ? lse[bh * T_ + qt + i] : 0.0f;
        delta_s[i] = valid ? delta[bh * T_ + qt + i] : 0.0f;
      }
      __syncthreads();
      scores<HD>(pt, ks + warp * 16 * L::kLd, qs);   // S^T = K Q^T
      scores<HD>(dpt, vs + warp * 16 * L::kLd, dos);  // dP^T = V dO^T
      __syncwarp();
      for (int c = side; c < kRows; c += 2) {
        const int qi = qt + c;
        const float p = qi >= kj && qi < T_ ? __expf(pt[r * kLdS + c] * scale - lse_s[c]) : 0.0f;
        pt16[r * kLdP + c] = __float2bfloat16_rn(p);
        dst16[r * kLdP + c] = __float2bfloat16_rn(p * (dpt[r * kLdS + c] - delta_s[c]) * scale);
      }
      __syncwarp();
      accumulate<HD>(dv, pt16, dos);
      accumulate<HD>(dk, dst16, qs);
    }
  }
  __syncwarp();
  const int first = k0 + warp * 16;
  store_rows<HD>(dqkv, stride, k_col, batch_row, first, T_, dk, pt);  // pt + dpt hold 16 x (HD + 4) floats
  __syncwarp();
  store_rows<HD>(dqkv, stride, v_col, batch_row, first, T_, dv, pt);
}

// dQ of 64 query rows: over the key tiles up to them, P = exp(scale Q K^T - lse),
// dP = dO V^T, dS = P (dP - delta) scale, dQ += dS K.
template <int HD>
__global__ void __launch_bounds__(kThreads) tc_backward_q_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                                 const float* lse, const float* delta, int T_, int NH,
                                                                 int NKV) {
  using L = Tiles<HD>;
  TRIDENT_DYNAMIC_SHARED(smem);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = reinterpret_cast<bf16*>(smem + L::tile_bytes);
  bf16* ks = reinterpret_cast<bf16*>(smem + 2 * L::tile_bytes);
  bf16* vs = reinterpret_cast<bf16*>(smem + 3 * L::tile_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* mine = smem + 4 * L::tile_bytes + warp * (2 * L::scores_bytes + L::probs_bytes);
  float* st = reinterpret_cast<float*>(mine);
  float* dpt = reinterpret_cast<float*>(mine + L::scores_bytes);
  bf16* ds16 = reinterpret_cast<bf16*>(mine + 2 * L::scores_bytes);

  // The last query rows have the most keys: their blocks start first.
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, q0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const HeadColumns<HD> col = head_columns<HD>(h, NH, NKV);
  const size_t stride = col.stride, batch_row = static_cast<size_t>(b) * T_;
  const size_t q_col = col.q, k_col = col.k, v_col = col.v;
  const float scale = rsqrtf(static_cast<float>(HD));
  load_rows<HD>(qs, qkv, stride, q_col, batch_row, q0, T_);
  load_rows<HD>(dos, dout, col.out_stride, q_col, batch_row, q0, T_);
  const int r = lane / 2, side = lane % 2, qi = q0 + warp * 16 + r;
  const float row_lse = qi < T_ ? lse[static_cast<size_t>(bh) * T_ + qi] : 0.0f;
  const float row_delta = qi < T_ ? delta[static_cast<size_t>(bh) * T_ + qi] : 0.0f;
  FragC dq[HD / 16];
  for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
  for (int kt = 0; kt <= q0; kt += kRows) {
    __syncthreads();
    load_rows<HD>(ks, qkv, stride, k_col, batch_row, kt, T_);
    load_rows<HD>(vs, qkv, stride, v_col, batch_row, kt, T_);
    __syncthreads();
    scores<HD>(st, qs + warp * 16 * L::kLd, ks);    // S = Q K^T
    scores<HD>(dpt, dos + warp * 16 * L::kLd, vs);  // dP = dO V^T
    __syncwarp();
    for (int c = side; c < kRows; c += 2) {
      const float p = kt + c <= qi && qi < T_ ? __expf(st[r * kLdS + c] * scale - row_lse) : 0.0f;
      ds16[r * kLdP + c] = __float2bfloat16_rn(p * (dpt[r * kLdS + c] - row_delta) * scale);
    }
    __syncwarp();
    accumulate<HD>(dq, ds16, ks);
  }
  __syncwarp();
  store_rows<HD>(dqkv, stride, q_col, batch_row, q0 + warp * 16, T_, dq, st);
}

template <int HD>
size_t forward_shared() {
  using L = Tiles<HD>;
  return 3 * L::tile_bytes + kWarps * (L::scores_bytes + L::probs_bytes + L::out_bytes);
}
template <int HD>
size_t backward_kv_shared() {
  using L = Tiles<HD>;
  return 4 * L::tile_bytes + 2 * kRows * sizeof(float) + kWarps * (2 * L::scores_bytes + 2 * L::probs_bytes);
}
template <int HD>
size_t backward_q_shared() {
  using L = Tiles<HD>;
  return 4 * L::tile_bytes + kWarps * (2 * L::scores_bytes + L::probs_bytes);
}

