// The CUDA kernels behind kernels/cuda/cuda_backend.cu, as launchers over the element
// type T of activations (float, or bf16 under mixed precision). Semantics of each:
// kernels/ops.def; an op's launcher is named as the op and takes its arguments (plus
// scratch memory for the ops WITH_WORKSPACE). All run on compute_stream().
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cuda_common.cuh"
#include "kernels/attention_mask.h"
#include "kernels/cuda/cuda_sizes.h"

namespace trident::kernels::cuda {

// The cuBLASLt workspace, allocated once per process on first use (before the first
// step: reserve_workspace()).
size_t gemm_workspace_bytes();
void* gemm_workspace();

// Row-major C[M,N] = op(A)[M,K] @ op(B)[K,N] (+ bias[N] on every row) (+ C when
// `accumulate`), through cuBLASLt with fp32 accumulation. TC is T, or float for
// parameter gradients.
template <typename T, typename TC>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, const T* A, const T* B, TC* C, const T* bias,
          bool accumulate);
// Problems of gemm()'s form as one cuBLAS grouped batched GEMM: problem i is M[i] x N[i]
// x K[i]; device_pointers (device memory) holds the count A's, then the B's, then the C's.
// Returns false, having done nothing, where cuBLAS has no grouped GEMM for these types or
// none at all (before 12.5): the caller runs gemm() per problem.
// Whether this cuBLAS has the grouped GEMM's entry point at all (cuBLAS 12.5 or later).
bool grouped_gemm_available();
template <typename T, typename TC>
bool grouped_gemm(bool trans_a, bool trans_b, int count, const int* M, const int* N, const int* K,
                  const void* const* device_pointers, bool accumulate);
// The linear layer's forward: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC].
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC) {
  gemm<T, T>(false, true, N, OC, C, inp, weight, out, bias, false);
}
// out[N,OC] = inp[N,C] @ weight[OC,C]^T in fp32 (the accumulator kept).
template <typename T>
void matmul_forward_f32(float* out, const T* inp, const T* weight, int N, int C, int OC) {
  gemm<T, float>(false, true, N, OC, C, inp, weight, out, nullptr, false);
}
// bias_grad[j] += sum over rows of x[N,OC] column j, in fp32 and a fixed order (row
// chunks on separate blocks, then their sums); scratch: column_sums_scratch_floats(OC).
size_t column_sums_scratch_floats(int OC);
template <typename T>
void column_sums(float* bias_grad, const T* x, int N, int OC, float* scratch);

template <typename T>
void cast(T* out, const float* in, size_t n);
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte_shard, int vocab_start, int shard_rows, int B,
                       int T_, int C);
// positions_of: for every token of the shard with a row in `rows`, its positions in
// order (CSR: row_starts[i]..row_starts[i+1]); built on the host so that the sum is
// deterministic.
template <typename T>
void embedding_backward(float* dwte_shard, const T* dout, const int32_t* rows, const int32_t* row_starts,
                        const int32_t* positions, int distinct_rows, int C);
template <typename T>
void add_positions(T* out, const T* wpe, const int32_t* positions, int B, int T_, int C);
template <typename T>
void positions_backward(float* dwpe, const T* dout, const int32_t* positions, int B, int T_, int C);

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       float eps);
// scratch: layernorm_backward_scratch_floats(N, C) floats of device memory.
size_t layernorm_backward_scratch_floats(int N, int C);
template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, float* scratch);

// RMSNorm; scratch: rmsnorm_backward_scratch_floats(N, C) floats of device memory.
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps);
size_t rmsnorm_backward_scratch_floats(int N, int C);
template <typename T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, const float* rstd, int N,
                      int C, float* scratch);

// Rotary embeddings, in place on the q and k heads of qkv rows [q NH | k NKV | v NKV] x HD.
template <typename T>
void rope_forward(T* qkv, const float* rope_table, int B, int T_, int NH, int NKV, int HD);
template <typename T>
void rope_backward(T* dqkv, const float* rope_table, int B, int T_, int NH, int NKV, int HD);

