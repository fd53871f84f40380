#include "monitor/telemetry.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace trident {

namespace {

// /proc/stat's first line: the jiffies of all cores, busy (everything but idle and iowait) and in all.
void cpu_jiffies(unsigned long long& busy, unsigned long long& total) {
  std::ifstream in("/proc/stat");
  std::string cpu;
  unsigned long long v[10] = {};
  in >> cpu;
  for (unsigned long long& x : v) in >> x;
  total = 0;
  for (unsigned long long x : v) total += x;
  busy = total - v[3] - v[4];
}

// /proc/meminfo's MemTotal and MemAvailable, in GiB.
void memory_gib(double& used, double& total) {
  std::ifstream in("/proc/meminfo");
  double total_kib = 0, available_kib = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    double kib = 0;
    fields >> key >> kib;
    if (key == "MemTotal:") total_kib = kib;
    if (key == "MemAvailable:") available_kib = kib;
  }
  total = total_kib / (1 << 20);
  used = (total_kib - available_kib) / (1 << 20);
}

}  // namespace

nlohmann::json to_json(const MachineSample& s) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const GpuSample& g : s.gpus)
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"uuid", g.uuid},
                    {"utilization", g.utilization},
                    {"memory_used_mib", g.memory_used_mib},
                    {"memory_total_mib", g.memory_total_mib},
                    {"temperature_c", g.temperature_c},
                    {"power_w", g.power_w},
                    {"sm_clock_mhz", g.sm_clock_mhz},
                    {"throttle_reasons", g.throttle_reasons},
                    {"ecc_uncorrected", g.ecc_uncorrected},
                    {"xid_errors", g.xid_errors},
                    {"last_xid", g.last_xid}});
  return {{"host", s.host},
          {"cpu_utilization", s.cpu_utilization},
          {"memory_used_gib", s.memory_used_gib},
          {"memory_total_gib", s.memory_total_gib},
          {"gpus", gpus}};
}

MachineSample machine_sample_from_json(const nlohmann::json& j) {
  MachineSample s;
  s.host = j.value("host", "");
  s.cpu_utilization = j.value("cpu_utilization", 0.0);
  s.memory_used_gib = j.value("memory_used_gib", 0.0);
  s.memory_total_gib = j.value("memory_total_gib", 0.0);
  for (const nlohmann::json& g : j.value("gpus", nlohmann::json::array())) {
    GpuSample x;
    x.index = g.value("index", 0);
    x.name = g.value("name", "");
    x.uuid = g.value("uuid", "");
    x.utilization = g.value("utilization", 0.0);
    x.memory_used_mib = g.value("memory_used_mib", 0.0);
    x.memory_total_mib = g.value("memory_total_mib", 0.0);
    x.temperature_c = g.value("temperature_c", 0.0);
    x.power_w = g.value("power_w", 0.0);
    x.sm_clock_mhz = g.value("sm_clock_mhz", 0.0);
    x.throttle_reasons = g.value("throttle_reasons", 0ull);
    x.ecc_uncorrected = g.value("ecc_uncorrected", 0ull);
    x.xid_errors = g.value("xid_errors", 0ull);
    x.last_xid = g.value("last_xid", 0ull);
    s.gpus.push_back(x);
  }
  return s;
}

MachineTelemetry::MachineTelemetry(const NvmlApi& nvml) : nvml_(nvml) {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  host_ = host;
  cpu_jiffies(cpu_busy_, cpu_total_);
  if (!nvml_.usable() || nvml_.init() != nvml::kSuccess) return;
  gpus_ = true;
  unsigned n = 0;
  nvml_.device_count(&n);
  for (unsigned i = 0; i < n; i++) {
    NvmlDevice* d = nullptr;
    // Another job's GPU (Slurm's device cgroup) refuses a handle: not ours to report.
    if (nvml_.handle_by_index(i, &d) == nvml::kSuccess && d != nullptr) {
      devices_.push_back(d);
      indices_.push_back(static_cast<int>(i));
    }
  }
  // XID errors arrive as events (DCGM counts them the same way): registered once, drained at each sample.
  if (nvml_.event_set_create && nvml_.register_events && nvml_.event_set_wait &&
      nvml_.event_set_create(&events_) == nvml::kSuccess)
    for (NvmlDevice* d : devices_) nvml_.register_events(d, nvml::kXidCriticalError, events_);
  last_.resize(devices_.size());
}

