#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <typename T>
void lion_update(T* param, const T* grad, T* m, size_t n, T lr, T beta1, T beta2, T weight_decay, T grad_scale) {
  const T decay = T(1) - lr * weight_decay;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const T g = grad[i] * grad_scale;
    const T c = beta1 * m[i] + (T(1) - beta1) * g;
    const T sign = static_cast<T>((c > T(0)) - (c < T(0)));
    param[i] = param[i] * decay - lr * sign;  // decay first, as lion-pytorch
    m[i] = beta2 * m[i] + (T(1) - beta2) * g;
  }
}

template void lion_update<float>(float*, const float*, float*, size_t, float, float, float, float, float);
template void lion_update<double>(double*, const double*, double*, size_t, double, double, double, double, double);

}  // namespace trident::kernels::cpu
