// A kernel backend that breaks the way a GPU does after a fault (an illegal or misaligned
// address): one chosen kernel throws, and from then on every call throws, free() and
// synchronize() included, as every CUDA call of the process returns the sticky error.
// kernel_check --cpu-self-check runs its comparison over it (around the CPU backend) to
// show that a fault ends that precision's checks with what they measured, and nothing
// worse (a second exception while unwinding was std::terminate once).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/kernels.h"

namespace trident::kernels {

class FaultyKernels final : public Kernels {
 public:
  FaultyKernels(std::unique_ptr<Kernels> inner, std::string faulting_kernel)
      : inner_(std::move(inner)), faulting_(std::move(faulting_kernel)) {}

  bool broken() const { return broken_; }

  std::string name() const override { return inner_->name() + " (faults at " + faulting_ + ")"; }
  Precision precision() const override { return inner_->precision(); }
  DType activation_type() const override { return inner_->activation_type(); }
  bool host_memory() const override { return inner_->host_memory(); }
  size_t attention_stats_floats(int B, int T, int NH) const override { return inner_->attention_stats_floats(B, T, NH); }
  size_t workspace_bytes(int N, int C, int max_width, int B, int T, int NH) const override {
    return inner_->workspace_bytes(N, C, max_width, B, T, NH);
  }
  MemoryPool memory_pool() const override { return inner_->memory_pool(); }

