#include "plan/device_peak.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace trident {

namespace {

struct GpuEntry {
  const char* match;  // a substring of the driver's name; the first match wins
  const char* entry;
  double bf16_tflops, fp32_tflops;  // dense, from NVIDIA's datasheets
};
// A name that contains another comes first: "GH200" before "H200", "H100 PCIe" before
// "H100", "L40" before "L4".
constexpr GpuEntry kGpus[] = {
    {"GH200", "GH200", 989.4, 66.9},       {"H200", "H200 SXM", 989.4, 66.9},
    {"H100 NVL", "H100 NVL", 835.0, 60.0}, {"H100 PCIe", "H100 PCIe", 756.0, 51.2},
    {"H100", "H100 SXM", 989.4, 66.9},     {"A100", "A100", 312.0, 19.5},
    {"L40S", "L40S", 362.1, 91.6},         {"L40", "L40", 181.0, 90.5},
    {"A10G", "A10G", 70.0, 31.2},          {"L4", "L4", 121.0, 30.3},
};

// Rank 0 measures one core's GEMM rate; the others wait for the result asleep, not
// spinning in MPI, so that they leave that core (and the rest) to the measurement.
double one_core_gemm_gflops(ParallelState& parallel, kernels::Kernels& k) {
  double rate = 0;
  if (parallel.is_root()) {
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    k.measure_gemm_gflops(kCpuPeakGemm, 0.2);  // warm-up: pages, kernels chosen, clocks up
    for (int window = 0; window < 4; window++) rate = std::max(rate, k.measure_gemm_gflops(kCpuPeakGemm, 0.25));
    omp_set_num_threads(threads);
  }
  std::vector<double> value = {rate};
  RequestPtr r = parallel.world().all_reduce_async(std::span<double>(value), ReduceOp::max);
  while (!r->test()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return value[0];
}

}  // namespace

DatasheetRate datasheet_rate(const std::string& device_name, kernels::Precision precision) {
  for (const GpuEntry& g : kGpus)
    if (device_name.find(g.match) != std::string::npos)
      return {1000.0 * (precision == kernels::Precision::bf16 ? g.bf16_tflops : g.fp32_tflops), g.entry};
  return {};
}

DevicePeak device_peak(const Config& config, ParallelState& parallel, kernels::Kernels& k) {
  const int world = parallel.dims().world();
  char source[256];
  DevicePeak p;
  if (config.log.peak_gflops > 0) {
    p.per_rank_gflops = config.log.peak_gflops;
    p.total_gflops = p.per_rank_gflops * world;
    p.source = "log.peak_gflops";
    return p;
  }
  if (config.train.device == Device::cuda) {
    const DatasheetRate rate = datasheet_rate(k.name(), k.precision());
    if (rate.gflops > 0) {
      p.per_rank_gflops = rate.gflops;
      std::snprintf(source, sizeof source, "datasheet: %s dense %s", rate.entry.c_str(), kernels::precision_name(k.precision()));
    } else {  // a GPU the table does not know: its measured rate, said so
      double measured = parallel.is_root() ? k.measure_gemm_gflops(8192, 1.0) : 0.0;
      p.per_rank_gflops = parallel.world().all_reduce(measured, ReduceOp::max);
      std::snprintf(source, sizeof source, "measured 8192^3 GEMM: %s is not in the datasheet table", k.name().c_str());
    }
    p.total_gflops = p.per_rank_gflops * world;
    p.source = source;
    return p;
  }
  // CPU: cores in use per node = min(threads of its ranks, its cores), summed over nodes;
  // a rank counts at most the cores it may run on (its affinity: binding, cgroups, Slurm).
  const double core = one_core_gemm_gflops(parallel, k);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : omp_get_max_threads();
  const double node_threads = parallel.node().all_reduce(static_cast<double>(std::min(omp_get_max_threads(), allowed)));
  const double node_cores = std::min(node_threads, static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN)));
  const double cores = parallel.world().all_reduce(parallel.node().rank() == 0 ? node_cores : 0.0);
  p.total_gflops = core * cores;
  p.per_rank_gflops = p.total_gflops / world;
  std::snprintf(source, sizeof source, "measured: %s 1024^3 on one core %.1f GFLOP/s x %.0f cores in use",
                k.measured_gemm().c_str(), core, cores);
  p.source = source;
  return p;
}

}  // namespace trident
