// The compute-kernel API of trident: one interface, implemented by kernels/cpu
// (BLAS + vectorized C++) and kernels/cuda (cuBLASLt + CUDA). Kernels know no ranks, no
// layers and no files; the model calls them through a `Kernels&` so one model runs on
// either device, in either precision.
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

#include "kernels/dtype.h"
#include "kernels/footprint.h"

namespace trident::kernels {

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
  virtual void upload(void* dst, const void* src_host, size_t bytes) = 0;
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

  // ---- embeddings (the token table may be a vocabulary shard) ----
  // out[b,t,:] = wte_shard[tokens[b,t] - vocab_start,:] when the token lies in the shard's
  // rows [vocab_start, vocab_start + shard_rows), else 0 (another shard supplies it).
  virtual void embedding_forward(Act* out, const int32_t* tokens, const Act* wte_shard, int vocab_start,
                                 int shard_rows, int B, int T, int C) = 0;
  // dwte_shard[tokens[b,t] - vocab_start,:] += dout[b,t,:] for the shard's tokens.
  // host_tokens: the same ids in host memory (a GPU groups the positions by token there,
  // without reading `tokens` back).
  virtual void embedding_backward(float* dwte_shard, const Act* dout, const int32_t* tokens,
                                  const int32_t* host_tokens, int vocab_start, int shard_rows, int B, int T,
                                  int C) = 0;
  // out[b,t,:] += wpe[t,:]
  virtual void add_positions(Act* out, const Act* wpe, int B, int T, int C) = 0;
  // dwpe[t,:] += sum over b of dout[b,t,:]
  virtual void positions_backward(float* dwpe, const Act* dout, int B, int T, int C) = 0;

