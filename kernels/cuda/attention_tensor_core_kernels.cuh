// The tensor-core flash-attention kernels (see attention_tensor_core.cu), as a header so
// that tests/unit/test_tensor_core_attention.cpp can run the very same code on CPU
// threads with stand-ins for WMMA, warps and barriers. The includer provides bf16,
// nvcuda::wmma, AttentionMask (kernels/attention_mask.h) and TRIDENT_DYNAMIC_SHARED(name)
// (a dynamic shared-memory array), and includes this inside its namespace.
//
// A block is 4 warps over 64 rows, each warp owning 16; tiles of 64 keys (or queries)
// stream through shared memory. Rows of bf16 tiles are padded by 8 elements and rows of
// fp32 tiles by 4, which keeps every 16 x 16 fragment 32-byte aligned (WMMA's rule) and
// spreads rows over the shared-memory banks.
//
// The operands as kernels/ops.def has them: q in qkv[B, Tq, (NH + 2 NKV) HD] (per row q
// (NH heads) | k (NKV) | v (NKV)), k and v in kv[B, Tk, kv_ld] (key/value head g's k at
// column g HD, v at (NKV + g) HD); query head h reads key/value head h / (NH / NKV)
// (grouped-query attention); out and dout rows are NH * HD wide. Every row stride and
// column offset is a multiple of 8 elements and every base pointer 16-byte aligned (the
// 16-byte loads; the host checks). Masked by positions and documents
// (kernels/attention_mask.h, attention_visible.cuh): a block loads only the tiles its
// rows may see, a warp computes only those its 16 rows may see, and single elements are
// masked by their row's (key's) own range; a row that sees no key gets out 0 and
// log-sum-exp -inf.

#include "attention_visible.cuh"

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

