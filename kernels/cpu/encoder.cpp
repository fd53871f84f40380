#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C) {
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T_; t++) {
      T* o = out + (static_cast<size_t>(b) * T_ + t) * C;
      const T* e = wte + static_cast<size_t>(tokens[b * T_ + t]) * C;
      const T* p = wpe + static_cast<size_t>(t) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
  }
}

template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C) {
  // Parallel over channels: two positions may hold the same token, so rows of dwte
  // would race if we split over tokens instead.
#pragma omp parallel for
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int c1 = c0 + 16 < C ? c0 + 16 : C;
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T_; t++) {
        const T* d = dout + (static_cast<size_t>(b) * T_ + t) * C;
        T* e = dwte + static_cast<size_t>(tokens[b * T_ + t]) * C;
        T* p = dwpe + static_cast<size_t>(t) * C;
        for (int c = c0; c < c1; c++) {
          e[c] += d[c];
          p[c] += d[c];
        }
      }
    }
  }
}

template void encoder_forward<float>(float*, const int32_t*, const float*, const float*, int, int, int);
template void encoder_forward<double>(double*, const int32_t*, const double*, const double*, int, int, int);
template void encoder_backward<float>(float*, float*, const float*, const int32_t*, int, int, int);
template void encoder_backward<double>(double*, double*, const double*, const int32_t*, int, int, int);

}  // namespace trident::kernels::cpu
