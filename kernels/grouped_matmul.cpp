// The grouped linear layers' default: one matmul per group (kernels/kernels.h says what
// they compute). A backend with a grouped GEMM overrides them (kernels/cuda/cuda_backend.cu).
#include "kernels/kernels.h"

namespace trident::kernels {

void Kernels::grouped_matmul_forward(Act* out, const Act* inp, const Act* const* weights, const int* rows,
                                     int groups, int C, int OC) {
  const DType type = activation_type();
  size_t row = 0;
  for (int g = 0; g < groups; g++) {
    if (rows[g] > 0)
      matmul_forward(offset(out, row * OC, type), offset(inp, row * C, type), weights[g], nullptr, rows[g], C, OC);
    row += static_cast<size_t>(rows[g]);
  }
}

void Kernels::grouped_matmul_backward(Act* dinp, float* const* dweights, const Act* dout, const Act* inp,
                                      const Act* const* weights, const int* rows, int groups, int C, int OC) {
  const DType type = activation_type();
  size_t row = 0;
  for (int g = 0; g < groups; g++) {
    if (rows[g] > 0)
      matmul_backward(dinp != nullptr ? offset(dinp, row * C, type) : nullptr,
                      dweights != nullptr ? dweights[g] : nullptr, nullptr, offset(dout, row * OC, type),
                      dweights != nullptr ? offset(inp, row * C, type) : nullptr,
                      dinp != nullptr ? weights[g] : nullptr, rows[g], C, OC);
    row += static_cast<size_t>(rows[g]);
  }
}

}  // namespace trident::kernels
