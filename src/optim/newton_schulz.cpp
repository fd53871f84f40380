#include "optim/newton_schulz.h"

#include <cmath>

namespace trident {

namespace {

// x . y over n floats, summed in a fixed order (the same result for any thread count).
float dot(const float* x, const float* y, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; i++) s += x[i] * y[i];
  return s;
}

}  // namespace

std::vector<float> newton_schulz(const float* g, int64_t rows, int64_t columns) {
  // X is r x c with r <= c, so that X X^T is the smaller Gram matrix.
  const bool tall = rows > columns;
  const int64_t r = tall ? columns : rows, c = tall ? rows : columns;
  std::vector<float> x(static_cast<size_t>(r * c));
  double squares = 0.0;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < columns; j++) {
      const float v = g[i * columns + j];
      squares += static_cast<double>(v) * v;
      x[tall ? j * c + i : i * c + j] = v;
    }
  const float norm = static_cast<float>(std::sqrt(squares) + 1e-7);
  for (float& v : x) v /= norm;
  std::vector<float> a(static_cast<size_t>(r * r)), b(a.size()), next(x.size());
  for (int step = 0; step < kNewtonSchulzSteps; step++) {
    // A = X X^T: rows of X against rows of X (A is symmetric).
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < r; i++)
      for (int64_t j = 0; j < r; j++) a[i * r + j] = dot(&x[i * c], &x[j * c], c);
    // B = b A + c A A, where (A A)[i][j] = A_i . A_j since A is symmetric.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < r; i++)
      for (int64_t j = 0; j < r; j++)
        b[i * r + j] = kNewtonSchulzB * a[i * r + j] + kNewtonSchulzC * dot(&a[i * r], &a[j * r], r);
    // X = a X + B X, row by row.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < r; i++) {
      float* out = &next[i * c];
      for (int64_t j = 0; j < c; j++) out[j] = kNewtonSchulzA * x[i * c + j];
      for (int64_t k = 0; k < r; k++) {
        const float w = b[i * r + k];
        const float* row = &x[k * c];
#pragma omp simd
        for (int64_t j = 0; j < c; j++) out[j] += w * row[j];
      }
    }
    x.swap(next);
  }
  if (!tall) return x;
  std::vector<float> back(x.size());
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < columns; j++) back[i * columns + j] = x[j * c + i];
  return back;
}

}  // namespace trident
