// CPU kernels as templates over the element type: float for training, double for
// the finite-difference tests. Semantics of each function: kernels/ops.def.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention_mask.h"

namespace trident::kernels::cpu {

// Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C. float goes to oneDNN's
// sgemm (AVX-512 JIT kernels, OpenMP threads; run single-threaded when called from
// inside a parallel region); double to a plain loop for tests.
template <typename T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc);

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte_shard, int vocab_start, int shard_rows, int B,
                       int T_, int C);
template <typename T>
void embedding_backward(T* dwte_shard, const T* dout, const int32_t* tokens, int vocab_start, int shard_rows, int B,
                        int T_, int C);
template <typename T>
void add_positions(T* out, const T* wpe, const int32_t* positions, int B, int T_, int C);
template <typename T>
void positions_backward(T* dwpe, const T* dout, const int32_t* positions, int B, int T_, int C);

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N,
                       int C, T eps);
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int N, int C);

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC);
// out = inp @ weight^T, fp32 out (the CPU's activations are fp32; bf16 runs emulate the
// rounding of the Act outputs only, so these stay unrounded).
inline void matmul_forward_f32(float* out, const float* inp, const float* weight, int N, int C, int OC) {
  matmul_forward<float>(out, inp, weight, nullptr, N, C, OC);
}
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int C, int OC);

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, T eps);
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int N,
                      int C);

template <typename T>
void rope_forward(T* qkv, const T* table, int B, int T_, int NH, int NKV, int HD);
template <typename T>
void rope_backward(T* dqkv, const T* table, int B, int T_, int NH, int NKV, int HD);

// Flash-attention style (kernels/ops.def): stats = each row's log-sum-exp [B, NH, Tq];
// backward recomputes the probabilities from it.
template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, const T* kv, int kv_ld, const AttentionMask& mask, int B,
                       int Tq, int Tk, int NH, int NKV, int HD);
template <typename T>
void attention_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv, int kv_ld, const T* out,
                        const T* lse, const AttentionMask& mask, int B, int Tq, int Tk, int NH, int NKV, int HD);
// Plain causal attention of a whole sequence (positions 0..T-1, keys in qkv): for tests.
template <typename T>
void attention_forward(T* out, T* lse, const T* qkv, int B, int T_, int NH, int NKV, int HD);
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B, int T_, int NH,
                        int NKV, int HD);
template <typename T>
void attention_combine(T* out, T* lse, const T* part, const T* part_lse, int B, int T_, int NH, int HD);
template <typename T>
void copy_columns(T* dst, int dst_ld, const T* src, int src_ld, int rows, int width);
// What attention keeps per thread (a chunk of rows of scores and of their gradients).
size_t attention_scratch_floats(int Tk);

template <typename T>
void gelu_forward(T* out, const T* inp, size_t n);
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n);

template <typename T>
void moe_router_forward(float* probs, float* lse, int32_t* experts, float* weights, const T* logits,
                        const float* bias, int N, int E, int K, bool renormalize, bool sigmoid);
template <typename T>
void moe_router_backward(T* dlogits, const float* probs, const float* lse, const int32_t* experts,
                         const float* weights, const float* dweights, const float* balance, int tokens_per_sequence,
                         float aux_scale, float z_scale, int N, int E, int K, bool renormalize, bool sigmoid);
template <typename T>
void moe_dispatch(T* routed, const T* x, const int32_t* rows, int N, int K, int C);
template <typename T>
void moe_dispatch_backward(T* dx, const T* drouted, const int32_t* rows, int N, int K, int C);
template <typename T>
void moe_combine(T* out, const T* expert_out, const float* weights, const int32_t* rows, int N, int K, int C);
template <typename T>
void moe_combine_backward(T* dexpert_out, float* dweights, const T* dout, const T* expert_out, const float* weights,
                          const int32_t* rows, int N, int K, int C);
template <typename T>
void swiglu_forward(T* out, const T* gate_up, int N, int F);
template <typename T>
void swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, int N, int F);

template <typename T>
void logits_row_max(T* row_max, const T* logits, int N, int valid, int Vs);
template <typename T>
void logits_sum_exp_and_target(T* sum_and_target, const T* logits, const T* row_max, const int32_t* targets,
                               int vocab_start, int N, int valid, int Vs);
template <typename T>
void cross_entropy_loss(T* losses, T* lse, const T* row_max, const T* sum_and_target, int N);
template <typename T>
void cross_entropy_backward(T* logits_to_dlogits, const T* lse, const int32_t* targets, int vocab_start, int N,
                            int valid, int Vs, T dloss);

template <typename T>
void adamw_update(T* param, const T* grad, T* m, T* v, size_t n, T lr, T beta1, T beta2, T eps,
                  T weight_decay, int t, T grad_scale);

void moe_permute(int32_t* rows, float* counts, const int32_t* experts, int NK, int E);
void moe_balance_statistics(float* stats, float* token_totals, const int32_t* experts, const float* probs, int N,
                            int T, int E, int K, bool sigmoid);
void moe_balance_loss(float* coefficients, double* loss_sum, const float* stats, const float* lse, int sequences,
                      int N, int E, int K, int seq_len, double aux_coef, double z_coef, bool with_aux);

template <typename T>
void lion_update(T* param, const T* grad, T* m, size_t n, T lr, T beta1, T beta2, T weight_decay, T grad_scale);

template <typename T>
double sum_squares(const T* x, size_t n);
double sum(const float* x, size_t n);

}  // namespace trident::kernels::cpu
