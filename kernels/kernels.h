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

  // ---- embeddings (the token table may be a vocabulary shard) ----
  // out[b,t,:] = wte_shard[tokens[b,t] - vocab_start,:] when the token lies in the shard's
  // rows [vocab_start, vocab_start + shard_rows), else 0 (another shard supplies it).
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte_shard, int vocab_start,
                                 int shard_rows, int B, int T, int C) = 0;
  // dwte_shard[tokens[b,t] - vocab_start,:] += dout[b,t,:] for the shard's tokens
  virtual void embedding_backward(float* dwte_shard, const float* dout, const int32_t* tokens, int vocab_start,
                                  int shard_rows, int B, int T, int C) = 0;
  // out[b,t,:] += wpe[t,:]
  virtual void add_positions(float* out, const float* wpe, int B, int T, int C) = 0;
  // dwpe[t,:] += sum over b of dout[b,t,:]
  virtual void positions_backward(float* dwpe, const float* dout, int B, int T, int C) = 0;

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

  // ---- softmax cross-entropy, vocabulary-parallel ----
  // Each rank holds logits[N, Vs] for the vocabulary ids [vocab_start, vocab_start + Vs),
  // of which the first `valid` columns are real words (the rest is padding, masked).
  // The full-vocabulary softmax is assembled from per-shard partials combined by the
  // caller: row max (all-reduce max), then sum of exp and the target's logit (all-reduce
  // sum), so the full logits are never gathered.
  virtual void logits_row_max(float* row_max, const float* logits, int N, int valid, int Vs) = 0;
  // sum_and_target[i] = sum_j exp(logits[i,j] - row_max[i]) over the shard's valid columns;
  // sum_and_target[N + i] = logits[i, targets[i] - vocab_start] if the target is in the shard, else 0.
  virtual void logits_sum_exp_and_target(float* sum_and_target, const float* logits, const float* row_max,
                                         const int32_t* targets, int vocab_start, int N, int valid, int Vs) = 0;
  // losses[i] = lse[i] - target logit, lse[i] = row_max[i] + log(sum[i]), from the combined partials.
  virtual void cross_entropy_loss(float* losses, float* lse, const float* row_max, const float* sum_and_target,
                                  int N) = 0;
  // logits replaced in place by dloss * (softmax - onehot) on the shard; padded columns get 0.
  virtual void cross_entropy_backward(float* logits_to_dlogits, const float* lse, const int32_t* targets,
                                      int vocab_start, int N, int valid, int Vs, float dloss) = 0;

  // ---- optimizer ----
  // AdamW as PyTorch does it (shared/reference/FORMAT.md): g = grad * grad_scale;
  // p *= 1 - lr*weight_decay; m,v moments; bias correction with step t (from 1).
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                            float beta1, float beta2, float eps, float weight_decay, int t,
                            float grad_scale) = 0;
  // sum of x[i]^2, accumulated in double
  virtual double sum_squares(const float* x, size_t n) = 0;
  // Measured rate of this backend's GEMM on n x n float matrices, in GFLOP/s, over
  // about `seconds`: the peak that MFU and the benchmarks compare against.
  virtual double measure_gemm_gflops(int n, double seconds) = 0;
};

// The CPU backend (kernels/cpu). Threads: OpenMP's one pool, shared with the GEMM library.
std::unique_ptr<Kernels> make_cpu_kernels();

}  // namespace trident::kernels
