#include <cmath>

#include "cpu_kernels.h"
#include "vector_math.h"

namespace trident::kernels::cpu {

// gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)
constexpr double kGeluScale = 0.7978845608028654;

template <typename T>
void gelu_forward(T* out, const T* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const T x = inp[i];
    const T u = T(kGeluScale) * (x + T(0.044715) * x * x * x);
    out[i] = T(0.5) * x * (T(1) + fast_tanh(u));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const T x = inp[i];
    const T u = T(kGeluScale) * (x + T(0.044715) * x * x * x);
    const T th = fast_tanh(u);
    const T sech2 = T(1) - th * th;
    const T du_dx = T(kGeluScale) * (T(1) + T(3 * 0.044715) * x * x);
    dinp[i] = (T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * du_dx) * dout[i];
  }
}

template void gelu_forward<float>(float*, const float*, size_t);
template void gelu_forward<double>(double*, const double*, size_t);
template void gelu_backward<float>(float*, const float*, const float*, size_t);
template void gelu_backward<double>(double*, const double*, const double*, size_t);

}  // namespace trident::kernels::cpu