MachineTelemetry::~MachineTelemetry() {
  if (!gpus_) return;
  if (events_ != nullptr && nvml_.event_set_free) nvml_.event_set_free(events_);
  nvml_.shutdown();
}

MachineSample MachineTelemetry::sample() {
  MachineSample s;
  s.host = host_;
  unsigned long long busy = 0, total = 0;
  cpu_jiffies(busy, total);
  s.cpu_utilization = total > cpu_total_ ? static_cast<double>(busy - cpu_busy_) / static_cast<double>(total - cpu_total_)
                                         : 0.0;
  cpu_busy_ = busy;
  cpu_total_ = total;
  memory_gib(s.memory_used_gib, s.memory_total_gib);
  warnings_.clear();
  if (!gpus_) return s;
  std::vector<GpuSample> gpus = last_;
  // The XIDs since the last sample, each to its GPU.
  NvmlEventData event{};
  while (events_ != nullptr && nvml_.event_set_wait(events_, &event, 0) == nvml::kSuccess)
    for (size_t i = 0; i < devices_.size(); i++)
      if (devices_[i] == event.device) {
        gpus[i].xid_errors++;
        gpus[i].last_xid = event.event_data;
      }
  char text[96];
  for (size_t i = 0; i < devices_.size(); i++) {
    NvmlDevice* d = devices_[i];
    GpuSample& g = gpus[i];
    g.index = indices_[i];
    if (nvml_.name(d, text, sizeof text) == nvml::kSuccess) g.name = text;
    if (nvml_.uuid && nvml_.uuid(d, text, sizeof text) == nvml::kSuccess) g.uuid = text;
    NvmlMemory m{};
    if (nvml_.memory(d, &m) == nvml::kSuccess) {
      g.memory_used_mib = static_cast<double>(m.used) / (1 << 20);
      g.memory_total_mib = static_cast<double>(m.total) / (1 << 20);
    }
    NvmlUtilization u{};
    if (nvml_.utilization && nvml_.utilization(d, &u) == nvml::kSuccess) g.utilization = u.gpu;
    unsigned value = 0;
    if (nvml_.temperature && nvml_.temperature(d, nvml::kTemperatureGpu, &value) == nvml::kSuccess)
      g.temperature_c = value;
    if (nvml_.power && nvml_.power(d, &value) == nvml::kSuccess) g.power_w = value / 1000.0;
    if (nvml_.clock && nvml_.clock(d, nvml::kClockSm, &value) == nvml::kSuccess) g.sm_clock_mhz = value;
    unsigned long long reasons = 0;
    if (nvml_.throttle_reasons && nvml_.throttle_reasons(d, &reasons) == nvml::kSuccess) g.throttle_reasons = reasons;
    int current = 0, pending = 0;
    unsigned long long ecc = 0;
    if (nvml_.ecc_mode && nvml_.ecc_errors && nvml_.ecc_mode(d, &current, &pending) == nvml::kSuccess && current != 0 &&
        nvml_.ecc_errors(d, nvml::kUncorrected, nvml::kVolatileCounter, &ecc) == nvml::kSuccess)
      g.ecc_uncorrected = ecc;
    const GpuSample& before = last_[i];
    if (g.xid_errors > before.xid_errors)
      warnings_.push_back("warning: " + host_ + " GPU " + std::to_string(g.index) + " (" + g.name + "): " +
                          std::to_string(g.xid_errors - before.xid_errors) + " XID error(s), the last XID " +
                          std::to_string(g.last_xid) + " (nvidia-smi -q, dmesg: NVRM)");
    if (g.ecc_uncorrected > before.ecc_uncorrected && !before.name.empty())
      warnings_.push_back("warning: " + host_ + " GPU " + std::to_string(g.index) + " (" + g.name + "): uncorrected ECC errors " +
                          std::to_string(before.ecc_uncorrected) + " -> " + std::to_string(g.ecc_uncorrected));
  }
  last_ = gpus;
  s.gpus = gpus;
  return s;
}

}  // namespace trident
