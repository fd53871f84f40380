// The optimizer's kernels: fused AdamW on fp32 master weights (moments fp32), and the
// sums behind the global gradient norm and the step's loss (fp64 partials in a fixed
// order, added into a total that stays on the device until the step reads it once).
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kPartials = cuda_sizes::kSumSquaresPartials;  // blocks of the first reduction stage
constexpr int kThreads = 256;

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                             float beta2, float bias1, float bias2, float eps, float decay, float grad_scale) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = grad[i] * grad_scale;
  const float mi = beta1 * m[i] + (1.0f - beta1) * g;
  const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  // PyTorch's order: decay first, then the Adam step.
  param[i] = param[i] * decay - lr * (mi / bias1) / (sqrtf(vi / bias2) + eps);
}

// Block b sums the b-th contiguous chunk (of x[i] or of x[i]^2); fixed chunks, fixed
// tree: deterministic.
template <bool kSquares>
__global__ void sum_stage1(double* partials, const float* x, size_t n) {
  __shared__ double shared[kThreads];
  const size_t chunk = (n + gridDim.x - 1) / gridDim.x;
  const size_t begin = blockIdx.x * chunk, end = begin + chunk < n ? begin + chunk : n;
  double s = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    s += kSquares ? static_cast<double>(x[i]) * x[i] : static_cast<double>(x[i]);
  shared[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// *total += the partials, summed by one block in a fixed tree.
__global__ void sum_stage2(double* total, const double* partials, int count) {
  __shared__ double shared[kPartials];
  shared[threadIdx.x] = static_cast<int>(threadIdx.x) < count ? partials[threadIdx.x] : 0.0;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *total += shared[0];
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int t, float grad_scale) {
  if (n == 0) return;
  const float bias1 = 1.0f - std::pow(beta1, static_cast<float>(t));
  const float bias2 = 1.0f - std::pow(beta2, static_cast<float>(t));
  adamw_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(param, grad, m, v, n, lr, beta1, beta2,
                                                                           bias1, bias2, eps, 1.0f - lr * weight_decay,
                                                                           grad_scale);
  CUDA_CHECK_LAUNCH();
}

int sum_partials() { return kPartials; }

void accumulate_sum(double* total, double* partials, const float* x, size_t n, bool squares) {
  if (n == 0) return;
  if (squares) sum_stage1<true><<<kPartials, kThreads, 0, compute_stream()>>>(partials, x, n);
  else sum_stage1<false><<<kPartials, kThreads, 0, compute_stream()>>>(partials, x, n);
  CUDA_CHECK_LAUNCH();
  sum_stage2<<<1, kPartials, 0, compute_stream()>>>(total, partials, kPartials);
  CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