// Rows [first, first + 64) of one head's column block (q, k or v; or dO) into a bf16
// tile, zeros from row T_ on. 16-byte loads: HD, the row stride and the column are
// multiples of 8.
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
__global__ void __launch_bounds__(kThreads) tc_forward_kernel(bf16* out, float* lse, const bf16* qkv, const bf16* kv,
                                                              AttentionMask mask, AttentionDims dims) {
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

  // The last query rows have the most keys (causally): their blocks start first.
  const int Tq = dims.Tq, Tk = dims.Tk;
  const int bh = blockIdx.y, b = bh / dims.NH, h = bh % dims.NH, g = h / dims.group();
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const size_t q_row = static_cast<size_t>(b) * Tq, kv_row = static_cast<size_t>(b) * Tk;
  const size_t k_col = static_cast<size_t>(g) * HD, v_col = static_cast<size_t>(dims.NKV + g) * HD;
  const float scale = rsqrtf(static_cast<float>(HD));
  load_rows<HD>(qs, qkv, dims.q_ld(), static_cast<size_t>(h) * HD, q_row, q0, Tq);
  for (int i = lane; i < 16 * L::kLdO; i += 32) os[i] = 0.0f;
  __syncwarp();  // the zeros are the output of a row that sees no tile
  // Lanes 2r and 2r+1 share the warp's row r, alternate columns each (fewer bank conflicts).
  const int r = lane / 2, side = lane % 2, w0 = q0 + warp * 16, qi = w0 + r;
  const IndexRange block_keys = visible_keys(mask, b, Tq, Tk, q0, min(q0 + kRows, Tq) - 1);
  const IndexRange warp_keys = visible_keys(mask, b, Tq, Tk, w0, min(w0 + 16, Tq) - 1);
  const IndexRange row_keys = visible_keys(mask, b, Tq, Tk, qi, qi < Tq ? qi : -1);
  float m = -INFINITY, l = 0.0f;
  for (int kt = block_keys.begin; kt < block_keys.end; kt += kRows) {
    __syncthreads();
    load_rows<HD>(ks, kv, dims.kv_ld, k_col, kv_row, kt, block_keys.end);
    load_rows<HD>(vs, kv, dims.kv_ld, v_col, kv_row, kt, block_keys.end);
    if (threadIdx.x == 0) TRIDENT_ATTENTION_COUNT_TILE();
    __syncthreads();
    if (warp_keys.begin >= kt + kRows || warp_keys.end <= kt) continue;  // none for the warp's rows
    if (lane == 0) TRIDENT_ATTENTION_COUNT_WARP_TILE();
    scores<HD>(ss, qs + warp * 16 * L::kLd, ks);
    __syncwarp();
    float* srow = ss + r * kLdS;
    float tile_max = -INFINITY;
    for (int c = side; c < kRows; c += 2) {
      const float s = kt + c >= row_keys.begin && kt + c < row_keys.end ? srow[c] * scale : -INFINITY;
      srow[c] = s;
      tile_max = fmaxf(tile_max, s);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    // m_new stays -inf while the row has seen no key: exponents from 0 then (all 0).
    const float m_new = fmaxf(m, tile_max), m_base = m_new == -INFINITY ? 0.0f : m_new;
    const float correction = __expf(m - m_base);
    float sum = 0.0f;
    for (int c = side; c < kRows; c += 2) {
      const float p = __expf(srow[c] - m_base);
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
  if (qi >= Tq) return;
  // A row that sees no key: out 0, log-sum-exp -inf.
  const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
  bf16* o_row = out + (q_row + qi) * dims.out_ld() + static_cast<size_t>(h) * HD;
  for (int d = side; d < HD; d += 2) o_row[d] = __float2bfloat16_rn(os[r * L::kLdO + d] * inv_l);
  if (side == 0) lse[static_cast<size_t>(bh) * Tq + qi] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// dK, dV of 64 key rows of one key/value head (grid y: B * NKV) into dkv: for each query
// head of its group in turn, over the query tiles that may see them,
// P^T = exp(scale K Q^T - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta) scale,
// dK += dS^T Q, into the same accumulators: the head's dK, dV are written once. lse is
// the rows' final log-sum-exp (never renormalized here: a block of keys is a part of the
// whole).
template <int HD>
__global__ void __launch_bounds__(kThreads) tc_backward_kv_kernel(bf16* dkv, const bf16* dout, const bf16* qkv,
                                                                  const bf16* kv, const float* lse, const float* delta,
                                                                  AttentionMask mask, AttentionDims dims) {
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

  const int Tq = dims.Tq, Tk = dims.Tk, NH = dims.NH;
  const int b = blockIdx.y / dims.NKV, g = blockIdx.y % dims.NKV, group = dims.group(), k0 = blockIdx.x * kRows;
  const size_t q_row = static_cast<size_t>(b) * Tq, kv_row = static_cast<size_t>(b) * Tk;
  const size_t k_col = static_cast<size_t>(g) * HD, v_col = static_cast<size_t>(dims.NKV + g) * HD;
  const float scale = rsqrtf(static_cast<float>(HD));
  load_rows<HD>(ks, kv, dims.kv_ld, k_col, kv_row, k0, Tk);
  load_rows<HD>(vs, kv, dims.kv_ld, v_col, kv_row, k0, Tk);
  FragC dk[HD / 16], dv[HD / 16];
  for (int n = 0; n < HD / 16; n++) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  const int r = lane / 2, side = lane % 2, w0 = k0 + warp * 16, kj = w0 + r;
  const IndexRange block_queries = seeing_queries(mask, b, Tq, k0, min(k0 + kRows, Tk) - 1);
  const IndexRange warp_queries = seeing_queries(mask, b, Tq, w0, min(w0 + 16, Tk) - 1);
  const IndexRange key_queries = seeing_queries(mask, b, Tq, kj, kj < Tk ? kj : -1);
  for (int hg = 0; hg < group; hg++) {
    const int h = g * group + hg;
    const size_t q_col = static_cast<size_t>(h) * HD, bh = static_cast<size_t>(b) * NH + h;
    for (int qt = block_queries.begin; qt < block_queries.end; qt += kRows) {
      __syncthreads();
      load_rows<HD>(qs, qkv, dims.q_ld(), q_col, q_row, qt, block_queries.end);
      load_rows<HD>(dos, dout, dims.out_ld(), q_col, q_row, qt, block_queries.end);
      for (int i = threadIdx.x; i < kRows; i += kThreads) {
        const bool valid = qt + i < block_queries.end;
        lse_s[i] = valid ? lse[bh * Tq + qt + i] : 0.0f;
        delta_s[i] = valid ? delta[bh * Tq + qt + i] : 0.0f;
      }
      if (threadIdx.x == 0) TRIDENT_ATTENTION_COUNT_TILE();
      __syncthreads();
      if (warp_queries.begin >= qt + kRows || warp_queries.end <= qt) continue;  // none see the warp's keys
      if (lane == 0) TRIDENT_ATTENTION_COUNT_WARP_TILE();
      scores<HD>(pt, ks + warp * 16 * L::kLd, qs);   // S^T = K Q^T
      scores<HD>(dpt, vs + warp * 16 * L::kLd, dos);  // dP^T = V dO^T
      __syncwarp();
      for (int c = side; c < kRows; c += 2) {
        const int qi = qt + c;
        const bool visible = qi >= key_queries.begin && qi < key_queries.end;
        const float p = visible ? __expf(pt[r * kLdS + c] * scale - lse_s[c]) : 0.0f;
        pt16[r * kLdP + c] = __float2bfloat16_rn(p);
        dst16[r * kLdP + c] = __float2bfloat16_rn(p * (dpt[r * kLdS + c] - delta_s[c]) * scale);
      }
      __syncwarp();
      accumulate<HD>(dv, pt16, dos);
      accumulate<HD>(dk, dst16, qs);
    }
  }
  __syncwarp();
  store_rows<HD>(dkv, dims.kv_ld, k_col, kv_row, w0, Tk, dk, pt);  // pt + dpt hold 16 x (HD + 4) floats
  __syncwarp();
  store_rows<HD>(dkv, dims.kv_ld, v_col, kv_row, w0, Tk, dv, pt);
}

// dQ of 64 query rows: over the key tiles they may see, P = exp(scale Q K^T - lse),
// dP = dO V^T, dS = P (dP - delta) scale, dQ += dS K.
template <int HD>
__global__ void __launch_bounds__(kThreads) tc_backward_q_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                                 const bf16* kv, const float* lse, const float* delta,
                                                                 AttentionMask mask, AttentionDims dims) {
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

  // The last query rows have the most keys (causally): their blocks start first.
  const int Tq = dims.Tq, Tk = dims.Tk;
  const int bh = blockIdx.y, b = bh / dims.NH, h = bh % dims.NH, g = h / dims.group();
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows;
  const size_t q_row = static_cast<size_t>(b) * Tq, kv_row = static_cast<size_t>(b) * Tk;
  const size_t q_col = static_cast<size_t>(h) * HD, k_col = static_cast<size_t>(g) * HD,
               v_col = static_cast<size_t>(dims.NKV + g) * HD;
  const float scale = rsqrtf(static_cast<float>(HD));
  load_rows<HD>(qs, qkv, dims.q_ld(), q_col, q_row, q0, Tq);
  load_rows<HD>(dos, dout, dims.out_ld(), q_col, q_row, q0, Tq);
  const int r = lane / 2, side = lane % 2, w0 = q0 + warp * 16, qi = w0 + r;
  const float row_lse = qi < Tq ? lse[static_cast<size_t>(bh) * Tq + qi] : 0.0f;
  const float row_delta = qi < Tq ? delta[static_cast<size_t>(bh) * Tq + qi] : 0.0f;
  const IndexRange block_keys = visible_keys(mask, b, Tq, Tk, q0, min(q0 + kRows, Tq) - 1);
  const IndexRange warp_keys = visible_keys(mask, b, Tq, Tk, w0, min(w0 + 16, Tq) - 1);
  const IndexRange row_keys = visible_keys(mask, b, Tq, Tk, qi, qi < Tq ? qi : -1);
  FragC dq[HD / 16];
  for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
  for (int kt = block_keys.begin; kt < block_keys.end; kt += kRows) {
    __syncthreads();
    load_rows<HD>(ks, kv, dims.kv_ld, k_col, kv_row, kt, block_keys.end);
    load_rows<HD>(vs, kv, dims.kv_ld, v_col, kv_row, kt, block_keys.end);
    if (threadIdx.x == 0) TRIDENT_ATTENTION_COUNT_TILE();
    __syncthreads();
    if (warp_keys.begin >= kt + kRows || warp_keys.end <= kt) continue;  // none for the warp's rows
    if (lane == 0) TRIDENT_ATTENTION_COUNT_WARP_TILE();
    scores<HD>(st, qs + warp * 16 * L::kLd, ks);    // S = Q K^T
    scores<HD>(dpt, dos + warp * 16 * L::kLd, vs);  // dP = dO V^T
    __syncwarp();
    for (int c = side; c < kRows; c += 2) {
      const bool visible = kt + c >= row_keys.begin && kt + c < row_keys.end;
      const float p = visible ? __expf(st[r * kLdS + c] * scale - row_lse) : 0.0f;
      ds16[r * kLdP + c] = __float2bfloat16_rn(p * (dpt[r * kLdS + c] - row_delta) * scale);
    }
    __syncwarp();
    accumulate<HD>(dq, ds16, ks);
  }
  __syncwarp();
  store_rows<HD>(dqkv, dims.q_ld(), q_col, q_row, w0, Tq, dq, st);
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

