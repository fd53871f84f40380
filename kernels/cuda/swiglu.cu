// SwiGLU (Llama's MLP activation): out = silu(gate) * up, silu(g) = g * sigmoid(g), each
// row of gate_up holding [gate (F) | up (F)] (one GEMM's output over both projections).
// One thread per output element; grid x over the F columns, grid y over rows (strided),
// so no per-element division.
#include "cuda_kernels.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxRowBlocks = 65535;

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int N, int F) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= F) return;
  for (int row = blockIdx.y; row < N; row += gridDim.y) {
    const T* g = gate_up + static_cast<size_t>(row) * 2 * F;
    const float gate = to_float(g[j]), up = to_float(g[F + j]);
    out[static_cast<size_t>(row) * F + j] = from_float<T>(gate / (1.0f + __expf(-gate)) * up);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* gate_up, const T* dout, int N, int F) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= F) return;
  for (int row = blockIdx.y; row < N; row += gridDim.y) {
    const size_t base = static_cast<size_t>(row) * 2 * F;
    const float gate = to_float(gate_up[base + j]), up = to_float(gate_up[base + F + j]);
    const float d = to_float(dout[static_cast<size_t>(row) * F + j]);
    const float sig = 1.0f / (1.0f + __expf(-gate));
    // silu'(g) = sig (1 + g (1 - sig))
    dgate_up[base + j] = from_float<T>(d * up * sig * (1.0f + gate * (1.0f - sig)));
    dgate_up[base + F + j] = from_float<T>(d * gate * sig);
  }
}

dim3 grid_for(int N, int F) {
  return dim3(blocks_for(F, kThreads), N < static_cast<int>(kMaxRowBlocks) ? N : kMaxRowBlocks);
}

}  // namespace

template <typename T>
void swiglu_forward(T* out, const T* gate_up, int N, int F) {
  if (N <= 0 || F <= 0) return;
  swiglu_forward_kernel<T><<<grid_for(N, F), kThreads, 0, compute_stream()>>>(out, gate_up, N, F);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_backward(T* dgate_up, const T* gate_up, const T* dout, int N, int F) {
  if (N <= 0 || F <= 0) return;
  swiglu_backward_kernel<T><<<grid_for(N, F), kThreads, 0, compute_stream()>>>(dgate_up, gate_up, dout, N, F);
  CUDA_CHECK_LAUNCH();
}

template void swiglu_forward<float>(float*, const float*, int, int);
template void swiglu_forward<bf16>(bf16*, const bf16*, int, int);
template void swiglu_backward<float>(float*, const float*, const float*, int, int);
template void swiglu_backward<bf16>(bf16*, const bf16*, const bf16*, int, int);

}  // namespace trident::kernels::cuda
