// bf16 GEMMs through oneDNN's matmul primitive (bf16_gemm.h says when and why).
#include "bf16_gemm.h"

#include <immintrin.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

namespace trident::kernels::cpu {

std::string bf16_gemm_isa() {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  // oneDNN's ISA values nest: each one's bits include those of the ISAs below it.
  const auto has = [&](dnnl_cpu_isa_t wanted) { return (isa & wanted) == wanted; };
  if (has(dnnl_cpu_isa_avx512_core_amx)) return "avx512_core_amx";
  if (has(dnnl_cpu_isa_avx512_core_bf16)) return "avx512_core_bf16";
  return "";
}

namespace {

// bf16(x) for n floats, 16 at a time by the CPU's own conversion (vcvtneps2bf16: round to
// nearest even, as float_to_bf16_bits). Only called where bf16_gemm_isa() found it.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void convert_row(uint16_t* dst, const float* src,
                                                                                 int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256bh x = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail, src + i));
    _mm256_mask_storeu_epi16(dst + i, tail, (__m256i)x);
  }
}

// dst[r, c] = bf16(src[r * ld + c]), rows x cols, dst contiguous.
void to_bf16(uint16_t* dst, const float* src, int rows, int cols, int ld) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; r++) convert_row(dst + static_cast<size_t>(r) * cols, src + static_cast<size_t>(r) * ld, cols);
}

}  // namespace

struct Bf16Gemm::Primitives {
  struct Matmul {
    dnnl::matmul primitive;
    dnnl::memory::desc a, b, c;
  };
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  // (trans_a, trans_b, M, N, K, ldc, accumulate): a primitive per shape, made once (making one costs
  // far more than running it on small inputs). Bounded: experts' row counts vary each step.
  std::map<std::tuple<bool, bool, int, int, int, int, bool>, Matmul> by_shape;
  std::mutex mutex;
  static constexpr size_t kMaxShapes = 256;

  Matmul get(bool trans_a, bool trans_b, int M, int N, int K, int ldc, bool accumulate) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_tuple(trans_a, trans_b, M, N, K, ldc, accumulate);
    auto it = by_shape.find(key);
    if (it != by_shape.end()) return it->second;  // a copy: a later call may clear the map
    if (by_shape.size() >= kMaxShapes) by_shape.clear();
    using dt = dnnl::memory::data_type;
    Matmul m;
    // The copies keep their source's layout: A [M, K] or [K, M] read transposed (a weight
    // gradient's dout), B [K, N] or [N, K] read transposed (PyTorch's Linear weight).
    m.a = dnnl::memory::desc({M, K}, dt::bf16, trans_a ? dnnl::memory::dims{1, M} : dnnl::memory::dims{K, 1});
    m.b = dnnl::memory::desc({K, N}, dt::bf16, trans_b ? dnnl::memory::dims{1, K} : dnnl::memory::dims{N, 1});
    m.c = dnnl::memory::desc({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);  // C += A B
      attr.set_post_ops(ops);
    }
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(engine, m.a, m.b, m.c, attr);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(m.a, m.b, m.c), attr, engine);
#endif
    m.primitive = dnnl::matmul(pd);
    return by_shape.emplace(key, std::move(m)).first->second;
  }
};

Bf16Gemm::Bf16Gemm() : primitives_(std::make_unique<Primitives>()) {
  // The shapes are cached here (Primitives::by_shape); oneDNN's own cache (1024 primitives)
  // would keep alive again those that map lets go.
  dnnl::set_primitive_cache_capacity(0);
}
Bf16Gemm::~Bf16Gemm() = default;

const uint16_t* Bf16Gemm::convert(Operand& slot, const float* source, int rows, int cols, int ld) {
  if (in_op_ && slot.source == source && slot.rows == rows && slot.cols == cols && slot.ld == ld)
    return slot.copy.data();
  const size_t n = static_cast<size_t>(rows) * cols;
  if (slot.copy.size() < n) slot.copy.resize(n);
  to_bf16(slot.copy.data(), source, rows, cols, ld);
  slot.source = source;
  slot.rows = rows;
  slot.cols = cols;
  slot.ld = ld;
  return slot.copy.data();
}

void Bf16Gemm::op_begins() {
  in_op_ = true;
  a_.source = b_.source = nullptr;
}
void Bf16Gemm::op_ends() {
  in_op_ = false;
  a_.source = b_.source = nullptr;
}

void Bf16Gemm::gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B,
                    int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an expert without tokens: C = beta C
    if (beta == 0.0f)
      for (int i = 0; i < M; i++) std::memset(C + static_cast<size_t>(i) * ldc, 0, sizeof(float) * N);
    return;
  }
  const uint16_t* a = convert(a_, A, trans_a ? K : M, trans_a ? M : K, lda);
  const uint16_t* b = convert(b_, B, trans_b ? N : K, trans_b ? K : N, ldb);
  // A primitive is made per shape (its JIT code: 0.1-0.4 MiB), and experts' row counts
  // change every step: the varying dimension runs in pieces of powers of two, so that a
  // layer's GEMMs use a few shapes (log2 of the rows) instead of one per routing. Rows (M)
  // split where A is not transposed (its rows are independent: the same result); the depth
  // (K, a weight gradient's rows) where A is and B is not (the pieces accumulate: fp32 sums
  // in another order). Neither appears in the copies' strides then.
  const auto run = [&](int m0, int m, int k0, int k, bool accumulate) {
    const Primitives::Matmul mm = primitives_->get(trans_a, trans_b, m, N, k, ldc, accumulate);
    const uint16_t* ap = trans_a ? a + static_cast<size_t>(k0) * M : a + static_cast<size_t>(m0) * K;
    const uint16_t* bp = b + static_cast<size_t>(k0) * N;  // B split only when not transposed
    // oneDNN takes non-const pointers; a matmul only reads its source and weights.
    dnnl::memory am(mm.a, primitives_->engine, const_cast<uint16_t*>(ap)),
        bm(mm.b, primitives_->engine, const_cast<uint16_t*>(bp)),
        cm(mm.c, primitives_->engine, C + static_cast<size_t>(m0) * ldc);
    mm.primitive.execute(primitives_->stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  };
  const auto highest_bit = [](int x) { return 1 << (31 - __builtin_clz(static_cast<unsigned>(x))); };
  if (!trans_a) {
    for (int m0 = 0; m0 < M; m0 += highest_bit(M - m0)) run(m0, highest_bit(M - m0), 0, K, beta != 0.0f);
  } else if (!trans_b) {
    for (int k0 = 0; k0 < K; k0 += highest_bit(K - k0)) run(0, M, k0, highest_bit(K - k0), k0 > 0 || beta != 0.0f);
  } else {
    run(0, M, 0, K, beta != 0.0f);
  }
  primitives_->stream.wait();
}

namespace {
thread_local Bf16Gemm* current_gemm = nullptr;
}

LinearLayersInBf16::LinearLayersInBf16(Bf16Gemm* gemm) : gemm_(gemm), previous_(current_gemm) {
  current_gemm = gemm;
  if (gemm != nullptr) gemm->op_begins();
}
LinearLayersInBf16::~LinearLayersInBf16() {
  if (gemm_ != nullptr) gemm_->op_ends();
  current_gemm = previous_;
}
Bf16Gemm* LinearLayersInBf16::current() { return current_gemm; }

}  // namespace trident::kernels::cpu
