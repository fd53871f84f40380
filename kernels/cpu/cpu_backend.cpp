// The CPU implementation of kernels/kernels.h: float instances of the templates.
#include <chrono>
#include <cstdlib>
#include <vector>
#include <cstring>
#include <new>

#include "../kernels.h"
#include "cpu_kernels.h"

namespace trident::kernels {

namespace {

class CpuKernels final : public Kernels {
 public:
  std::string name() const override { return "cpu"; }

  void* alloc(size_t bytes) override {
    constexpr size_t kAlign = 64;  // one cache line, one AVX-512 vector
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, bytes);  // touch every page now, not in the first step
    return p;
  }
  void free(void* p) override { std::free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill_zero(float* p, size_t n) override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) p[i] = 0.0f;
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte_shard, int vocab_start, int shard_rows,
                         int B, int T, int C) override {
    cpu::embedding_forward(out, tokens, wte_shard, vocab_start, shard_rows, B, T, C);
  }
  void embedding_backward(float* dwte_shard, const float* dout, const int32_t* tokens, int vocab_start,
                          int shard_rows, int B, int T, int C) override {
    cpu::embedding_backward(dwte_shard, dout, tokens, vocab_start, shard_rows, B, T, C);
  }
  void add_positions(float* out, const float* wpe, int B, int T, int C) override {
    cpu::add_positions(out, wpe, B, T, C);
  }
  void positions_backward(float* dwpe, const float* dout, int B, int T, int C) override {
    cpu::positions_backward(dwpe, dout, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C, float eps) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    cpu::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int C,
                         int NH) override {
    cpu::attention_forward(out, probs, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                          int B, int T, int C, int NH) override {
    cpu::attention_backward(dqkv, dout, qkv, probs, B, T, C, NH);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override { cpu::gelu_forward(out, inp, n); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
  }
  void logits_row_max(float* row_max, const float* logits, int N, int valid, int Vs) override {
    cpu::logits_row_max(row_max, logits, N, valid, Vs);
  }
  void logits_sum_exp_and_target(float* sum_and_target, const float* logits, const float* row_max,
                                 const int32_t* targets, int vocab_start, int N, int valid, int Vs) override {
    cpu::logits_sum_exp_and_target(sum_and_target, logits, row_max, targets, vocab_start, N, valid, Vs);
  }
  void cross_entropy_loss(float* losses, float* lse, const float* row_max, const float* sum_and_target,
                          int N) override {
    cpu::cross_entropy_loss(losses, lse, row_max, sum_and_target, N);
  }
  void cross_entropy_backward(float* logits_to_dlogits, const float* lse, const int32_t* targets, int vocab_start,
                              int N, int valid, int Vs, float dloss) override {
    cpu::cross_entropy_backward(logits_to_dlogits, lse, targets, vocab_start, N, valid, Vs, dloss);
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale) override {
    cpu::adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  }
  double sum_squares(const float* x, size_t n) override { return cpu::sum_squares(x, n); }
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
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() { return std::make_unique<CpuKernels>(); }

}  // namespace trident::kernels
