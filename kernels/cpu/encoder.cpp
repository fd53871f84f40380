#include "cpu_kernels.h"

namespace trident::kernels::cpu {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte_shard, int vocab_start, int shard_rows, int B,
                       int T_, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < B * T_; i++) {
    T* o = out + static_cast<size_t>(i) * C;
    const int row = tokens[i] - vocab_start;
    if (row < 0 || row >= shard_rows) {
      for (int c = 0; c < C; c++) o[c] = T(0);
      continue;
    }
    const T* e = wte_shard + static_cast<size_t>(row) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = e[c];
  }
}

template <typename T>
void embedding_backward(T* dwte_shard, const T* dout, const int32_t* tokens, int vocab_start, int shard_rows, int B,
                        int T_, int C) {
  // Parallel over channels: two positions may hold the same token, so rows of dwte
  // would race if we split over tokens instead; each sum keeps one fixed order.
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int c1 = c0 + 16 < C ? c0 + 16 : C;
    for (int i = 0; i < B * T_; i++) {
      const int row = tokens[i] - vocab_start;
      if (row < 0 || row >= shard_rows) continue;
      const T* d = dout + static_cast<size_t>(i) * C;
      T* e = dwte_shard + static_cast<size_t>(row) * C;
      for (int c = c0; c < c1; c++) e[c] += d[c];
    }
  }
}

template <typename T>
void add_positions(T* out, const T* wpe, const int32_t* positions, int B, int T_, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T_; t++) {
      T* o = out + (static_cast<size_t>(b) * T_ + t) * C;
      const T* p = wpe + static_cast<size_t>(positions[t]) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] += p[c];
    }
}

template <typename T>
void positions_backward(T* dwpe, const T* dout, const int32_t* positions, int B, int T_, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T_; t++) {
    T* p = dwpe + static_cast<size_t>(positions[t]) * C;  // distinct positions: one thread per row
    for (int b = 0; b < B; b++) {
      const T* d = dout + (static_cast<size_t>(b) * T_ + t) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) p[c] += d[c];
    }
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int, int, int, int, int);
template void embedding_forward<double>(double*, const int32_t*, const double*, int, int, int, int, int);
template void embedding_backward<float>(float*, const float*, const int32_t*, int, int, int, int, int);
template void embedding_backward<double>(double*, const double*, const int32_t*, int, int, int, int, int);
template void add_positions<float>(float*, const float*, const int32_t*, int, int, int);
template void add_positions<double>(double*, const double*, const int32_t*, int, int, int);
template void positions_backward<float>(float*, const float*, const int32_t*, int, int, int);
template void positions_backward<double>(double*, const double*, const int32_t*, int, int, int);

}  // namespace trident::kernels::cpu