  // ---- LayerNorm over the last dimension (biased variance) ----
  // Saves mean and 1/std per row for the backward pass.
  virtual void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp,
                                 const Act* weight, const Act* bias, int N, int C, float eps) = 0;
  // dinp += ..., dweight += ..., dbias += ...  (dinp accumulates: it is the residual stream)
  virtual void layernorm_backward(Act* dinp, float* dweight, float* dbias, const Act* dout,
                                  const Act* inp, const Act* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;

  // ---- linear layer: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be null) ----
  virtual void matmul_forward(Act* out, const Act* inp, const Act* weight, const Act* bias,
                              int N, int C, int OC) = 0;
  // dinp = dout @ weight (overwritten; skipped when null); dweight += dout^T @ inp;
  // dbias += column sums of dout (skipped when null).
  virtual void matmul_backward(Act* dinp, float* dweight, float* dbias, const Act* dout,
                               const Act* inp, const Act* weight, int N, int C, int OC) = 0;

  // ---- RMSNorm over the last dimension (Llama): out = inp * rsqrt(mean(inp^2) + eps) * weight ----
  // Saves 1/rms per row for the backward pass.
  virtual void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* weight, int N, int C,
                               float eps) = 0;
  // dinp += ..., dweight += ...  (dinp accumulates: it is the residual stream)
  virtual void rmsnorm_backward(Act* dinp, float* dweight, const Act* dout, const Act* inp, const Act* weight,
                                const float* rstd, int N, int C) = 0;

  // ---- the fused attention input qkv[B, T, (NH + 2 NKV) HD]: per row q | k | v ----
  // q holds NH query heads, k and v NKV key/value heads each (grouped-query attention:
  // query head h reads key/value head h / (NH / NKV); NKV == NH is plain multi-head,
  // NKV == 1 multi-query). Head h of q is columns h*HD .. (h+1)*HD.

  // Rotary position embeddings, rotate-half convention (Hugging Face's Llama), in place
  // on the q and k heads; rope_table[T, HD/2, 2] holds cos and sin of t * frequency_i
  // (the caller computes the frequencies, scaled or not).
  virtual void rope_forward(Act* qkv, const float* rope_table, int B, int T, int NH, int NKV, int HD) = 0;
  // The transposed rotation, in place on dqkv: d loss / d (q, k before the rotation).
  virtual void rope_backward(Act* dqkv, const float* rope_table, int B, int T, int NH, int NKV, int HD) = 0;

  // Causal self-attention: out[B,T,NH*HD] = softmax(q k^T / sqrt(HD), causal) v per query
  // head. `stats` keeps what the backward pass needs besides qkv and out,
  // attention_stats_floats() of it (Footprint).
  virtual void attention_forward(Act* out, float* stats, const Act* qkv, int B, int T, int NH, int NKV,
                                 int HD) = 0;
  // dqkv = gradient w.r.t. qkv (overwritten; dk and dv summed over the query heads that
  // share them); out is the forward's output.
  virtual void attention_backward(Act* dqkv, const Act* dout, const Act* qkv, const Act* out, const float* stats,
                                  int B, int T, int NH, int NKV, int HD) = 0;

  // ---- GELU, tanh approximation ----
  virtual void gelu_forward(Act* out, const Act* inp, size_t n) = 0;
  // dinp = gelu'(inp) * dout (overwritten)
  virtual void gelu_backward(Act* dinp, const Act* inp, const Act* dout, size_t n) = 0;

  // ---- SwiGLU (Llama's MLP): out[N,F] = silu(gate) * up, each row of gate_up[N,2F] = gate | up ----
  virtual void swiglu_forward(Act* out, const Act* gate_up, int N, int F) = 0;
  // dgate_up = gradient w.r.t. gate_up (overwritten; a buffer apart from dout)
  virtual void swiglu_backward(Act* dgate_up, const Act* gate_up, const Act* dout, int N, int F) = 0;

  // out = a + b
  virtual void add(Act* out, const Act* a, const Act* b, size_t n) = 0;

  // ---- softmax cross-entropy, vocabulary-parallel ----
  // Each rank holds logits[N, Vs] for the vocabulary ids [vocab_start, vocab_start + Vs),
  // of which the first `valid` columns are real words (the rest is padding, masked).
  // The full-vocabulary softmax is assembled from per-shard partials combined by the
  // caller: row max (all-reduce max), then sum of exp and the target's logit (all-reduce
  // sum), so the full logits are never gathered.
  virtual void logits_row_max(float* row_max, const Act* logits, int N, int valid, int Vs) = 0;
  // sum_and_target[i] = sum_j exp(logits[i,j] - row_max[i]) over the shard's valid columns;
  // sum_and_target[N + i] = logits[i, targets[i] - vocab_start] if the target is in the shard, else 0.
  virtual void logits_sum_exp_and_target(float* sum_and_target, const Act* logits, const float* row_max,
                                         const int32_t* targets, int vocab_start, int N, int valid, int Vs) = 0;
  // losses[i] = lse[i] - target logit, lse[i] = row_max[i] + log(sum[i]), from the combined partials.
  virtual void cross_entropy_loss(float* losses, float* lse, const float* row_max, const float* sum_and_target,
                                  int N) = 0;
  // logits replaced in place by dloss * (softmax - onehot) on the shard; padded columns get 0.
  virtual void cross_entropy_backward(Act* logits_to_dlogits, const float* lse, const int32_t* targets,
                                      int vocab_start, int N, int valid, int Vs, float dloss) = 0;

  // ---- optimizer ----
  // AdamW as PyTorch does it (shared/reference/FORMAT.md): g = grad * grad_scale;
  // p *= 1 - lr*weight_decay; m,v moments; bias correction with step t (from 1).
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                            float beta1, float beta2, float eps, float weight_decay, int t,
                            float grad_scale) = 0;
  // out[i] += in[i] (fp32: gradient shards summed over micro-batches)
  virtual void add_f32(float* out, const float* in, size_t n) = 0;
  // *total += sum of x[i] (or of x[i]^2), accumulated in double; `total` is this
  // backend's memory. Not blocking: a step sums its losses and its gradient norm on the
  // device and reads them once.
  virtual void accumulate_sum(double* total, const float* x, size_t n) = 0;
  virtual void accumulate_sum_squares(double* total, const float* x, size_t n) = 0;
  // sum of x[i]^2, accumulated in double, on the host (blocking).
  double sum_squares(const float* x, size_t n) {
    host_syncs_++;
    return do_sum_squares(x, n);
  }
  // Measured rate of this backend's GEMM on n x n matrices of the activation type, in GFLOP/s, over
  // about `seconds`: the peak that MFU and the benchmarks compare against.
  virtual double measure_gemm_gflops(int n, double seconds) = 0;

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

 private:
  uint64_t host_syncs_ = 0;
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
