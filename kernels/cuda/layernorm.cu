// Fused LayerNorm: forward in one pass per row (one warp per row, statistics in fp32);
// backward computes each row's input gradient in one kernel that also sums the
// weight/bias gradients of its rows into a per-block slot, then adds the slots in order
// (deterministic, no atomics).
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kBackwardBlocks = cuda_sizes::kNormBackwardBlocks;

template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                         const T* bias, int N, int C, float eps) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const T* x = inp + static_cast<size_t>(row) * C;
  float sum = 0.0f;
  for (int i = lane; i < C; i += 32) sum += to_float(x[i]);
  const float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float d = to_float(x[i]) - m;
    var += d * d;
  }
  const float s = rsqrtf(warp_sum(var) / C + eps);
  T* o = out + static_cast<size_t>(row) * C;
  for (int i = lane; i < C; i += 32)
    o[i] = from_float<T>((to_float(x[i]) - m) * s * to_float(weight[i]) + to_float(bias[i]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// One warp per block; block b takes rows b, b + gridDim.x, ... and keeps the sums of
// dout * xhat and dout over them for its columns in shared memory.
template <typename T>
__global__ void layernorm_backward_kernel(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                          const float* mean, const float* rstd, int N, int C) {
  extern __shared__ float sums[];  // [2C]: dweight then dbias
  const int lane = threadIdx.x;
  for (int i = lane; i < 2 * C; i += 32) sums[i] = 0.0f;
  __syncwarp();
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * C;
    const float m = mean[row], s = rstd[row];
    // dxhat = dout * w; dinp += s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int i = lane; i < C; i += 32) {
      const float xhat = (to_float(inp[base + i]) - m) * s, g = to_float(dout[base + i]);
      const float dxhat = g * to_float(weight[i]);
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
      sums[i] += g * xhat;
      sums[C + i] += g;
    }
    const float mean_dxhat = warp_sum(sum_dxhat) / C, mean_dxhat_xhat = warp_sum(sum_dxhat_xhat) / C;
    for (int i = lane; i < C; i += 32) {
      const float xhat = (to_float(inp[base + i]) - m) * s;
      const float dxhat = to_float(dout[base + i]) * to_float(weight[i]);
      dinp[base + i] =
          from_float<T>(to_float(dinp[base + i]) + s * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat));
    }
  }
  __syncwarp();
  for (int i = lane; i < 2 * C; i += 32) partials[static_cast<size_t>(blockIdx.x) * 2 * C + i] = sums[i];
}

__global__ void layernorm_weight_grads_kernel(float* dweight, float* dbias, const float* partials, int slots, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 2 * C) return;
  float sum = 0.0f;
  for (int b = 0; b < slots; b++) sum += partials[static_cast<size_t>(b) * 2 * C + i];
  if (i < C) dweight[i] += sum;
  else dbias[i - C] += sum;
}

int backward_blocks(int N) { return N < kBackwardBlocks ? N : kBackwardBlocks; }

}  // namespace

size_t layernorm_backward_scratch_floats(int N, int C) { return static_cast<size_t>(backward_blocks(N)) * 2 * C; }

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       float eps) {
  const unsigned blocks = blocks_for(N, kWarpsPerBlock);
  layernorm_forward_kernel<T><<<blocks, 32 * kWarpsPerBlock, 0, compute_stream()>>>(out, mean, rstd, inp, weight,
                                                                                     bias, N, C, eps);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, int N, int C, float* scratch) {
  const int blocks = backward_blocks(N);
  const size_t shared = 2 * static_cast<size_t>(C) * sizeof(float);
  if (shared > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared)));
  layernorm_backward_kernel<T><<<blocks, 32, shared, compute_stream()>>>(dinp, scratch, dout, inp, weight, mean, rstd,
                                                                         N, C);
  CUDA_CHECK_LAUNCH();
  layernorm_weight_grads_kernel<<<blocks_for(2 * C, 256), 256, 0, compute_stream()>>>(dweight, dbias, scratch, blocks,
                                                                                      C);
  CUDA_CHECK_LAUNCH();
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int,
                                       float);
template void layernorm_forward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int, int, float);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, int, int, float*);
template void layernorm_backward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, const float*,
                                       const float*, int, int, float*);

}  // namespace trident::kernels::cuda
