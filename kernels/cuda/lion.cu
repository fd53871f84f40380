// Lion's update (optim/lion.cpp) on fp32 master weights, its momentum fp32.
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void lion_kernel(float* param, const float* grad, float* m, size_t n, float lr, float beta1, float beta2,
                            float decay, float grad_scale) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = grad[i] * grad_scale;
  const float c = beta1 * m[i] + (1.0f - beta1) * g;
  const float sign = static_cast<float>((c > 0.0f) - (c < 0.0f));
  param[i] = param[i] * decay - lr * sign;
  m[i] = beta2 * m[i] + (1.0f - beta2) * g;
}

}  // namespace

void lion_update(float* param, const float* grad, float* m, size_t n, float lr, float beta1, float beta2,
                 float weight_decay, float grad_scale) {
  if (n == 0) return;
  lion_kernel<<<blocks_for(n, kThreads), kThreads, 0, compute_stream()>>>(param, grad, m, n, lr, beta1, beta2,
                                                                          1.0f - lr * weight_decay, grad_scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
