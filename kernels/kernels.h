// The compute-kernel API of trident: one interface, implemented by kernels/cpu
// (BLAS + vectorized C++) and kernels/cuda (cuBLASLt + CUDA). Kernels know no ranks, no
// layers and no files; the model calls them through a `Kernels&` so one model runs on
// either device, in either precision. The compute ops are listed once, in kernels/ops.def.
//
// Conventions (all tensors row-major, in the backend's memory):
//   N = rows (B*T tokens), C = channels, OC = output channels, V = real vocabulary,
//   Vp = padded vocabulary (row stride of logits and of wte), NH = heads.
//   Outputs named `out`/`dinp` are overwritten unless the comment says "+=".
//   Gradients of parameters (dweight, dbias, dwte, ...) are always accumulated (+=),
//   so gradient accumulation over micro-batches needs no extra buffer.
//
// Precision (mixed precision as Megatron's --bf16 does it):
//   - float*: fp32 always: master parameters, their gradients, optimizer state, and the
//     statistics (LayerNorm mean/rstd, attention row statistics, loss partials, losses).
//   - Act*: activations, their gradients, and the compute copy of the weights that the
//     layers read, in the backend's activation type: fp32, or bf16 with
//     Precision::bf16 (GEMMs then take bf16 inputs and accumulate in fp32).
//     Act is opaque: only the backend reads it; sizes are in elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/attention_mask.h"
#include "kernels/dtype.h"
#include "kernels/footprint.h"

namespace trident::kernels {

enum class GroupedGemmSetting : int;  // kernels/grouped_gemm_choice.h

// What a backend's memory holds besides the buffers it is given (precision(),
// activation_type(), host_memory(), attention_stats_floats(), workspace_bytes()) is its
// Footprint (kernels/footprint.h): what a memory plan needs, answerable without the device.
class Kernels : public Footprint {
 public:
  virtual std::string name() const = 0;
  // What else the startup line should say about this backend (how it allocates).
  virtual std::string details() const { return ""; }
  // Sizes the kernels' own workspace (workspace_bytes()) for these shapes now, before the
  // first step: a GPU without memory pools could only grow it mid-step by draining its queue.
  virtual void reserve_workspace(int /*N*/, int /*C*/, int /*max_width*/, int /*B*/, int /*T*/, int /*NH*/) {}
  // Stages upload()s of up to `bytes` without growing (the model's largest per step, before
  // the first): a GPU's pinned staging could only grow by stalling the device. Keeps the
  // largest asked for; uploads_beyond_reserve() counts the uploads larger than it, on every
  // backend, so that a CPU test sees what would stall a GPU.
  void reserve_uploads(size_t bytes) {
    if (bytes <= upload_reserve_) return;
    upload_reserve_ = bytes;
    do_reserve_uploads(bytes);
  }
  uint64_t uploads_beyond_reserve() const { return uploads_beyond_reserve_; }

  // ---- memory (device memory of this backend) ----
  // The calls of this section marked "blocking" return only once the device has caught
  // up with the work issued before them: on a GPU each is a host synchronization, a
  // drained queue. They are counted (host_syncs()) by this class, the same way on every
  // backend, so a test on the CPU holds how many a training step makes on a GPU.
  // Blocking: zero-filled memory that stays valid until free(); pages are touched once
  // here so that the training loop never pays first-touch costs.
  void* alloc(size_t bytes) {
    host_syncs_++;
    return do_alloc(bytes);
  }
  void free(void* p) {  // blocking
    host_syncs_++;
    do_free(p);
  }
  void copy_to_device(void* dst, const void* src_host, size_t bytes) {  // blocking
    host_syncs_++;
    do_copy_to_device(dst, src_host, bytes);
  }
  void copy_to_host(void* dst_host, const void* src, size_t bytes) {  // blocking
    host_syncs_++;
    do_copy_to_host(dst_host, src, bytes);
  }
  // Waits until the device has finished all work issued so far (blocking; a no-op on the CPU).
  void synchronize() {
    host_syncs_++;
    do_synchronize();
  }
  // host[i] = x[i] as float, for tests and the host side of the pipeline check (blocking).
  void activations_to_host(float* host, const Act* x, size_t n) {
    host_syncs_++;
    do_activations_to_host(host, x, n);
  }
  void activations_from_host(Act* x, const float* host, size_t n) {  // blocking
    host_syncs_++;
    do_activations_from_host(x, host, n);
  }
  // Host synchronizations so far (the blocking calls above and sum_squares()).
  uint64_t host_syncs() const { return host_syncs_; }

  // Not blocking: a copy from host memory ordered after the work issued so far; the host
  // buffer may be reused as soon as this returns (the backend stages it: pinned memory
  // on a GPU). For per-step inputs (tokens, embedding gradient indices).
  void upload(void* dst, const void* src_host, size_t bytes) {
    if (bytes > upload_reserve_) uploads_beyond_reserve_++;
    do_upload(dst, src_host, bytes);
  }
  // The memory this backend allocates from: what is free now and in all, and a key
  // that the ranks drawing on the same memory share (the node for RAM, the device).
  struct MemoryPool {
    std::string name;  // "RAM", "cuda:0 (NVIDIA H200) device memory"
    size_t free_bytes = 0, total_bytes = 0;
    std::string key;
  };
  virtual MemoryPool memory_pool() const = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* p, size_t bytes) = 0;
  // compute[i] = master[i] in the activation type: the weights the layers read.
  virtual void cast_to_activation(Act* compute, const float* master, size_t n) = 0;

