// Muon's orthogonalization (optim/muon.cpp): the quintic Newton-Schulz iteration of Keller
// Jordan's Muon, as Moonlight's zeropower_via_newtonschulz5 runs it. It takes a matrix G
// to about U V^T of its SVD G = U S V^T (every singular value near 1, between about 0.7
// and 1.2: the coefficients trade exactness for speed), in matrix products only:
//   X = G / (||G||_F + 1e-7), transposed when it has more rows than columns;
//   5 times: A = X X^T;  B = b A + c A A;  X = a X + B X;  then transposed back.
// fp32 on the host (Moonlight runs it in bf16 on a GPU). A GPU path would be a kernel op
// (kernels/ops.def); the CPU backend is the one Muon runs on today.
#pragma once

#include <cstdint>
#include <vector>

namespace trident {

inline constexpr int kNewtonSchulzSteps = 5;
inline constexpr float kNewtonSchulzA = 3.4445f, kNewtonSchulzB = -4.7750f, kNewtonSchulzC = 2.0315f;

// The orthogonalized `rows` x `columns` row-major matrix g, in the same shape.
std::vector<float> newton_schulz(const float* g, int64_t rows, int64_t columns);

}  // namespace trident
