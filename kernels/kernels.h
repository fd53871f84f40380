// The compute-kernel API of trident: one interface, implemented by kernels/cpu
// (BLAS + vectorized C++) and, later, kernels/cuda. Kernels know no ranks, no layers
// and no files; the model calls them through a `Kernels&` so one model runs on
// either device.
//
// Conventions (all tensors row-major, float32, in the backend's memory):
//   N = rows (B*T tokens), C = channels, OC = output channels, V = real vocabulary,
//   Vp = padded vocabulary (row stride of logits and of wte), NH = heads.
//   Outputs named `out`/`dinp` are overwritten unless the comment says "+=".
//   Gradients of parameters (dweight, dbias, dwte, ...) are always accumulated (+=),
//   so gradient accumulation over micro-batches needs no extra buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace trident::kernels {

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual std::string name() const = 0;

  // ---- memory (device memory of this backend) ----
  // Returns zero-filled memory that stays valid until free(); pages are touched
  // once here so that the training loop never pays first-touch costs.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src_host, size_t bytes) = 0;
  virtual void copy_to_host(void* dst_host, const void* src, size_t bytes) = 0;
  virtual void fill_zero(float* p, size_t n) = 0;

  // ---- embeddings ----
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
  virtual void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                               int B, int T, int C) = 0;
  // dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                int B, int T, int C) = 0;

  // ---- LayerNorm over the last dimension (biased variance) ----
  // Saves mean and 1/std per row for the backward pass.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C, float eps) = 0;
  // dinp += ..., dweight += ..., dbias += ...  (dinp accumulates: it is the residual stream)
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;

  // ---- linear layer: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be null) ----
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                              int N, int C, int OC) = 0;
  // dinp = dout @ weight (overwritten; skipped when null); dweight += dout^T @ inp;
  // dbias += column sums of dout (skipped when null).
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int C, int OC) = 0;

  // ---- causal self-attention on the fused qkv[B,T,3C] (q | k | v, head h = cols h*hd..) ----
  // out[B,T,C] = softmax(q k^T / sqrt(hd), causal) v per head; probs[B,NH,T,T] saved
  // for the backward pass (only its lower triangle is written and read).
  virtual void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int C,
                                 int NH) = 0;
  // dqkv = gradient w.r.t. qkv (overwritten).
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* probs, int B, int T, int C, int NH) = 0;

  // ---- GELU, tanh approximation ----
  virtual void gelu_forward(float* out, const float* inp, size_t n) = 0;
  // dinp = gelu'(inp) * dout (overwritten)
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) = 0;

  // out = a + b
  virtual void add(float* out, const float* a, const float* b, size_t n) = 0;

  // ---- softmax cross-entropy over the first V of Vp logits per row ----
  // losses[i] = -log softmax(logits[i,:V])[targets[i]]
  virtual void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                                     int N, int V, int Vp) = 0;
  // Fused: losses as above, and logits are replaced in place by
  // dloss * d losses[i] / d logits = dloss * (softmax - onehot); padded columns get 0.
  virtual void cross_entropy_backward(float* losses, float* logits_to_dlogits,
                                      const int32_t* targets, int N, int V, int Vp, float dloss) = 0;

  // ---- optimizer ----
  // AdamW as PyTorch does it (shared/reference/FORMAT.md): g = grad * grad_scale;
  // p *= 1 - lr*weight_decay; m,v moments; bias correction with step t (from 1).
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                            float beta1, float beta2, float eps, float weight_decay, int t,
                            float grad_scale) = 0;
  // sum of x[i]^2, accumulated in double
  virtual double sum_squares(const float* x, size_t n) = 0;
  // x *= s
  virtual void scale(float* x, size_t n, float s) = 0;

  // Measured rate of this backend's GEMM on n x n float matrices, in GFLOP/s, over
  // about `seconds`: the peak that MFU and the benchmarks compare against.
  virtual double measure_gemm_gflops(int n, double seconds) = 0;
};

// The CPU backend (kernels/cpu). Threads: OpenMP's one pool, shared with the GEMM library.
std::unique_ptr<Kernels> make_cpu_kernels();

}  // namespace trident::kernels
