// The GPUs and networks `trident plan` knows, as numbers: datasheet peaks, what
// measured GEMMs and flash attention reach of them, and the bandwidths collectives reach.
// Every constant is stated with its source in hardware.cpp.
#pragma once

#include <string>

namespace trident {

struct GpuModel {
  std::string name;         // as on the command line: a100, h100, h200
  std::string description;  // "A100 SXM 80GB"
  double bf16_tflops = 0;   // dense, datasheet
  double memory_gib = 0;    // device memory
  double hbm_tbps = 0;      // memory bandwidth, TB/s (datasheet)
  double nvlink_gbps = 0;   // NCCL all-reduce bus bandwidth among the node's GPUs, GB/s
  // GEMMs (plan/layer_time.h): a large bf16 GEMM reaches gemm_efficiency of the peak
  // inside a training step; one of M x N x K reaches gemm_efficiency * s / (s +
  // gemm_half_size), s = (M N K)^(1/3): an s x s x s GEMM does as much work.
  double gemm_efficiency = 0;
  double gemm_half_size = 0;
  double attention_efficiency = 0;  // flash attention's forward and backward, of the peak
  double hbm_efficiency = 0;        // of hbm_tbps that memory-bound kernels reach
  std::string default_network;
};
// UsageError naming the known ones.
const GpuModel& gpu_model(const std::string& name);

struct NetworkModel {
  std::string name;
  double gbps_per_gpu = 0;  // line rate between nodes, Gbit/s per GPU
  double efficiency = 0.8;  // of the line rate that a ring all-reduce's bus bandwidth reaches
  double bus_bytes_per_s() const { return gbps_per_gpu * 1e9 / 8 * efficiency; }
};
// "efa" (the GPU's AWS instance: p4d 400 Gbit/s per node, p5/p5e 3200), "ib" (InfiniBand
// HDR/NDR, one 200 or 400 Gbit/s port per GPU), or a number: Gbit/s per GPU. UsageError else.
NetworkModel network_model(const std::string& name, const GpuModel& gpu);

}  // namespace trident
