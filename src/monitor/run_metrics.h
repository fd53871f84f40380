// The figures of a training run that its watchers see, one table for every place they
// go: metrics.jsonl (key), TensorBoard (tag: Megatron-LM's name where it has one, so a
// trident run and a Megatron run sit in one TensorBoard) and Prometheus (name, in base
// units). The writers take their names from here, so the three cannot drift apart.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace trident {

struct RunMetric {
  const char* key;          // metrics.jsonl
  const char* tensorboard;  // TensorBoard tag
  const char* prometheus;   // Prometheus metric name
  const char* help;         // Prometheus HELP
  double to_prometheus = 1;  // metrics.jsonl's unit -> Prometheus's (GiB -> bytes)
};

// What a logged step reports (StepMetrics, train/metrics_log.h, fills the values).
inline const RunMetric kStepMetrics[] = {
    {"step", "", "trident_step", "the last logged optimizer step"},
    {"loss", "lm loss", "trident_loss", "training loss, mean over the steps since the last logged one (nats)"},
    {"loss_step", "lm loss (step)", "trident_loss_step", "training loss of the last logged step alone (nats)"},
    {"lr", "learning-rate", "trident_learning_rate", "learning rate"},
    {"grad_norm", "grad-norm", "trident_grad_norm", "global gradient norm before clipping"},
    {"step_time_s", "iteration-time", "trident_step_time_seconds", "wall time of the last logged step"},
    {"tokens_per_s", "throughput/tokens-per-second", "trident_tokens_per_second", "tokens trained per second"},
    {"mfu", "throughput/mfu", "trident_mfu_ratio", "model FLOPs utilization against the peak"},
    {"memory_gib", "memory/resident-gib", "trident_memory_resident_bytes", "rank 0's resident memory",
     1024.0 * 1024 * 1024},
    {"data_wait_s", "time/data-wait", "trident_data_wait_seconds", "time the step waited for its batch"},
    {"comm_wait_s", "time/dp-wait", "trident_dp_wait_seconds", "time the step waited for the data-parallel reduction"},
    {"bubble_s", "time/pipeline-bubble", "trident_pipeline_bubble_seconds",
     "time stage 0 waited on its pipeline neighbours in the step"},
    {"global_batch", "batch-size", "trident_batch_size_sequences", "sequences per optimizer step"},
    {"skipped_steps", "skipped-steps", "trident_skipped_steps_total", "steps skipped for a non-finite loss or norm"},
    {"loss_spikes", "loss-spikes", "trident_loss_spikes_total", "loss spikes reported (train.spike_factor)"},
    {"straggler_reports", "stragglers", "trident_straggler_reports_total", "log steps that named a straggler"},
};

// What a mixture of experts adds to a step (a dense model logs none of it).
inline const RunMetric kMixtureOfExpertsMetrics[] = {
    {"aux_loss", "moe/auxiliary-loss", "trident_moe_auxiliary_loss",
     "the routers' load-balancing and z-losses of the last logged step, their coefficients applied (nats)"},
    {"expert_load", "moe/expert-load-max", "trident_moe_expert_load_max",
     "the most loaded expert's tokens over the mean expert's, in the least balanced layer (1: balanced)"},
    {"all_to_all_bytes", "moe/all-to-all-bytes", "trident_moe_all_to_all_bytes",
     "bytes the expert-parallel token exchanges of the last logged step sent to other ranks, all ranks together "
     "(0: ep 1)"},
    {"tokens_dropped", "moe/tokens-dropped", "trident_moe_tokens_dropped",
     "token-expert pairs of the last logged step that the routers chose and no expert computed (0: dropless)"},
    {"tokens_routed", "moe/tokens-routed", "trident_moe_tokens_routed",
     "token-expert pairs the routers chose in the last logged step, every MoE layer (tokens x top-k x layers)"},
};

// What a run with checkpoint.upload adds (ckpt/checkpoint_upload.h).
inline const RunMetric kS3Metrics[] = {
    {"s3_step", "s3/checkpoint-step", "trident_s3_checkpoint_step", "the step of the checkpoint S3's latest names (-1: none)"},
    {"s3_lag_steps", "s3/lag-steps", "trident_s3_lag_steps",
     "steps between the newest checkpoint on disk and the one S3's latest names"},
    {"s3_upload_bytes", "s3/upload-bytes", "trident_s3_upload_bytes", "bytes of the last completed upload's node files"},
    {"s3_upload_seconds", "s3/upload-seconds", "trident_s3_upload_seconds", "seconds the last completed upload took"},
    {"s3_upload_retries", "s3/upload-retries", "trident_s3_upload_retries", "requests the last completed upload retried"},
};

// Goodput so far in the run (train/goodput.h): the ratio, then where the wall time went.
inline const RunMetric kGoodputMetrics[] = {
    {"goodput_ratio", "goodput/ratio", "trident_goodput_ratio",
     "productive step time over the wall time so far, restarts and recomputed steps included"},
    {"goodput_productive_s", "goodput/productive-seconds", "trident_goodput_productive_seconds",
     "seconds of steps that moved training forward"},
    {"goodput_recomputed_s", "goodput/recomputed-seconds", "trident_goodput_recomputed_seconds",
     "seconds of steps trained again after a failure (lost work)"},
    {"goodput_restart_s", "goodput/restart-seconds", "trident_goodput_restart_seconds",
     "seconds from the failed run's last step to this run's first"},
    {"goodput_startup_s", "goodput/startup-seconds", "trident_goodput_startup_seconds",
     "seconds a fresh run took to reach its first step"},
    {"goodput_checkpoint_s", "goodput/checkpoint-seconds", "trident_goodput_checkpoint_seconds",
     "seconds training was blocked on checkpoint saves"},
    {"goodput_data_wait_s", "goodput/data-wait-seconds", "trident_goodput_data_wait_seconds",
     "seconds steps waited for their batch"},
    {"goodput_evaluation_s", "goodput/evaluation-seconds", "trident_goodput_evaluation_seconds",
     "seconds of validation and samples"},
    {"goodput_other_s", "goodput/other-seconds", "trident_goodput_other_seconds",
     "the rest of the wall time (logging, replica checks)"},
};

// What a validation reports.
inline const RunMetric kValidationMetrics[] = {
    {"val_loss", "lm loss validation", "trident_validation_loss", "validation loss (nats)"},
    {"val_perplexity", "lm loss validation ppl", "trident_validation_perplexity", "validation perplexity"},
};

// A figure with its value.
using MetricValue = std::pair<const RunMetric*, double>;

}  // namespace trident
