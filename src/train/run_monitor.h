// How a run is watched from outside, beyond its log lines (monitor/): the first rank of
// each machine samples its GPUs and host at every log step and serves them, with rank 0
// serving the job's figures too, on log.metrics_port; rank 0 gathers the machines'
// samples into metrics.jsonl and TensorBoard and warns of GPUs whose XID or ECC counts
// rose; and the steps of log.trace_steps are recorded on every rank and written as one
// Chrome trace. Collective where it says so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "monitor/prometheus_exporter.h"
#include "monitor/telemetry.h"
#include "parallel/parallel_state.h"

namespace trident {

class RunMonitor {
 public:
  // Collective: an exporter whose port cannot be served is one error on every rank.
  // `model`: what the series' labels name.
  RunMonitor(const Config& config, ParallelState& parallel, const std::string& model);
  ~RunMonitor();

  PrometheusExporter* exporter() { return exporter_.get(); }
  // Collective, at a log step: every machine's sample, on rank 0 (empty elsewhere); the
  // exporters get their machine's.
  std::vector<MachineSample> sample_machines();
  // The trace: before step `step` (from 0) runs, and after it ended (collective at the
  // range's ends; the file is written by rank 0 into log.run_dir). Returns its path on
  // rank 0 after the range's last step, else "".
  void before_step(int step);
  std::string after_step(int step);
  // Seconds this rank spent sampling its machine (what telemetry costs the steps).
  double sample_seconds() const { return sample_seconds_; }

 private:
  const Config& config_;
  ParallelState& parallel_;
  std::unique_ptr<MachineTelemetry> telemetry_;
  std::unique_ptr<PrometheusExporter> exporter_;
  int trace_first_ = 0, trace_last_ = 0;  // from 1; 0: none
  bool tracing_ = false;
  double sample_seconds_ = 0;
};

}  // namespace trident
