// A mixture of experts' bookkeeping between the router and the experts, on the device so
// that a layer's only trip to the host is its experts' row counts (the grouped GEMMs need
// them there): the dropless permutation (a count per expert, then each pair's row) and
// the balance loss's statistics, coefficients and value. Every sum has a fixed order (no
// atomics): a run gives the same rows and losses every time. Semantics: kernels/ops.def.
#include "../moe_router.h"
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr unsigned kBlock = 1024;  // the permutation's: one block per expert
constexpr unsigned kWarps = kBlock / 32;

// counts[e] = the pairs that chose e: block e counts them, a fixed reduction.
__global__ void count_pairs_kernel(float* counts, const int32_t* experts, int NK) {
  const int e = blockIdx.x;
  int n = 0;
  for (int i = threadIdx.x; i < NK; i += blockDim.x) n += experts[i] == e;
  for (int offset = 16; offset > 0; offset /= 2) n += __shfl_down_sync(0xffffffffu, n, offset);
  __shared__ int warp_counts[kWarps];
  if (threadIdx.x % 32 == 0) warp_counts[threadIdx.x / 32] = n;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (unsigned w = 0; w < kWarps; w++) total += warp_counts[w];
    counts[e] = static_cast<float>(total);
  }
}

// Block e gives each pair that chose e its row: the group's first row (the counts of the
// experts before e) plus the pairs of e before it, found 1024 pairs at a time by a ballot
// per warp and a scan of the warps' counts.
__global__ void pair_rows_kernel(int32_t* rows, const float* counts, const int32_t* experts, int NK) {
  const int e = blockIdx.x;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __shared__ int first_row;
  __shared__ int warp_offsets[kWarps + 1];
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int before = 0; before < e; before++) sum += static_cast<int>(counts[before]);
    first_row = sum;
  }
  __syncthreads();
  int next = first_row;  // the row of e's next pair, the same in every thread
  for (int base = 0; base < NK; base += kBlock) {
    const int i = base + static_cast<int>(threadIdx.x);
    const bool mine = i < NK && experts[i] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_offsets[warp + 1] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
      warp_offsets[0] = 0;
      for (unsigned w = 1; w <= kWarps; w++) warp_offsets[w] += warp_offsets[w - 1];
    }
    __syncthreads();
    if (mine) rows[i] = next + warp_offsets[warp] + __popc(ballot & ((1u << lane) - 1));
    next += warp_offsets[kWarps];
    __syncthreads();  // warp_offsets is rewritten by the next chunk
  }
}

__global__ void sigmoid_totals_kernel(float* totals, const float* logits, int N, int E) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const float* l = logits + static_cast<size_t>(t) * E;
  float total = 0;
  for (int e = 0; e < E; e++) total += sigmoid_score(l[e]);
  totals[t] = total;
}

// A thread per (sequence, expert), over the sequence's tokens in order: the reads of a
// token's row are coalesced over the block's experts.
__global__ void balance_statistics_kernel(float* stats, const float* totals, const int32_t* experts,
                                          const float* probs, int T, int E, int K, bool sigmoid) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
  if (e >= E) return;
  float count = 0, sum = 0;
  const size_t first = static_cast<size_t>(b) * T;
#pragma unroll 4
  for (size_t t = first; t < first + T; t++) {
    for (int j = 0; j < K; j++) count += experts[t * K + j] == e ? 1.0f : 0.0f;
    const float p = probs[t * E + e];
    sum += sigmoid ? sigmoid_score(p) / totals[t] : p;
  }
  float* s = stats + static_cast<size_t>(b) * 2 * E;
  s[e] = count;
  s[E + e] = sum;
}

constexpr unsigned kLossThreads = 256;

// One block: the coefficients, and the losses' two sums in double, reduced in a fixed order.
__global__ void balance_loss_kernel(float* coefficients, double* loss_sum, const float* stats, const float* lse,
                                    int sequences, int N, int E, int K, int seq_len, double aux_coef, double z_coef,
                                    bool with_aux) {
  const double T = seq_len;
  double aux = 0, z = 0;
  const int pairs = sequences * E;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int b = i / E, e = i % E;
    const float* s = stats + static_cast<size_t>(b) * 2 * E;
    aux += aux_coef * E / (K * T * T) * s[e] * s[E + e];
    coefficients[i] = static_cast<float>(aux_coef * E / (K * T) * s[e]);
  }
  if (loss_sum == nullptr) return;
  for (int t = threadIdx.x; t < N; t += blockDim.x) z += static_cast<double>(lse[t]) * lse[t];
  __shared__ double aux_parts[kLossThreads], z_parts[kLossThreads];
  aux_parts[threadIdx.x] = aux;
  z_parts[threadIdx.x] = z;
  __syncthreads();
  for (unsigned half = kLossThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      aux_parts[threadIdx.x] += aux_parts[threadIdx.x + half];
      z_parts[threadIdx.x] += z_parts[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss_sum += (with_aux ? aux_parts[0] : 0.0) + z_coef * z_parts[0] / T;
}

}  // namespace

void moe_permute(int32_t* rows, float* counts, const int32_t* experts, int NK, int E) {
  if (E <= 0) return;
  count_pairs_kernel<<<E, kBlock, 0, compute_stream()>>>(counts, experts, NK);
  CUDA_CHECK_LAUNCH();
  if (NK <= 0) return;
  pair_rows_kernel<<<E, kBlock, 0, compute_stream()>>>(rows, counts, experts, NK);
  CUDA_CHECK_LAUNCH();
}

void moe_balance_statistics(float* stats, float* token_totals, const int32_t* experts, const float* probs, int N,
                            int T, int E, int K, bool sigmoid) {
  if (N <= 0 || E <= 0) return;
  if (sigmoid) {
    sigmoid_totals_kernel<<<blocks_for(N, 256), 256, 0, compute_stream()>>>(token_totals, probs, N, E);
    CUDA_CHECK_LAUNCH();
  }
  const dim3 grid((E + 127) / 128, N / T);
  balance_statistics_kernel<<<grid, 128, 0, compute_stream()>>>(stats, token_totals, experts, probs, T, E, K, sigmoid);
  CUDA_CHECK_LAUNCH();
}

void moe_balance_loss(float* coefficients, double* loss_sum, const float* stats, const float* lse, int sequences,
                      int N, int E, int K, int seq_len, double aux_coef, double z_coef, bool with_aux) {
  if (sequences <= 0 || E <= 0) return;
  balance_loss_kernel<<<1, kLossThreads, 0, compute_stream()>>>(coefficients, loss_sum, stats, lse, sequences, N, E,
                                                                K, seq_len, aux_coef, z_coef, with_aux);
  CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
