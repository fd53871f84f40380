// The peak that MFU is measured against, as Megatron-LM, torchtitan and llm.c report it:
// model FLOPs over the hardware's dense rate. On a GPU that is the datasheet rate of the
// model the driver names, for the precision in use (H100/H200 SXM: 989 TFLOP/s bf16); on
// a CPU, which has no datasheet figure we can trust, the GEMM rate of one core measured
// here (the GEMM the linear layers run: under bf16 with bf16 instructions, oneDNN's bf16 matmul) (about a second, after a warm-up, while the other ranks sleep) times the cores the
// ranks occupy (on each node, the smaller of its threads and its cores).
#pragma once

#include <string>

#include "config/config.h"
#include "kernels/kernels.h"
#include "parallel/parallel_state.h"

namespace trident {

struct DevicePeak {
  double total_gflops = 0;     // all ranks together: what MFU divides by
  double per_rank_gflops = 0;  // total / ranks (printed)
  std::string source;          // where the number comes from, printed at start
};

// Collective over the world.
DevicePeak device_peak(const Config& config, ParallelState& parallel, kernels::Kernels& k);

// On the CPU, without log.peak_gflops, rank 0 times its GEMM on matrices of this size.
inline constexpr int kCpuPeakGemm = 1024;

// The datasheet dense rate in GFLOP/s of the GPU named `device_name` (as the driver names
// it, e.g. "NVIDIA H200") at `precision` (bf16 tensor cores; fp32 without TF32, as our
// GEMMs compute it), and the entry's name; 0 and "" for a GPU not in the table.
struct DatasheetRate {
  double gflops = 0;
  std::string entry;
};
DatasheetRate datasheet_rate(const std::string& device_name, kernels::Precision precision);

}  // namespace trident
