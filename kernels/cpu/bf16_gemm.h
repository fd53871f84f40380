// The linear layers' GEMMs in real bf16 on a CPU with bf16 instructions (AVX-512 BF16, AMX):
// oneDNN's matmul primitive on bf16 copies of the inputs, accumulating and writing fp32.
//
// Under Precision::bf16 the CPU backend keeps activations and the weights' compute copy as
// floats already rounded to bf16 (kernels.h), so converting them to bf16 loses nothing and a
// product of two bf16 values is exact in fp32: the result is the fp32 GEMM's on the same
// values but for the order of the fp32 additions; the bf16 tolerances of verify are unchanged.
// What changes is the speed: 1.8-2.3x dnnl_sgemm on GPT-2's block GEMMs (benchmarks/bf16_gemm.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trident::kernels::cpu {

// The CPU's bf16 GEMM instructions as oneDNN sees them ("avx512_core_bf16", "avx512_core_amx"),
// or "" when it has none (or DNNL_MAX_CPU_ISA caps them): the emulated path is used then.
std::string bf16_gemm_isa();

// One thread at a time (the backend's ops run on one): the copies are the object's own.
class Bf16Gemm {
 public:
  Bf16Gemm();
  ~Bf16Gemm();
  Bf16Gemm(const Bf16Gemm&) = delete;
  Bf16Gemm& operator=(const Bf16Gemm&) = delete;

  // Row-major C[M,N] = op(A)[M,K] @ op(B)[K,N] + beta * C, beta 0 or 1; A and B hold floats
  // (rounded to bf16 where they are not already).
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
            float beta, float* C, int ldc);

  // The bf16 copies of A and B this many elements each: the workspace of the largest GEMM.
  static size_t scratch_bytes(size_t a_elements, size_t b_elements) { return 2 * (a_elements + b_elements); }

  // Between these (LinearLayersInBf16, one op) an input is converted once: matmul_backward's
  // dout is A of both of its GEMMs. Outside an op every call converts its inputs afresh
  // (memory at the same address may hold new values).
  void op_begins();
  void op_ends();

 private:
  struct Operand {  // a bf16 copy (grow-only) of a float matrix, in its layout
    std::vector<uint16_t> copy;
    const float* source = nullptr;
    int rows = 0, cols = 0, ld = 0;
  };
  const uint16_t* convert(Operand& slot, const float* source, int rows, int cols, int ld);

  struct Primitives;  // oneDNN's engine, stream and the matmuls made so far, by shape
  std::unique_ptr<Primitives> primitives_;
  Operand a_, b_;
  bool in_op_ = false;
};

// The Bf16Gemm that matmul_forward/matmul_backward<float> use on this thread while a scope
// is alive (the CPU backend opens one around each op under bf16 with bf16 instructions);
// without one they call the fp32 gemm. Attention's internal GEMMs always stay fp32.
class LinearLayersInBf16 {
 public:
  explicit LinearLayersInBf16(Bf16Gemm* gemm);
  ~LinearLayersInBf16();
  LinearLayersInBf16(const LinearLayersInBf16&) = delete;
  LinearLayersInBf16& operator=(const LinearLayersInBf16&) = delete;
  static Bf16Gemm* current();

 private:
  Bf16Gemm* gemm_;
  Bf16Gemm* previous_;
};

}  // namespace trident::kernels::cpu
