#include "train/run_monitor.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "monitor/step_trace.h"
#include "parallel/agreement.h"
#include "runtime/durable_file.h"
#include "kernels/base/error.h"
#include "runtime/timer.h"

namespace trident {

namespace {

// What every series says it belongs to: the Slurm job (or none), the model, the layout.
Labels series_labels(const ParallelDims& d, const std::string& model) {
  const char* job = std::getenv("SLURM_JOB_ID");
  return {{"job_id", job != nullptr && *job != '\0' ? job : "none"},
          {"model", model},
          {"layout", "dp" + std::to_string(d.size(Axis::dp)) + " tp" + std::to_string(d.size(Axis::tp)) + " pp" + std::to_string(d.size(Axis::pp))}};
}

}  // namespace

RunMonitor::RunMonitor(const Config& config, ParallelState& parallel, const std::string& model)
    : config_(config), parallel_(parallel) {
  std::tie(trace_first_, trace_last_) = config.log.trace_range();
  run_collectively([&] {
    if (!parallel.machine_leader()) return;
    std::string why_not;
    telemetry_ = std::make_unique<MachineTelemetry>(load_nvml(why_not));
    if (config.log.metrics_port <= 0) return;
    try {
      exporter_ = std::make_unique<PrometheusExporter>(config.log.metrics_port, series_labels(parallel.dims(), model));
    } catch (const UsageError& e) {
      if (parallel.is_root()) throw;  // the job's figures: bad input
      // Another machine's figures only: the run goes on without them (another job's exporter
      // holds the port there, say).
      std::fprintf(stderr, "trident: warning: rank %d: %s; this machine's figures are not served\n", parallel.rank(),
                   e.what());
    }
  });
}

RunMonitor::~RunMonitor() = default;

std::vector<MachineSample> RunMonitor::sample_machines() {
  const Timer sampling;
  std::string mine;
  if (telemetry_ != nullptr) {
    const MachineSample s = telemetry_->sample();
    if (exporter_ != nullptr) exporter_->set_machine(s);
    for (const std::string& w : telemetry_->warnings()) std::fprintf(stderr, "trident: %s\n", w.c_str());
    mine = to_json(s).dump();
  }
  sample_seconds_ += sampling.seconds();
  std::vector<MachineSample> all;
  for (const std::string& text : parallel_.world().gather_strings(mine))
    if (!text.empty()) all.push_back(machine_sample_from_json(nlohmann::json::parse(text)));
  return all;
}

void RunMonitor::before_step(int step) {
  // The range's first step, or the first this run trains inside it (a resume within it).
  if (trace_first_ == 0 || tracing_ || step + 1 < trace_first_ || step + 1 > trace_last_) return;
  parallel_.world().barrier();  // the ranks' clocks start at one moment
  trace::set_zero();
  trace::start();
  tracing_ = true;
}

std::string RunMonitor::after_step(int step) {
  if (!tracing_ || step + 1 != trace_last_) return "";
  trace::stop();
  tracing_ = false;
  const RankCoords& c = parallel_.coords();
  char process[96];
  std::snprintf(process, sizeof process, "rank %d (dp %d, tp %d, pp %d)", parallel_.rank(), c[Axis::dp], c[Axis::tp], c[Axis::pp]);
  const std::vector<std::string> ranks = parallel_.world().gather_strings(trace::take_events(parallel_.rank(), process));
  if (!parallel_.is_root()) return "";
  std::string json = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  for (size_t r = 0; r < ranks.size(); r++) json += (r == 0 ? "" : ",") + ranks[r];
  json += "]}\n";
  std::filesystem::create_directories(config_.log.run_dir);
  const std::string path = (std::filesystem::path(config_.log.run_dir) /
                            ("trace_steps_" + std::to_string(trace_first_) + "-" + std::to_string(trace_last_) + ".json"))
                               .string();
  try {
    write_text_atomically(path, json);
  } catch (const UsageError& e) {  // the run goes on without its trace
    std::fprintf(stderr, "trident: warning: the trace was not written: %s\n", e.what());
    return "";
  }
  return path;
}

}  // namespace trident
