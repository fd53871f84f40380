#include "monitor/prometheus_exporter.h"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>

#include "kernels/base/error.h"
#include "runtime/wall_clock.h"

namespace trident {

namespace {

bool is_counter(const std::string& name) { return name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0; }

// The machine's figures: (name, help, unit scale) of a host, and of a GPU under DCGM's names.
struct MachineFigure {
  const char* name;
  const char* help;
};
const MachineFigure kHostFigures[] = {
    {"trident_host_cpu_utilization_ratio", "the host's CPU utilization over all cores since the log step before"},
    {"trident_host_memory_used_bytes", "the host's memory in use (MemTotal - MemAvailable)"},
    {"trident_host_memory_total_bytes", "the host's memory"},
};
const MachineFigure kGpuFigures[] = {
    {"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)"},
    {"DCGM_FI_DEV_FB_USED", "framebuffer memory used (in MiB)"},
    {"DCGM_FI_DEV_FB_FREE", "framebuffer memory free (in MiB)"},
    {"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)"},
    {"DCGM_FI_DEV_POWER_USAGE", "power draw (in W)"},
    {"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)"},
    {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "current clock throttle reasons (a bit mask)"},
    {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "uncorrected (double-bit) ECC errors since the driver loaded"},
    {"DCGM_FI_DEV_XID_ERRORS", "the value of the last XID error seen"},
    {"trident_gpu_xid_errors_total", "XID errors seen since the run began"},
};
double gpu_value(const GpuSample& g, size_t figure) {
  const double values[] = {g.utilization,
                           g.memory_used_mib,
                           g.memory_total_mib - g.memory_used_mib,
                           g.temperature_c,
                           g.power_w,
                           g.sm_clock_mhz,
                           static_cast<double>(g.throttle_reasons),
                           static_cast<double>(g.ecc_uncorrected),
                           static_cast<double>(g.last_xid),
                           static_cast<double>(g.xid_errors)};
  static_assert(std::size(values) == std::size(kGpuFigures));
  return values[figure];
}

const char* kRestarts = "trident_restarts_total";
const char* kSinceStep = "trident_seconds_since_last_step";
const char* kLastStep = "trident_last_step_timestamp_seconds";
const char* kCheckpointAge = "trident_checkpoint_age_seconds";
const char* kCheckpointTime = "trident_checkpoint_last_timestamp_seconds";
const char* kCheckpointDuration = "trident_checkpoint_duration_seconds";

}  // namespace

// What a scrape reads: a snapshot of the latest values, turned into metric families at
// scrape time (so that ages are current).
class PrometheusExporter::Figures final : public prometheus::Collectable {
 public:
  // From the start, so that a job stuck before its first step shows as stalled too.
  explicit Figures(Labels labels) : labels_(std::move(labels)), last_step_(unix_seconds()) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<prometheus::MetricFamily> out;
    const auto add = [&](const std::string& name, const std::string& help, double value, const Labels& extra = {}) {
      prometheus::MetricFamily* family = nullptr;
      for (auto& f : out)
        if (f.name == name) family = &f;
      if (family == nullptr) {
        out.push_back({name, help, is_counter(name) ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge, {}});
        family = &out.back();
      }
      prometheus::ClientMetric m;
      for (const auto& [k, v] : labels_) m.label.push_back({k, v});
      for (const auto& [k, v] : extra) m.label.push_back({k, v});
      if (is_counter(name)) m.counter.value = value;
      else m.gauge.value = value;
      family->metric.push_back(std::move(m));
    };
    for (const auto& [metric, value] : job_) add(metric->prometheus, metric->help, value * metric->to_prometheus);
    const double now = unix_seconds();
    if (runs_) add(kRestarts, "times this run was resumed (a requeue, a signal)", *runs_ - 1);
    if (last_step_) {
      add(kLastStep, "when the last step ended (Unix time)", *last_step_);
      add(kSinceStep, "seconds since the last step ended: a stalled job's grows", now - *last_step_);
    }
    if (checkpoint_time_) {
      add(kCheckpointTime, "when the last checkpoint was saved (Unix time)", *checkpoint_time_);
      add(kCheckpointAge, "seconds since the last checkpoint was saved", now - *checkpoint_time_);
      add(kCheckpointDuration, "seconds the last checkpoint took to save", checkpoint_seconds_);
    }
    if (machine_) {
      const Labels host = {{"Hostname", machine_->host}};
      const double values[] = {machine_->cpu_utilization, machine_->memory_used_gib * (1ull << 30),
                               machine_->memory_total_gib * (1ull << 30)};
      for (size_t i = 0; i < std::size(kHostFigures); i++) add(kHostFigures[i].name, kHostFigures[i].help, values[i], host);
      for (const GpuSample& g : machine_->gpus) {
        const Labels gpu = {{"gpu", std::to_string(g.index)},
                            {"UUID", g.uuid},
                            {"device", "nvidia" + std::to_string(g.index)},
                            {"modelName", g.name},
                            {"Hostname", machine_->host}};
        for (size_t i = 0; i < std::size(kGpuFigures); i++)
          add(kGpuFigures[i].name, kGpuFigures[i].help, gpu_value(g, i), gpu);
      }
    }
    return out;
  }

