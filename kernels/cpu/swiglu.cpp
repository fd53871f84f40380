// SwiGLU (Llama's MLP activation): out = silu(gate) * up, silu(g) = g * sigmoid(g),
// where each row of gate_up holds [gate (F) | up (F)]: the output of one GEMM over the
// gate and up projections side by side.
#include "cpu_kernels.h"
#include "vector_math.h"

namespace trident::kernels::cpu {

template <typename T>
void swiglu_forward(T* out, const T* gate_up, int N, int F) {
#pragma omp parallel for
  for (int i = 0; i < N; i++) {
    const T* g = gate_up + static_cast<size_t>(i) * 2 * F;
    const T* u = g + F;
    T* o = out + static_cast<size_t>(i) * F;
#pragma omp simd
    for (int j = 0; j < F; j++) o[j] = g[j] / (T(1) + fast_exp(-g[j])) * u[j];
  }
}

template <typename T>
void swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, int N, int F) {
#pragma omp parallel for
  for (int i = 0; i < N; i++) {
    const T* g = gate_up + static_cast<size_t>(i) * 2 * F;
    const T* u = g + F;
    const T* d = dout + static_cast<size_t>(i) * F;
    T* dg = dgate_up + static_cast<size_t>(i) * 2 * F;
    T* du = dg + F;
#pragma omp simd
    for (int j = 0; j < F; j++) {
      const T sig = T(1) / (T(1) + fast_exp(-g[j]));
      const T silu = g[j] * sig;
      dg[j] = d[j] * u[j] * sig * (T(1) + g[j] * (T(1) - sig));  // silu'(g) = sig (1 + g (1 - sig))
      du[j] = d[j] * silu;
    }
  }
}

template void swiglu_forward<float>(float*, const float*, int, int);
template void swiglu_forward<double>(double*, const double*, int, int);
template void swiglu_backward<float>(float*, const float*, const float*, int, int);
template void swiglu_backward<double>(double*, const double*, const double*, int, int);

}  // namespace trident::kernels::cpu
