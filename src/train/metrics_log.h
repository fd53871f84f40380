// What rank 0 shows while training: one line per logged step on stdout, and the same
// fields as one JSON object per line in <run_dir>/metrics.jsonl; at the end, the run's
// averages in <run_dir>/summary.json.
#pragma once

#include <fstream>
#include <string>

namespace trident {

struct StepMetrics {
  int step = 0, total_steps = 0;  // step counts from 1 in what is shown
  // loss: the mean over the steps since the last logged one (loss_steps of them, as
  // Megatron-LM logs it); loss_step: this step's alone.
  double loss = 0, loss_step = 0;
  int loss_steps = 1;
  double lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0, step_time_s = 0;
  double memory_gib = 0, eta_s = 0;
  double comm_wait_s = 0;  // waiting for the data-parallel gradient reduction
};

class MetricsLog {
 public:
  // Opens <run_dir>/metrics.jsonl (no file when run_dir is empty): a fresh run truncates
  // it; a run resumed after step `resumed_from` keeps the records up to that step (those
  // after it were trained again from the checkpoint) and appends.
  MetricsLog(const std::string& run_dir, int resumed_from = 0);

  void log_step(const StepMetrics& m);
  void log_validation(int step, double val_loss);
  // <run_dir>/summary.json at the end of a run: one JSON object (what sweeps collect).
  void write_summary(const std::string& json_text) const;
  // The summary.json a run resumed into this folder found there (empty when none).
  const std::string& earlier_summary() const { return earlier_summary_; }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_, earlier_summary_;
  std::ofstream jsonl_;
};

// "1h02m", "3m07s", "12s"
std::string format_duration(double seconds);

}  // namespace trident