  void upload(void* dst, const void* src, size_t bytes) override { live("upload").upload(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    live("copy_on_device").copy_on_device(dst, src, bytes);
  }
  void fill_zero(void* p, size_t bytes) override { live("fill_zero").fill_zero(p, bytes); }
  void cast_to_activation(Act* compute, const float* master, size_t n) override {
    live("cast_to_activation").cast_to_activation(compute, master, n);
  }
  void embedding_forward(Act* out, const int32_t* tokens, const Act* wte, int start, int rows, int B, int T,
                         int C) override {
    live("embedding_forward").embedding_forward(out, tokens, wte, start, rows, B, T, C);
  }
  void embedding_backward(float* dwte, const Act* dout, const int32_t* tokens, const int32_t* host_tokens, int start,
                          int rows, int B, int T, int C) override {
    live("embedding_backward").embedding_backward(dwte, dout, tokens, host_tokens, start, rows, B, T, C);
  }
  void add_positions(Act* out, const Act* wpe, int B, int T, int C) override {
    live("add_positions").add_positions(out, wpe, B, T, C);
  }
  void positions_backward(float* dwpe, const Act* dout, int B, int T, int C) override {
    live("positions_backward").positions_backward(dwpe, dout, B, T, C);
  }
  void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* weight, const Act* bias, int N,
                         int C, float eps) override {
    live("layernorm_forward").layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layernorm_backward(Act* dinp, float* dweight, float* dbias, const Act* dout, const Act* inp, const Act* weight,
                          const float* mean, const float* rstd, int N, int C) override {
    live("layernorm_backward").layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(Act* out, const Act* inp, const Act* weight, const Act* bias, int N, int C, int OC) override {
    live("matmul_forward").matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  void matmul_backward(Act* dinp, float* dweight, float* dbias, const Act* dout, const Act* inp, const Act* weight,
                       int N, int C, int OC) override {
    live("matmul_backward").matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* weight, int N, int C, float eps) override {
    live("rmsnorm_forward").rmsnorm_forward(out, rstd, inp, weight, N, C, eps);
  }
  void rmsnorm_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight,
                        const float* rstd, int N, int C) override {
    live("rmsnorm_backward").rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
  }
  void rope_forward(Act* qkv, const float* table, int B, int T, int NH, int NKV, int HD) override {
    live("rope_forward").rope_forward(qkv, table, B, T, NH, NKV, HD);
  }
  void rope_backward(Act* dqkv, const float* table, int B, int T, int NH, int NKV, int HD) override {
    live("rope_backward").rope_backward(dqkv, table, B, T, NH, NKV, HD);
  }
  void attention_forward(Act* out, float* stats, const Act* qkv, int B, int T, int NH, int NKV, int HD) override {
    live("attention_forward").attention_forward(out, stats, qkv, B, T, NH, NKV, HD);
  }
  void attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out, const float* stats, int B,
                          int T, int NH, int NKV, int HD) override {
    live("attention_backward").attention_backward(dqkv, dout, qkv, out, stats, B, T, NH, NKV, HD);
  }
  void gelu_forward(Act* out, const Act* inp, size_t n) override { live("gelu_forward").gelu_forward(out, inp, n); }
  void gelu_backward(Act* dinp, const Act* inp, const Act* dout, size_t n) override {
    live("gelu_backward").gelu_backward(dinp, inp, dout, n);
  }
  void swiglu_forward(Act* out, const Act* gate_up, int N, int F) override {
    live("swiglu_forward").swiglu_forward(out, gate_up, N, F);
  }
  void swiglu_backward(Act* dgate_up, const Act* gate_up, const Act* dout, int N, int F) override {
    live("swiglu_backward").swiglu_backward(dgate_up, gate_up, dout, N, F);
  }
  void add(Act* out, const Act* a, const Act* b, size_t n) override { live("add").add(out, a, b, n); }
  void logits_row_max(float* row_max, const Act* logits, int N, int valid, int Vs) override {
    live("logits_row_max").logits_row_max(row_max, logits, N, valid, Vs);
  }
  void logits_sum_exp_and_target(float* sums, const Act* logits, const float* row_max, const int32_t* targets,
                                 int start, int N, int valid, int Vs) override {
    live("logits_sum_exp_and_target").logits_sum_exp_and_target(sums, logits, row_max, targets, start, N, valid, Vs);
  }
  void cross_entropy_loss(float* losses, float* lse, const float* row_max, const float* sums, int N) override {
    live("cross_entropy_loss").cross_entropy_loss(losses, lse, row_max, sums, N);
  }
  void cross_entropy_backward(Act* logits, const float* lse, const int32_t* targets, int start, int N, int valid,
                              int Vs, float dloss) override {
    live("cross_entropy_backward").cross_entropy_backward(logits, lse, targets, start, N, valid, Vs, dloss);
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int t, float grad_scale) override {
    live("adamw_update").adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  }
  void add_f32(float* out, const float* in, size_t n) override { live("add_f32").add_f32(out, in, n); }
  void accumulate_sum(double* total, const float* x, size_t n) override {
    live("accumulate_sum").accumulate_sum(total, x, n);
  }
  void accumulate_sum_squares(double* total, const float* x, size_t n) override {
    live("accumulate_sum_squares").accumulate_sum_squares(total, x, n);
  }
  double measure_gemm_gflops(int n, double seconds) override {
    return live("measure_gemm_gflops").measure_gemm_gflops(n, seconds);
  }

 protected:
  void* do_alloc(size_t bytes) override { return live("alloc").alloc(bytes); }
  void do_free(void* p) override { live("free").free(p); }
  void do_copy_to_device(void* dst, const void* src, size_t bytes) override {
    live("copy_to_device").copy_to_device(dst, src, bytes);
  }
  void do_copy_to_host(void* dst, const void* src, size_t bytes) override {
    live("copy_to_host").copy_to_host(dst, src, bytes);
  }
  void do_synchronize() override { live("synchronize").synchronize(); }
  void do_activations_to_host(float* host, const Act* x, size_t n) override {
    live("activations_to_host").activations_to_host(host, x, n);
  }
  void do_activations_from_host(Act* x, const float* host, size_t n) override {
    live("activations_from_host").activations_from_host(x, host, n);
  }
  double do_sum_squares(const float* x, size_t n) override { return live("sum_squares").sum_squares(x, n); }

 private:
  // The inner backend, unless the fault has happened (or happens now, in the chosen kernel).
  Kernels& live(const char* call) {
    if (!broken_ && faulting_ == call) {
      broken_ = true;
      throw std::runtime_error(std::string("CUDA: an illegal memory access was encountered in ") + call +
                               " (simulated)");
    }
    if (broken_)
      throw std::runtime_error(std::string("CUDA: an illegal memory access was encountered (sticky, in ") + call +
                               ", simulated)");
    return *inner_;
  }

  std::unique_ptr<Kernels> inner_;
  std::string faulting_;
  bool broken_ = false;
};

}  // namespace trident::kernels
