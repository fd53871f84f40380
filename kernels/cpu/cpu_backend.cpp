// The CPU implementation of kernels/kernels.h: float instances of the templates.
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <vector>
#include <cstring>
#include <new>

#include "../bf16.h"
#include "../kernels.h"
#include "cpu_kernels.h"
#include "runtime/memory.h"

namespace trident::kernels {

namespace {

// Precision::bf16 rounds what the kernels write (see make_cpu_kernels in kernels.h).
class CpuKernels final : public Kernels {
 public:
  explicit CpuKernels(Precision precision) : precision_(precision) {}

  std::string name() const override { return precision_ == Precision::fp32 ? "cpu" : "cpu (bf16 emulated)"; }
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
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill_zero(void* p, size_t bytes) override {
    const size_t n = bytes / sizeof(float);
    float* f = static_cast<float*>(p);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) f[i] = 0.0f;
    std::memset(f + n, 0, bytes - n * sizeof(float));
  }
  void do_synchronize() override {}
  void add_f32(float* out, const float* in, size_t n) override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] += in[i];
  }
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

  void embedding_forward(Act* out, const int32_t* tokens, const Act* wte_shard, int vocab_start, int shard_rows,
                         int B, int T, int C) override {
    cpu::embedding_forward(f(out), tokens, f(wte_shard), vocab_start, shard_rows, B, T, C);
    written(out, static_cast<size_t>(B) * T * C);
  }
  void embedding_backward(float* dwte_shard, const Act* dout, const int32_t* tokens, const int32_t* /*host_tokens*/,
                          int vocab_start, int shard_rows, int B, int T, int C) override {
    cpu::embedding_backward(dwte_shard, f(dout), tokens, vocab_start, shard_rows, B, T, C);
  }
  void add_positions(Act* out, const Act* wpe, int B, int T, int C) override {
    cpu::add_positions(f(out), f(wpe), B, T, C);
    written(out, static_cast<size_t>(B) * T * C);
  }
  void positions_backward(float* dwpe, const Act* dout, int B, int T, int C) override {
    cpu::positions_backward(dwpe, f(dout), B, T, C);
  }
  void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* weight, const Act* bias,
                         int N, int C, float eps) override {
    cpu::layernorm_forward(f(out), mean, rstd, f(inp), f(weight), f(bias), N, C, eps);
    written(out, static_cast<size_t>(N) * C);
  }
  void layernorm_backward(Act* dinp, float* dweight, float* dbias, const Act* dout, const Act* inp,
                          const Act* weight, const float* mean, const float* rstd, int N, int C) override {
    cpu::layernorm_backward(f(dinp), dweight, dbias, f(dout), f(inp), f(weight), mean, rstd, N, C);
    written(dinp, static_cast<size_t>(N) * C);
  }
  void matmul_forward(Act* out, const Act* inp, const Act* weight, const Act* bias, int N, int C,
                      int OC) override {
    cpu::matmul_forward(f(out), f(inp), f(weight), f(bias), N, C, OC);
    written(out, static_cast<size_t>(N) * OC);
  }
  void matmul_backward(Act* dinp, float* dweight, float* dbias, const Act* dout, const Act* inp,
                       const Act* weight, int N, int C, int OC) override {
    cpu::matmul_backward(f(dinp), dweight, dbias, f(dout), f(inp), f(weight), N, C, OC);
    if (dinp != nullptr) written(dinp, static_cast<size_t>(N) * C);
  }
  void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* weight, int N, int C, float eps) override {
    cpu::rmsnorm_forward(f(out), rstd, f(inp), f(weight), N, C, eps);
    written(out, static_cast<size_t>(N) * C);
  }
  void rmsnorm_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight,
                        const float* rstd, int N, int C) override {
    cpu::rmsnorm_backward(f(dinp), dweight, f(dout), f(inp), f(weight), rstd, N, C);
    written(dinp, static_cast<size_t>(N) * C);
  }
  void rope_forward(Act* qkv, const float* rope_table, int B, int T, int NH, int NKV, int HD) override {
    cpu::rope_forward(f(qkv), rope_table, B, T, NH, NKV, HD);
    written(qkv, static_cast<size_t>(B) * T * (NH + 2 * NKV) * HD);
  }
  void rope_backward(Act* dqkv, const float* rope_table, int B, int T, int NH, int NKV, int HD) override {
    cpu::rope_backward(f(dqkv), rope_table, B, T, NH, NKV, HD);
    written(dqkv, static_cast<size_t>(B) * T * (NH + 2 * NKV) * HD);
  }
  size_t attention_stats_floats(int B, int T, int NH) const override {
    return static_cast<size_t>(B) * NH * T * T;  // the probabilities
  }
  void attention_forward(Act* out, float* stats, const Act* qkv, int B, int T, int NH, int NKV, int HD) override {
    cpu::attention_forward(f(out), stats, f(qkv), B, T, NH, NKV, HD);
    written(out, static_cast<size_t>(B) * T * NH * HD);
  }
  void attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* /*out*/, const float* stats,
                          int B, int T, int NH, int NKV, int HD) override {
    cpu::attention_backward(f(dqkv), f(dout), f(qkv), stats, B, T, NH, NKV, HD);
    written(dqkv, static_cast<size_t>(B) * T * (NH + 2 * NKV) * HD);
  }
  void gelu_forward(Act* out, const Act* inp, size_t n) override {
    cpu::gelu_forward(f(out), f(inp), n);
    written(out, n);
  }
  void gelu_backward(Act* dinp, const Act* inp, const Act* dout, size_t n) override {
    cpu::gelu_backward(f(dinp), f(inp), f(dout), n);
    written(dinp, n);
  }
  void swiglu_forward(Act* out, const Act* gate_up, int N, int F) override {
    cpu::swiglu_forward(f(out), f(gate_up), N, F);
    written(out, static_cast<size_t>(N) * F);
  }
  void swiglu_backward(Act* dgate_up, const Act* gate_up, const Act* dout, int N, int F) override {
    cpu::swiglu_backward(f(dgate_up), f(gate_up), f(dout), N, F);
    written(dgate_up, static_cast<size_t>(N) * 2 * F);
  }
  void add(Act* out, const Act* a, const Act* b, size_t n) override {
    float* o = f(out);
    const float *x = f(a), *y = f(b);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
    written(out, n);
  }
  void logits_row_max(float* row_max, const Act* logits, int N, int valid, int Vs) override {
    cpu::logits_row_max(row_max, f(logits), N, valid, Vs);
  }
  void logits_sum_exp_and_target(float* sum_and_target, const Act* logits, const float* row_max,
                                 const int32_t* targets, int vocab_start, int N, int valid, int Vs) override {
    cpu::logits_sum_exp_and_target(sum_and_target, f(logits), row_max, targets, vocab_start, N, valid, Vs);
  }
  void cross_entropy_loss(float* losses, float* lse, const float* row_max, const float* sum_and_target,
                          int N) override {
    cpu::cross_entropy_loss(losses, lse, row_max, sum_and_target, N);
  }
  void cross_entropy_backward(Act* logits_to_dlogits, const float* lse, const int32_t* targets, int vocab_start,
                              int N, int valid, int Vs, float dloss) override {
    cpu::cross_entropy_backward(f(logits_to_dlogits), lse, targets, vocab_start, N, valid, Vs, dloss);
    written(logits_to_dlogits, static_cast<size_t>(N) * Vs);
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale) override {
    cpu::adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  }
  double do_sum_squares(const float* x, size_t n) override { return cpu::sum_squares(x, n); }
  void accumulate_sum(double* total, const float* x, size_t n) override { *total += cpu::sum(x, n); }
  void accumulate_sum_squares(double* total, const float* x, size_t n) override { *total += cpu::sum_squares(x, n); }
  bool host_memory() const override { return true; }
  MemoryPool memory_pool() const override {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    return {"RAM", available_memory_bytes(), total_memory_bytes(), host};
  }
  size_t workspace_bytes(int /*N*/, int C, int /*max_width*/, int /*B*/, int T, int /*NH*/) const override {
    // The norms' per-thread partial sums; attention's backward keeps one row chunk of dP
    // per thread. oneDNN's sgemm adds its JIT code and per-thread packing buffers, which
    // it does not report: 6 MiB + 4 MiB per thread covers what was measured on 1 and 2
    // threads for GEMMs from 2048 x 384 x 1152 to 16384 x 768 x 3072 (5-8 MiB on one
    // thread, 6-20 on two: benchmarks/RESULTS.md "Memory plan").
    const size_t threads = static_cast<size_t>(omp_get_max_threads());
    const size_t ours = threads * (2 * C + cpu::attention_backward_scratch_floats(T)) * sizeof(float);
    return ours + (size_t{6} << 20) + threads * (size_t{4} << 20);
  }

  double measure_gemm_gflops(int n, double seconds) override {
    std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
    cpu::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    int reps = 0;
    double elapsed = 0.0;
    do {
      cpu::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      reps++;
      elapsed = std::chrono::duration<double>(clock::now() - start).count();
    } while (elapsed < seconds);
    return 2.0 * n * n * static_cast<double>(n) * reps / elapsed / 1e9;
  }

 private:
  static float* f(Act* p) { return as_float(p); }
  static const float* f(const Act* p) { return as_float(p); }
  // An activation output is complete: in bf16 emulation, round it as bf16 storage would.
  void written(Act* out, size_t n) {
    if (precision_ == Precision::fp32) return;
    float* x = f(out);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = round_to_bf16(x[i]);
  }

  Precision precision_;
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels(Precision precision) { return std::make_unique<CpuKernels>(precision); }

}  // namespace trident::kernels
