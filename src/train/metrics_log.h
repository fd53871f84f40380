// What rank 0 shows while training: one line per logged step on stdout, and the same
// fields as one JSON object per line in <run_dir>/metrics.jsonl, as TensorBoard scalars
// (monitor/tensorboard.h) and to a Prometheus exporter when there is one
// (monitor/prometheus_exporter.h), all named from one table (monitor/run_metrics.h); at
// the end, the run's averages in <run_dir>/summary.json.
#pragma once

#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "monitor/run_metrics.h"
#include "monitor/telemetry.h"

namespace trident {

class TensorBoardWriter;
class PrometheusExporter;

struct StepMetrics {
  int step = 0, total_steps = 0;  // step counts from 1 in what is shown
  // loss: the mean over the steps since the last logged one (loss_steps of them, as
  // Megatron-LM logs it); loss_step: this step's alone.
  double loss = 0, loss_step = 0;
  int loss_steps = 1;
  // A mixture of experts' auxiliary losses this step, apart from the loss (NaN: a dense model).
  double aux_loss = std::numeric_limits<double>::quiet_NaN();
  // Per MoE layer: the most loaded expert's tokens over the mean expert's (empty: dense).
  std::vector<double> expert_load;
  // Its expert-parallel exchanges' bytes to other ranks, all ranks together; the routed
  // token-expert pairs, and those no expert computed (meaningful with expert_load non-empty).
  double all_to_all_bytes = 0, tokens_routed = 0, tokens_dropped = 0;
  // The token-expert pairs each expert was chosen for, summed over the MoE layers (empty:
  // dense), and per layer (empty unless log.expert_tokens_per_layer).
  std::vector<double> expert_tokens;
  std::vector<std::vector<double>> expert_tokens_per_layer;
  // With checkpoint.upload: kS3Metrics's figures, in its order (empty: no upload).
  std::vector<double> s3;
  // Goodput so far (train/goodput.h: the ratio, then the parts in seconds); empty: none.
  std::vector<double> goodput;
  double lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0, step_time_s = 0;
  double memory_gib = 0, eta_s = 0;
  double comm_wait_s = 0;  // waiting for the data-parallel gradient reduction
  double data_wait_s = 0;  // waiting for the batch
  double bubble_s = 0;     // stage 0 waiting on its pipeline neighbours
  int global_batch = 0, skipped_steps = 0, loss_spikes = 0, straggler_reports = 0;  // the last three: so far
  std::vector<MachineSample> machines;  // every machine's GPUs and host (monitor/telemetry.h)
};

// The table's figures of a step (monitor/run_metrics.h), with their values.
std::vector<MetricValue> metric_values(const StepMetrics& m);

class MetricsLog {
 public:
  // Opens <run_dir>/metrics.jsonl (no file when run_dir is empty): a fresh run truncates
  // it; a run resumed after step `resumed_from` keeps the records up to that step (those
  // after it were trained again from the checkpoint) and appends.
  // tensorboard_dir: where the event files go (empty: none).
  MetricsLog(const std::string& run_dir, int resumed_from = 0, const std::string& tensorboard_dir = "");
  ~MetricsLog();

  // Back at checkpoint `step`: the records after it go, TensorBoard drops its events after it.
  void rolled_back_to(int step);
  // The resolved config, once, for TensorBoard's text plugin.
  void log_config(const std::string& ini);
  void set_exporter(PrometheusExporter* exporter) { exporter_ = exporter; }
  void log_step(const StepMetrics& m);
  void log_validation(int step, double val_loss);
  // <run_dir>/summary.json at the end of a run: one JSON object (what sweeps collect).
  void write_summary(const std::string& json_text) const;
  // The summary.json a run resumed into this folder found there (empty when none).
  const std::string& earlier_summary() const { return earlier_summary_; }
  const std::string& path() const { return path_; }
  const TensorBoardWriter* tensorboard() const { return tensorboard_.get(); }
  // Seconds spent writing TensorBoard and updating the exporter (what watching costs a step).
  double writer_seconds() const { return writer_seconds_; }

 private:
  void keep_records_up_to(int step);  // metrics.jsonl's records of later steps go
  // Runs a TensorBoard write; a failure is a warning and the end of TensorBoard, not of the run.
  void guarded(const std::function<void()>& write);

  std::string dir_, path_, earlier_summary_;
  std::ofstream jsonl_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  PrometheusExporter* exporter_ = nullptr;
  double writer_seconds_ = 0;
};

// "1h02m", "3m07s", "12s"
std::string format_duration(double seconds);

}  // namespace trident
