// The CPU implementation of kernels/kernels.h: float instances of the templates.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>
#include <cstring>
#include <new>

#include "../bf16.h"
#include "../kernels.h"
#include "bf16_gemm.h"
#include "cpu_kernels.h"
#include "kernels/base/memory.h"

namespace trident::kernels {

// The CPU's entry point of each op of kernels/ops.def is cpu::NAME with the op's
// arguments (activations as float*): the kernels of cpu_kernels.h, and these for the
// ops that have no kernel of their own or whose kernel takes fewer arguments.
namespace cpu {

static void embedding_backward(float* dwte_shard, const float* dout, const int32_t* tokens,
                               const int32_t* /*host_tokens*/, int vocab_start, int shard_rows, int B, int T, int C) {
  embedding_backward<float>(dwte_shard, dout, tokens, vocab_start, shard_rows, B, T, C);
}
static void add(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
static void add_f32(float* out, const float* in, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) out[i] += in[i];
}
static void accumulate_sum(double* total, const float* x, size_t n) { *total += sum(x, n); }
static void accumulate_sum_squares(double* total, const float* x, size_t n) { *total += sum_squares(x, n); }

}  // namespace cpu

namespace {

// Precision::bf16 rounds what the kernels write (see make_cpu_kernels in kernels.h).
class CpuKernels final : public Kernels {
 public:
  explicit CpuKernels(Precision precision) : precision_(precision) {
    if (precision == Precision::bf16 && !cpu::bf16_gemm_isa().empty()) bf16_gemm_ = std::make_unique<cpu::Bf16Gemm>();
  }

  std::string name() const override {
    if (precision_ == Precision::fp32) return "cpu";
    if (bf16_gemm_) return "cpu (bf16: GEMMs in bf16 on " + cpu::bf16_gemm_isa() + ", the rest emulated)";
    return "cpu (bf16 emulated)";
  }
  Precision precision() const override { return precision_; }
  DType activation_type() const override { return DType::f32; }

  void* do_alloc(size_t bytes) override {
    constexpr size_t kAlign = 64;  // one cache line, one AVX-512 vector
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);  // touch every page now, not in the first step
    return p;
  }
  void do_free(void* p) override { std::free(p); }
  void do_copy_to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void do_copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void do_upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill_zero(void* p, size_t bytes) override {
    const size_t n = bytes / sizeof(float);
    float* f = static_cast<float*>(p);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) f[i] = 0.0f;
    std::memset(f + n, 0, bytes - n * sizeof(float));
  }
  void do_synchronize() override {}
  void cast_to_activation(Act* compute, const float* master, size_t n) override {
    if (as_float(compute) != master) std::memcpy(as_float(compute), master, n * sizeof(float));
    written(compute, n);
  }
  void do_activations_to_host(float* host, const Act* x, size_t n) override {
    std::memcpy(host, x, n * sizeof(float));
  }
  void do_activations_from_host(Act* x, const float* host, size_t n) override {
    std::memcpy(x, host, n * sizeof(float));
    written(x, n);
  }

  // Every op: the CPU kernel (its linear layers' GEMMs in bf16 where the CPU has bf16
  // instructions), then the rounding of what it wrote (written()).
#define TRIDENT_KERNEL_OP(name, params, args, output)            \
  void name params override {                                     \
    const cpu::LinearLayersInBf16 gemms(bf16_gemm_.get());        \
    [](auto... arg) { cpu::name(f(arg)...); } args;               \
    written output;                                               \
  }
#include "kernels/ops.def"

  size_t attention_stats_floats(int B, int T, int NH) const override {
    return static_cast<size_t>(B) * NH * T;  // each row's log-sum-exp
  }
  double do_sum_squares(const float* x, size_t n) override { return cpu::sum_squares(x, n); }
  bool host_memory() const override { return true; }
  MemoryPool memory_pool() const override {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    return {"RAM", available_memory_bytes(), total_memory_bytes(), host};
  }
  size_t workspace_bytes(int /*N*/, int C, int /*max_width*/, int /*B*/, int T, int /*NH*/) const override {
    // The norms' per-thread partial sums; attention keeps one row chunk of its scores and
    // their gradients per thread. oneDNN's sgemm adds its JIT code and per-thread packing buffers, which
    // it does not report: 6 MiB + 4 MiB per thread covers what was measured on 1 and 2
    // threads for GEMMs from 2048 x 384 x 1152 to 16384 x 768 x 3072 (5-8 MiB on one
    // thread, 6-20 on two: benchmarks/RESULTS.md "Memory plan").
    const size_t threads = static_cast<size_t>(omp_get_max_threads());
    const size_t ours = threads * (2 * C + cpu::attention_scratch_floats(T)) * sizeof(float);
    return ours + (size_t{6} << 20) + threads * (size_t{4} << 20);
  }

  size_t gemm_copy_bytes(const GemmOperands& largest) const override {
    return bf16_gemm_ ? cpu::Bf16Gemm::scratch_bytes(largest.a, largest.b) : 0;
  }

  // The GEMM the linear layers run: bf16 (oneDNN) where the backend has it, else sgemm
  // (fp32, and bf16 emulated: its GEMMs are fp32's).
  double measure_gemm_gflops(int n, double seconds) override {
    std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
    // Inside one op the bf16 copies of a and b are made once (bf16_gemm.h): the GEMM alone is timed.
    const cpu::LinearLayersInBf16 gemms(bf16_gemm_.get());
    const auto gemm = [&] {
      if (bf16_gemm_) bf16_gemm_->gemm(false, false, n, n, n, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      else cpu::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    };
    gemm();  // warm-up
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    int reps = 0;
    double elapsed = 0.0;
    do {
      gemm();
      reps++;
      elapsed = std::chrono::duration<double>(clock::now() - start).count();
    } while (elapsed < seconds);
    return 2.0 * n * n * static_cast<double>(n) * reps / elapsed / 1e9;
  }
  std::string measured_gemm() const override {
    return bf16_gemm_ ? "bf16 GEMM (oneDNN on " + cpu::bf16_gemm_isa() + ")" : "sgemm";
  }

 private:
  static float* f(Act* p) { return as_float(p); }
  static const float* f(const Act* p) { return as_float(p); }
  template <typename Arg>
  static Arg f(Arg arg) {  // every other argument as it is
    return arg;
  }
  // An activation output is complete: in bf16 emulation, round it as bf16 storage would.
  // Nothing to round for an op that writes only fp32, or an output it skipped (null).
  void written() {}
  void written(Act* out, size_t n) {
    if (precision_ == Precision::fp32 || out == nullptr) return;
    float* x = f(out);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = round_to_bf16(x[i]);
  }

  Precision precision_;
  std::unique_ptr<cpu::Bf16Gemm> bf16_gemm_;  // under bf16 on a CPU with bf16 GEMM instructions
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels(Precision precision) { return std::make_unique<CpuKernels>(precision); }

}  // namespace trident::kernels