  // ---- the compute ops, declared once in kernels/ops.def (how to add one: there) ----
#define TRIDENT_KERNEL_OP(name, params, args, written) virtual void name params = 0;
#include "kernels/ops.def"

  // ---- grouped linear layers: a mixture's experts, each its own weight over its rows ----
  // Group g is rows[g] consecutive rows (0 allowed; the groups one after the other; rows
  // in host memory) and weights[g] ([OC, C], host array of device pointers). Each group is
  // matmul_forward / matmul_backward without a bias: out, dinp (null: skipped) overwritten,
  // dweights[g] += (dweights null: skipped), inp read only for dweights, weights only for
  // dinp. A backend runs them as one grouped GEMM (CUDA: cuBLAS's grouped batched GEMM) or,
  // by default, one GEMM per group (the CPU: the same sums as calling matmul per expert).
  virtual void grouped_matmul_forward(Act* out, const Act* inp, const Act* const* weights, const int* rows,
                                      int groups, int C, int OC);
  virtual void grouped_matmul_backward(Act* dinp, float* const* dweights, const Act* dout, const Act* inp,
                                       const Act* const* weights, const int* rows, int groups, int C, int OC);
  // Whether they run as one grouped GEMM now (kernel_check's rows say which way they timed),
  // and a setting that replaces the backend's own choice (kernel_check times both ways):
  // kernels/grouped_gemm_choice.h. Where there is one way (the CPU), false and a no-op.
  virtual bool grouped_gemm_on() const { return false; }
  virtual void set_grouped_gemm(GroupedGemmSetting /*setting*/) {}

  // sum of x[i]^2, accumulated in double, on the host (blocking).
  double sum_squares(const float* x, size_t n) {
    host_syncs_++;
    return do_sum_squares(x, n);
  }
  // Measured rate of this backend's GEMM on n x n matrices of the activation type, in GFLOP/s, over
  // about `seconds`: the peak that MFU and the benchmarks compare against.
  virtual double measure_gemm_gflops(int n, double seconds) = 0;
  // What measure_gemm_gflops times, in words ("sgemm"; under bf16 on a CPU with bf16
  // instructions, the bf16 GEMM the linear layers run).
  virtual std::string measured_gemm() const { return "GEMM"; }

 protected:
  // A synchronization a backend makes on its own (a staging ring that caught up with the device).
  void count_host_sync() { host_syncs_++; }
  // The blocking calls, as each backend does them.
  virtual void* do_alloc(size_t bytes) = 0;
  virtual void do_free(void* p) = 0;
  virtual void do_copy_to_device(void* dst, const void* src_host, size_t bytes) = 0;
  virtual void do_copy_to_host(void* dst_host, const void* src, size_t bytes) = 0;
  virtual void do_synchronize() = 0;
  virtual void do_activations_to_host(float* host, const Act* x, size_t n) = 0;
  virtual void do_activations_from_host(Act* x, const float* host, size_t n) = 0;
  virtual double do_sum_squares(const float* x, size_t n) = 0;
  // upload() and reserve_uploads() as each backend does them.
  virtual void do_upload(void* dst, const void* src_host, size_t bytes) = 0;
  virtual void do_reserve_uploads(size_t /*bytes*/) {}

 private:
  uint64_t host_syncs_ = 0;
  size_t upload_reserve_ = 0;
  uint64_t uploads_beyond_reserve_ = 0;
};

// The CPU backend (kernels/cpu). Threads: OpenMP's one pool, shared with the GEMM library.
// Precision::bf16 emulates mixed precision: activations stay in float memory but every
// activation a kernel writes, and the compute copy of the weights, is rounded to bf16,
// so the model's mixed-precision path runs, and is tested, without a GPU.
std::unique_ptr<Kernels> make_cpu_kernels(Precision precision = Precision::fp32);

// The CUDA backend (kernels/cuda), on the current device; UsageError when this build has
// no CUDA or the machine no GPU.
std::unique_ptr<Kernels> make_cuda_kernels(Precision precision);
bool cuda_compiled_in();
// GPUs this process can use: 0 in a build without CUDA or on a machine without GPUs.
int cuda_device_count();
// Makes GPU (local_rank mod GPUs on the machine) this process's device; UsageError
// without CUDA or GPUs.
void select_cuda_device(int local_rank);

// "cpu" or "cuda".
std::unique_ptr<Kernels> make_kernels(Device device, Precision precision);

// For code that knows its backend stores fp32 (the CPU backend, its tests).
inline Act* as_act(float* p) { return reinterpret_cast<Act*>(p); }
inline const Act* as_act(const float* p) { return reinterpret_cast<const Act*>(p); }
inline float* as_float(Act* p) { return reinterpret_cast<float*>(p); }
inline const float* as_float(const Act* p) { return reinterpret_cast<const float*>(p); }

}  // namespace trident::kernels