// Flash attention with grouped-query attention (query head h reads key/value head
// h / (NH / NKV)): lse[B,NH,T] is each query row's log-sum-exp (of the scaled scores).
// bf16 with head dimension 32, 64 or 128 runs on tensor cores (attention_tensor_core.cu)
// unless TRIDENT_CUDA_ATTENTION=scalar; everything else on the scalar kernels
// (attention.cu).
// Signatures as kernels/ops.def (the mask: kernels/attention_mask.h).
template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, const T* kv, int kv_ld, AttentionMask mask, int B, int Tq,
                       int Tk, int NH, int NKV, int HD);
// scratch: B*NH*Tq floats (the rows' dO . O).
template <typename T>
void attention_backward(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv, int kv_ld, const T* out,
                        const float* lse, AttentionMask mask, int B, int Tq, int Tk, int NH, int NKV, int HD,
                        float* scratch);

bool use_tensor_core_attention(int HD);
void check_attention_grid(int B, int NH);
bool tensor_core_attention_supports(int HD);
// Whether a call's buffers and kv_ld allow the tensor-core kernels' 16-byte loads (else
// the scalar kernels run).
bool tensor_core_attention_aligned(std::initializer_list<const void*> buffers, int kv_ld);
void tensor_core_attention_forward(bf16* out, float* lse, const bf16* qkv, const bf16* kv, int kv_ld,
                                   AttentionMask mask, int B, int Tq, int Tk, int NH, int NKV, int HD);
// delta: each query row's dO . O (from attention_backward).
void tensor_core_attention_backward(bf16* dqkv, bf16* dkv, const bf16* dout, const bf16* qkv, const bf16* kv,
                                    int kv_ld, const float* lse, const float* delta, AttentionMask mask, int B,
                                    int Tq, int Tk, int NH, int NKV, int HD);

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
void add(T* out, const T* a, const T* b, size_t n);
template <typename T>
void copy_columns(T* dst, int dst_ld, const T* src, int src_ld, int rows, int width);
template <typename T>
void attention_combine(T* out, float* lse, const T* part, const float* part_lse, int B, int T_, int NH, int HD);
inline void add_f32(float* out, const float* in, size_t n) { add<float>(out, out, in, n); }

template <typename T>
void logits_row_max(float* row_max, const T* logits, int N, int valid, int Vs);
template <typename T>
void logits_sum_exp_and_target(float* sum_and_target, const T* logits, const float* row_max, const int32_t* targets,
                               int vocab_start, int N, int valid, int Vs);
void cross_entropy_loss(float* losses, float* lse, const float* row_max, const float* sum_and_target, int N);
template <typename T>
void cross_entropy_backward(T* logits_to_dlogits, const float* lse, const int32_t* targets, int vocab_start, int N,
                            int valid, int Vs, float dloss);

void moe_permute(int32_t* rows, float* counts, const int32_t* experts, int NK, int E);
void moe_balance_statistics(float* stats, float* token_totals, const int32_t* experts, const float* probs, int N,
                            int T, int E, int K, bool sigmoid);
void moe_balance_loss(float* coefficients, double* loss_sum, const float* stats, const float* lse, int sequences,
                      int N, int E, int K, int seq_len, double aux_coef, double z_coef, bool with_aux);

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int t, float grad_scale);
void lion_update(float* param, const float* grad, float* m, size_t n, float lr, float beta1, float beta2,
                 float weight_decay, float grad_scale);
// *total += sum of x[i] (squares: of x[i]^2): partial sums into `partials`
// (sum_partials() doubles), then one block adds them in order into *total.
int sum_partials();
void accumulate_sum(double* total, double* partials, const float* x, size_t n, bool squares);

}  // namespace trident::kernels::cuda
