// Fused RMSNorm (Llama): out = x * rsqrt(mean(x^2) + eps) * weight. Forward in one pass
// per row (one warp per row, statistics in fp32); backward computes each row's input
// gradient in one kernel that also sums the weight gradient of its rows into a
// per-block slot, then adds the slots in order (deterministic, no atomics), as
// layernorm.cu does.
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kBackwardBlocks = cuda_sizes::kNormBackwardBlocks;

template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= N) return;
  const T* x = inp + static_cast<size_t>(row) * C;
  float sum = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float v = to_float(x[i]);
    sum += v * v;
  }
  const float s = rsqrtf(warp_sum(sum) / C + eps);
  T* o = out + static_cast<size_t>(row) * C;
  for (int i = lane; i < C; i += 32) o[i] = from_float<T>(to_float(x[i]) * s * to_float(weight[i]));
  if (lane == 0) rstd[row] = s;
}

// One warp per block; block b takes rows b, b + gridDim.x, ... and keeps the sums of
// dout * x * rstd over them for its columns in shared memory.
// With y = x s w: dx = s (w dy) - x s^3 <w dy, x> / C.
template <typename T>
__global__ void rmsnorm_backward_kernel(T* dinp, float* partials, const T* dout, const T* inp, const T* weight,
                                        const float* rstd, int N, int C) {
  extern __shared__ float sums[];  // [C]: dweight
  const int lane = threadIdx.x;
  for (int i = lane; i < C; i += 32) sums[i] = 0.0f;
  __syncwarp();
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * C;
    const float s = rstd[row];
    float dot = 0.0f;
    for (int i = lane; i < C; i += 32) {
      const float x = to_float(inp[base + i]), g = to_float(dout[base + i]);
      dot += to_float(weight[i]) * g * x;
      sums[i] += x * s * g;
    }
    const float k = s * s * s * warp_sum(dot) / C;
    for (int i = lane; i < C; i += 32) {
      const float x = to_float(inp[base + i]), g = to_float(dout[base + i]);
      dinp[base + i] = from_float<T>(to_float(dinp[base + i]) + s * to_float(weight[i]) * g - x * k);
    }
  }
  __syncwarp();
  for (int i = lane; i < C; i += 32) partials[static_cast<size_t>(blockIdx.x) * C + i] = sums[i];
}

__global__ void rmsnorm_weight_grad_kernel(float* dweight, const float* partials, int slots, int C) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= C) return;
  float sum = 0.0f;
  for (int b = 0; b < slots; b++) sum += partials[static_cast<size_t>(b) * C + i];
  dweight[i] += sum;
}

int backward_blocks(int N) { return N < kBackwardBlocks ? N : kBackwardBlocks; }

}  // namespace

size_t rmsnorm_backward_scratch_floats(int N, int C) { return static_cast<size_t>(backward_blocks(N)) * C; }

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps) {
  if (N <= 0) return;
  rmsnorm_forward_kernel<T><<<blocks_for(N, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, compute_stream()>>>(
      out, rstd, inp, weight, N, C, eps);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight, const float* rstd, int N,
                      int C, float* scratch) {
  if (N <= 0) return;
  const int blocks = backward_blocks(N);
  const size_t shared = static_cast<size_t>(C) * sizeof(float);
  if (shared > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared)));
  rmsnorm_backward_kernel<T><<<blocks, 32, shared, compute_stream()>>>(dinp, scratch, dout, inp, weight, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  rmsnorm_weight_grad_kernel<<<blocks_for(C, 256), 256, 0, compute_stream()>>>(dweight, scratch, blocks, C);
  CUDA_CHECK_LAUNCH();
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, float);
template void rmsnorm_forward<bf16>(bf16*, float*, const bf16*, const bf16*, int, int, float);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int, int,
                                      float*);
template void rmsnorm_backward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, int, int,
                                     float*);

}  // namespace trident::kernels::cuda
