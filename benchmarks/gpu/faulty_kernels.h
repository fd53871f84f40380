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

  void do_upload(void* dst, const void* src, size_t bytes) override { live("upload").upload(dst, src, bytes); }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    live("copy_on_device").copy_on_device(dst, src, bytes);
  }
  void fill_zero(void* p, size_t bytes) override { live("fill_zero").fill_zero(p, bytes); }
  void cast_to_activation(Act* compute, const float* master, size_t n) override {
    live("cast_to_activation").cast_to_activation(compute, master, n);
  }
  // Every op of kernels/ops.def.
#define TRIDENT_KERNEL_OP(name, params, args, written) \
  void name params override { live(#name).name args; }
#include "kernels/ops.def"

  void grouped_matmul_forward(Act* out, const Act* inp, const Act* const* weights, const int* rows, int groups, int C,
                              int OC) override {
    live("grouped_matmul_forward").grouped_matmul_forward(out, inp, weights, rows, groups, C, OC);
  }
  void grouped_matmul_backward(Act* dinp, float* const* dweights, const Act* dout, const Act* inp,
                               const Act* const* weights, const int* rows, int groups, int C, int OC) override {
    live("grouped_matmul_backward").grouped_matmul_backward(dinp, dweights, dout, inp, weights, rows, groups, C, OC);
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