  void set(const std::vector<MetricValue>& values) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const MetricValue& v : values) {
      bool found = false;
      for (auto& [metric, value] : job_)
        if (metric == v.first) value = v.second, found = true;
      if (!found) job_.push_back(v);
    }
  }
  void step_done() {
    std::lock_guard<std::mutex> lock(mutex_);
    last_step_ = unix_seconds();
  }
  void set_runs(int runs) {
    std::lock_guard<std::mutex> lock(mutex_);
    runs_ = runs;
  }
  void checkpoint_saved(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    checkpoint_time_ = unix_seconds();
    checkpoint_seconds_ = seconds;
  }
  void set_machine(const MachineSample& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    machine_ = s;
  }

 private:
  const Labels labels_;
  mutable std::mutex mutex_;
  std::vector<MetricValue> job_;
  std::optional<int> runs_;
  std::optional<double> last_step_, checkpoint_time_;
  double checkpoint_seconds_ = 0;
  std::optional<MachineSample> machine_;
};

PrometheusExporter::PrometheusExporter(int port, Labels labels)
    : figures_(std::make_shared<Figures>(std::move(labels))),
      server_(std::make_unique<MetricsServer>(
          port, [figures = figures_] { return prometheus::TextSerializer().Serialize(figures->Collect()); })) {}

PrometheusExporter::~PrometheusExporter() = default;

void PrometheusExporter::set(const std::vector<MetricValue>& values) { figures_->set(values); }
void PrometheusExporter::step_done() { figures_->step_done(); }
void PrometheusExporter::set_runs(int runs) { figures_->set_runs(runs); }
void PrometheusExporter::checkpoint_saved(double seconds_taken) { figures_->checkpoint_saved(seconds_taken); }
void PrometheusExporter::set_machine(const MachineSample& sample) { figures_->set_machine(sample); }

std::vector<std::string> exported_metric_names() {
  std::vector<std::string> names;
  for (const RunMetric& m : kStepMetrics) names.push_back(m.prometheus);
  for (const RunMetric& m : kValidationMetrics) names.push_back(m.prometheus);
  for (const RunMetric& m : kMixtureOfExpertsMetrics) names.push_back(m.prometheus);
  for (const RunMetric& m : kS3Metrics) names.push_back(m.prometheus);
  for (const RunMetric& m : kGoodputMetrics) names.push_back(m.prometheus);
  for (const char* n : {kRestarts, kSinceStep, kLastStep, kCheckpointAge, kCheckpointTime, kCheckpointDuration})
    names.push_back(n);
  for (const MachineFigure& f : kHostFigures) names.push_back(f.name);
  for (const MachineFigure& f : kGpuFigures) names.push_back(f.name);
  return names;
}

}  // namespace trident
