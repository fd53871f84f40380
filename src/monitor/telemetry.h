// What a machine's GPUs and host are doing, sampled by the first rank of each machine at
// every log step: per GPU (NVML: monitor/nvml.h) utilization, memory, temperature, power,
// SM clock, throttle reasons, uncorrected ECC errors and XID errors, the figures NVIDIA's
// DCGM exporter publishes; per host the CPU utilization and the memory in use. They go to
// metrics.jsonl, TensorBoard and Prometheus (DCGM's names there: monitor/prometheus_exporter.h),
// and a GPU whose XID or ECC count rises is named in a warning.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "monitor/nvml.h"

namespace trident {

struct GpuSample {
  int index = 0;
  std::string name, uuid;
  double utilization = 0;  // percent of the driver's last sample period
  double memory_used_mib = 0, memory_total_mib = 0;
  double temperature_c = 0, power_w = 0, sm_clock_mhz = 0;
  unsigned long long throttle_reasons = 0;  // NVML's clocks-throttle bit mask
  unsigned long long ecc_uncorrected = 0;   // volatile: since the driver loaded
  unsigned long long xid_errors = 0;        // XID events seen since this run began
  unsigned long long last_xid = 0;          // the last one's code (DCGM_FI_DEV_XID_ERRORS)
};

struct MachineSample {
  std::string host;
  double cpu_utilization = 0;  // all cores, 0..1, since the sample before (the first: since boot)
  double memory_used_gib = 0, memory_total_gib = 0;
  std::vector<GpuSample> gpus;
};

nlohmann::json to_json(const MachineSample& s);
MachineSample machine_sample_from_json(const nlohmann::json& j);

class MachineTelemetry {
 public:
  // GPUs through `nvml` (load_nvml(): the driver's library; none without it).
  explicit MachineTelemetry(const NvmlApi& nvml);
  MachineTelemetry(const MachineTelemetry&) = delete;
  ~MachineTelemetry();
  MachineSample sample();
  // One line per GPU whose XID or uncorrected ECC count rose at the last sample.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  NvmlApi nvml_;
  bool gpus_ = false;
  std::vector<NvmlDevice*> devices_;  // the GPUs NVML gave a handle for, and their indices
  std::vector<int> indices_;
  NvmlEventSet* events_ = nullptr;
  std::vector<GpuSample> last_;
  std::vector<std::string> warnings_;
  unsigned long long cpu_busy_ = 0, cpu_total_ = 0;  // /proc/stat at the sample before
  std::string host_;
};

}  // namespace trident
