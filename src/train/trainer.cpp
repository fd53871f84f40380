// `trident train`, in named pieces: the data, the setup (shared with verify and the
// tests: train/setup.h), where training starts, the startup report, and per step the
// work, the log line, the checkpoint or stop, and the validation.
#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <memory>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_download.h"
#include "ckpt/checkpoint_lease.h"
#include "ckpt/checkpoint_upload.h"
#include "ckpt/hf_checkpoint.h"
#include "health/health_verdict.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "model/transformer_spec.h"
#include "optim/lr_schedule.h"
#include "parallel/agreement.h"
#include "parallel/progress_board.h"
#include "runtime/byte_size.h"
#include "runtime/exit_codes.h"
#include "kernels/base/memory.h"
#include "runtime/injected_faults.h"
#include "runtime/stop_signal.h"
#include "runtime/timer.h"
#include "plan/device_peak.h"
#include "monitor/step_trace.h"
#include "monitor/tensorboard.h"
#include "train/core_sharing.h"
#include "train/divergence.h"
#include "train/inference.h"
#include "plan/memory_fit.h"
#include "plan/memory_plan.h"
#include "train/metrics_log.h"
#include "train/resume_settings.h"
#include "train/run_monitor.h"
#include "train/setup.h"
#include "data/s3_data.h"
#include "train/host_faults.h"
#include "train/replica_check.h"
#include "train/stragglers.h"
#include "train/goodput.h"
#include "ckpt/memory_tier.h"
#include "runtime/wall_clock.h"

namespace trident {

namespace {

constexpr uint64_t kTrainStream = 1, kValStream = 2;

std::string format_loss(double loss) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", loss);
  return text;
}

// ---- data: every rank opens it and takes its slice of each global batch ----
TrainingData load_data(const Config& config, ParallelState& parallel, std::unique_ptr<Tokenizer>& tokenizer) {
  TrainingData data;
  const StagedData staged = stage_s3_data(config, parallel);  // s3:// entries: their local copies, or streamed
  const DataConfig& d = staged.data;
  run_collectively([&] {
    tokenizer = make_tokenizer(d.tokenizer, d.tokenizer_path);
    data = open_training_data(d.path, d.val_path, d.val_fraction, *tokenizer, d.json_key, staged.open_remote);
    data.background = staged.background;
    require_data_fits(data, config.model.vocab_size, config.model.seq_len);
  });
  if (parallel.is_root())
    std::printf("data: %s; %llu train / %llu val tokens; unigram entropy %.4f nats\n", data.description.c_str(),
                static_cast<unsigned long long>(data.train.tokens()), static_cast<unsigned long long>(data.val.tokens()),
                data.unigram_entropy);
  return data;
}

// Whether every range of a split holds at least one sequence (a tiny validation split
// may not, and is then skipped).
bool has_sequences(const Split& split, int seq_len) {
  if (split.ranges.empty()) return false;
  for (const TokenRange& r : split.ranges)
    if (r.size() <= static_cast<uint64_t>(seq_len) + 1) return false;
  return true;
}

// Mean loss over `batches` fixed validation batches (the same ones at every
// evaluation), each dp rank taking its slice of every batch.
double validation_loss(StepRunner& runner, const BatchSampler& sampler, int batches, int global_batch,
                       ParallelState& parallel) {
  const int local = global_batch / parallel.size(Axis::dp);
  std::vector<int32_t> inputs, targets;
  double total = 0;
  for (int v = 0; v < batches; v++) {
    sampler.fill(v, parallel.coord(Axis::dp) * local, local, inputs, targets);
    total += runner.evaluate(inputs.data(), targets.data(), local, global_batch);
  }
  return total / batches;
}

// What every rank learns at a step's end, in one all-reduce: whether to stop, and
// whether rank 0 found the lease on checkpoint.dir taken over by another run.
struct StepEndVerdict {
  bool stop = false, lease_lost = false;
};

// SIGTERM and SIGUSR1 (what Slurm sends before a time limit or a preemption) ask every
// rank to finish its step, save a checkpoint and exit 0: a signal on any rank counts.
// lease_lost: rank 0's (ckpt/checkpoint_lease.h): the run must not write there again.
StepEndVerdict stop_requested(ParallelState& parallel, bool lease_lost) {
  const double flags = parallel.world().all_reduce((stop_signal_received() ? 1.0 : 0.0) + (lease_lost ? 2.0 : 0.0),
                                                   ReduceOp::max);
  return {flags >= 1, flags >= 2};
}

// The end of a run whose checkpoint.dir another run took over (its lease judged stale, or
// a requeue of this job): exit 2 on every rank, nothing more written there.
[[noreturn]] void end_on_lost_lease(const Config& config, const CheckpointLease* lease) {
  throw AgreedUsageError("this run lost its lease on checkpoint.dir " + config.checkpoint.dir + ": " +
                         (lease != nullptr ? lease->lost_to() : std::string("see rank 0")) +
                         "; it stops here and writes nothing more there (one folder, one run: its lease went "
                         "unrenewed past its lease_s and was taken over, or its Slurm job was requeued)");
}

// The end of a run (or a stop on a signal) waits for the last checkpoint's upload, at
// most checkpoint.upload_timeout_s: exit 3 if it cannot finish (train.sbatch requeues;
// the checkpoint is complete on disk, and the requeued job uploads it). Collective.
void finish_uploads(const Config& config, Checkpointer& checkpointer) {
  CheckpointUploader* uploader = checkpointer.uploader();
  if (uploader == nullptr) return;
  const std::string why_not = uploader->finish();
  if (why_not.empty()) return;
  throw AgreedInfrastructureError("the last checkpoint is not in " + config.checkpoint.upload + ": " + why_not +
                                  "; it is complete on disk under " + config.checkpoint.dir +
                                  ", and a requeued job uploads it");
}

// Where training resumes: a checkpoint's step directory and manifest (rank 0's reading,
// on every rank), and whether it came from S3.
struct ResumePoint {
  std::string dir, manifest_text;
  std::optional<StagedCheckpoint> from_s3;
};

// Where training starts: a checkpoint (checkpoint.load, else the latest under
// checkpoint.dir, if any, else with checkpoint.upload the latest in S3 when it is newer),
// or exported parameters (checkpoint.init_from), or step 0. latest_first: the newest
// complete checkpoint under checkpoint.dir before checkpoint.load (going back mid-run);
// else checkpoint.load first (where a run starts). Collective.
ResumePoint resume_point(const Config& config, ParallelState& parallel, Checkpointer& checkpointer, bool latest_first) {
  const CheckpointConfig& cc = config.checkpoint;
  CheckpointUploader* uploader = checkpointer.uploader();
  ResumePoint r;
  int local_step = -1;
  std::string local_error;  // rank 0: checkpoint.dir's checkpoints unreadable here, S3 asked instead
  run_collectively([&] {
    if (!parallel.is_root()) return;
    if (!cc.dir.empty() && (latest_first || cc.load.empty())) {
      try {
        if (auto latest = find_latest_checkpoint(cc.dir)) r.dir = latest->dir;
      } catch (const UsageError& e) {
        // Node-local disks hold their own node's file alone: S3 has the others.
        if (uploader == nullptr) throw;
        local_error = e.what();
        std::fprintf(stderr, "trident: warning: %s; looking in %s\n", e.what(), cc.upload.c_str());
      }
    }
    if (!cc.load.empty() && (r.dir.empty() || !latest_first)) r.dir = read_manifest(cc.load).dir;
    if (r.dir.empty()) return;
    std::ifstream in(std::filesystem::path(r.dir) / "manifest.json");
    std::stringstream text;
    text << in.rdbuf();
    r.manifest_text = text.str();
    local_step = parse_manifest(r.manifest_text, r.dir, r.dir).step;
  });
  r.dir = broadcast_string(r.dir);
  r.manifest_text = broadcast_string(r.manifest_text);
  local_step = static_cast<int>(parallel.world().all_reduce(static_cast<double>(local_step), ReduceOp::max));
  // S3 when newer than the disk; going back mid-run, when the disk has nothing readable.
  if (uploader != nullptr && (latest_first ? r.dir.empty() : cc.load.empty())) {
    r.from_s3 = stage_from_s3(cc, parallel, uploader->remote_if_here(), checkpointer.layout(), local_step);
    if (r.from_s3) {
      r.dir = r.from_s3->manifest.dir;
      r.manifest_text = r.from_s3->manifest_text;
    }
  }
  // Checkpoints on disk that cannot be read, and none in S3 either: not a fresh start.
  local_error = broadcast_string(local_error);
  if (!local_error.empty() && r.dir.empty()) throw AgreedUsageError(local_error + "; and " + cc.upload + " holds no complete checkpoint");
  return r;
}

// Whether the end of `step` (0-based) saves a checkpoint without being asked by a signal:
// every checkpoint.every_steps, and the last step always (as Megatron and torchtitan do), so
// a run given only checkpoint.dir leaves something for eval and a resume. A last step
// that is also periodic is one save.
bool checkpoint_due(const Config& config, int step) {
  const CheckpointConfig& cc = config.checkpoint;
  if (cc.dir.empty()) return false;
  return step + 1 == config.train.steps || (cc.every_steps > 0 && (step + 1) % cc.every_steps == 0);
}

// Whether `dir` holds a complete checkpoint to go back to (rank 0's question).
bool has_checkpoint(const std::string& dir) {
  if (dir.empty()) return false;
  try {
    return find_latest_checkpoint(dir, /*quiet=*/true).has_value();
  } catch (...) {  // unreadable: nothing to go back to (and no rank left waiting)
    return false;
  }
}

// Where a run starts: the checkpoint's step (0: none), and what that checkpoint's run
// was configured with (its stored config; empty without a checkpoint).
struct Restored {
  int step = 0;
  std::string dir, config_ini;
};

Restored restore(const Config& config, ParallelState& parallel, Transformer& model, Checkpointer& checkpointer,
                 bool latest_first = false) {
  const CheckpointConfig& cc = config.checkpoint;
  const ResumePoint point = resume_point(config, parallel, checkpointer, latest_first);
  if (!point.dir.empty()) {
    Restored r;
    r.dir = point.dir;
    Timer loading;
    double bytes = 0;
    Manifest m;
    std::string routing_changed;
    run_collectively([&] {
      m = parse_manifest(point.manifest_text, point.dir, point.dir + "/manifest.json");
      for (const ManifestFile& f : m.files) bytes += static_cast<double>(f.bytes);
      r.config_ini = m.config_ini;
      routing_changed = check_resumed_experts(m.model, config.model, point.dir);  // the manifest's model record
      r.step = checkpointer.load(m);
    });
    parallel.world().barrier();
    if (parallel.is_root()) {
      if (const auto& s3 = point.from_s3)
        std::printf("resuming from S3 (%s): %d node file%s, %s downloaded in %.2f s (%.3f GB/s), each checked "
                    "against the manifest's CRC-32\n",
                    cc.upload.c_str(), s3->files, s3->files == 1 ? "" : "s", byte_size(s3->bytes).c_str(), s3->seconds,
                    s3->bytes / 1e9 / std::max(s3->seconds, 1e-9));
      std::printf("resumed from %s: continuing after step %d (%s of node files loaded in %.2f s)\n",
                  point.dir.c_str(), r.step, byte_size(bytes).c_str(), loading.seconds());
      if (!routing_changed.empty()) std::printf("%s (from step %d)\n", routing_changed.c_str(), r.step + 1);
    }
    if (!latest_first && !point.from_s3) checkpointer.upload_if_missing(m, point.manifest_text);
    return r;
  }
  if (!cc.init_from.empty()) {
    HfTransfer read;
    std::string what;
    run_collectively([&] {
      if (is_hf_checkpoint(cc.init_from)) {
        read = import_hf(model.store().parameters(), cc.init_from);
      } else if (const std::optional<Manifest> m = trident_checkpoint_at(cc.init_from)) {
        init_parameters_from_checkpoint(model.store().parameters(), config.model, *m);
        what = " (the parameters of trident checkpoint " + m->dir + ", step " + std::to_string(m->step) +
               "; optimizer state and data position start afresh)";
      } else {
        init_parameters_from(model.store().parameters(), cc.init_from);
      }
    });
    const double bytes = parallel.world().all_reduce(static_cast<double>(read.bytes));
    const double seconds = parallel.world().all_reduce(read.seconds, ReduceOp::max);
    const double growth = parallel.world().all_reduce(static_cast<double>(read.peak_growth_bytes), ReduceOp::max);
    const double slice = parallel.world().all_reduce(static_cast<double>(read.largest_slice_bytes), ReduceOp::max);
    if (parallel.is_root()) {
      std::printf("parameters initialized from %s%s", cc.init_from.c_str(), what.c_str());
      if (bytes > 0)
        std::printf(" (Hugging Face: %s read by all ranks in %.2f s, %.2f GB/s; peak memory +%.1f MiB on the "
                    "busiest rank, largest slice %.1f MiB)",
                    byte_size(bytes).c_str(), seconds, bytes / 1e9 / std::max(seconds, 1e-9), growth / (1 << 20), slice / (1 << 20));
      std::printf("\n");
    }
  }
  return {};
}

// The resume ladder's first rung: the newest step whose every rank's piece is in node memory
// (its own node's, or a partner node's copy for a node that was replaced), where it is newer
// than the disk's newest checkpoint (and checkpoint.load names none). Nothing (step 0)
// otherwise, or where a copy is damaged: the disk's then, or S3's (restore()).
Restored restore_from_memory(const Config& config, ParallelState& parallel, MemoryTier& memory) {
  if (!memory.enabled() || !config.checkpoint.load.empty()) return {};
  const double on_disk = parallel.world().all_reduce(
      parallel.is_root() ? static_cast<double>(step_of_name(latest_name(config.checkpoint.dir))) : -1.0, ReduceOp::max);
  const MemoryRestore found = memory.restore(std::max(0, static_cast<int>(on_disk)));
  if (found.step <= 0) return {};
  if (parallel.is_root())
    std::printf("resumed from node memory: continuing after step %d (%s; the disk's newest checkpoint is %s)\n",
                found.step, found.report.c_str(),
                on_disk < 0 ? "none" : ("step " + std::to_string(static_cast<int>(on_disk))).c_str());
  Restored r;
  r.step = found.step;
  r.dir = "node memory";
  return r;
}

// The learning rate of every step, from the config (optim/lr_schedule.h).
LearningRateSchedule schedule_of(const TrainConfig& t) {
  LearningRateSchedule s;
  s.lr = t.lr;
  s.min_lr = t.min_lr;
  s.warmup_steps = t.warmup_steps;
  s.decay_steps = t.decay_end();
  s.shape = t.lr_schedule;
  const int after_warmup = std::max(0, s.decay_steps - s.warmup_steps);
  s.wsd_decay = std::max(1, static_cast<int>(std::lround(t.wsd_decay >= 1 ? t.wsd_decay : t.wsd_decay * after_warmup)));
  return s;
}

// Rank 0: the schedule at start, and on a resume what changed from the checkpoint's
// (a longer train.steps stretches a decay that follows it: say so, and how to keep it).
void print_schedule(const Config& config, const Restored& restored) {
  const LearningRateSchedule now = schedule_of(config.train);
  std::printf("learning rate: %s", now.describe().c_str());
  if (restored.step > 0) std::printf("; step %d: %.3e", restored.step + 1, now.at(restored.step));
  std::printf("\n");
  const TrainConfig& t = config.train;
  if (t.warmup_steps > t.steps)  // legal (a run to be extended), but rarely meant
    std::fprintf(stderr, "trident: warning: train.warmup_steps (%d) is more than train.steps (%d): the run ends in its "
                 "warmup, at a rate of %.3e, below train.lr (%.3e)\n", t.warmup_steps, t.steps,
                 now.at(std::max(0, t.steps - 1)), t.lr);
  if (restored.config_ini.empty()) return;
  TrainConfig saved;
  try {
    saved = parse_command_line("train", {}, restored.config_ini).config.train;
  } catch (const UsageError&) {
    return;  // a stored config this build cannot read: nothing to compare
  }
  const LearningRateSchedule before = schedule_of(saved);
  const double was = before.at(restored.step), is = now.at(restored.step);
  if (now.describe() == before.describe()) return;
  // Still in the warmup (under both schedules): the decay has not begun, so it is not what moved the rate.
  const bool warming = restored.step < now.warmup_steps && restored.step < before.warmup_steps;
  std::printf("learning rate: the checkpoint's run had %s; at step %d the rate is now %.3e (was %.3e)%s",
              before.describe().c_str(), restored.step + 1, is, was, warming ? ", still in the warmup" : "");
  if (saved.steps != config.train.steps && saved.lr_decay_steps == 0 && config.train.lr_decay_steps == 0) {
    if (warming) {
      std::printf("; train.steps went from %d to %d: the decay after the warmup will end at step %d, not %d",
                  saved.steps, config.train.steps, config.train.steps, saved.steps);
      if (saved.steps > config.train.warmup_steps)  // a decay end the warmup allows
        std::printf("; --train.lr_decay_steps=%d keeps the curve the run was on", saved.steps);
    } else
      std::printf(": train.steps went from %d to %d and the decay follows it; --train.lr_decay_steps=%d keeps the "
                  "curve the run was on",
                  saved.steps, config.train.steps, saved.steps);
  }
  std::printf("\n");
}

void print_startup(const Config& config, ParallelState& parallel, TrainingSetup& s, kernels::Kernels& k,
                   const DevicePeak& peak, const RankMemoryPlan& memory, double setup_s) {
  const TransformerSpec& spec = s.model.spec();
  const int tp = parallel.size(Axis::tp), dp = parallel.size(Axis::dp);
  const double floats = static_cast<double>(s.model.layout().total_floats());
  // A mixture of experts: the parameters a token passes through beside all of them.
  char active[48] = "";
  if (active_parameter_count(spec) != parameter_count(spec))
    std::snprintf(active, sizeof active, " (%.2fM active per token)", active_parameter_count(spec) / 1e6);
  // Expert parallelism: this rank's experts of each block.
  const int ep = s.model.layout().ep_size();
  char experts[64] = "";
  if (ep > 1) std::snprintf(experts, sizeof experts, ", %d of the %d experts", spec.n_experts / ep, spec.n_experts);
  std::printf("model: %s (vocabulary padded to %d): %.2fM parameters%s, %.2fM on this rank (1/%d of the split tensors%s), "
              "%.1f MFLOP/token\n",
              spec.describe().c_str(), spec.padded_vocab(tp), parameter_count(spec) / 1e6, active, floats / 1e6, tp,
              experts, flops_per_token(spec) / 1e6);
  std::printf("memory plan of rank 0: %.3f GiB: %s; resident now %.3f GiB\n",
              gib(static_cast<double>(memory.total_bytes())), memory.describe().c_str(),
              gib(static_cast<double>(resident_bytes())));
  std::printf("batch: %d sequences per step = %d dp x %d micro-batches x %d; %zu gradient buckets of <= %.0f MiB%s\n",
              config.train.global_batch, dp, s.local_batch / config.train.micro_batch, config.train.micro_batch,
              s.data_parallel.buckets().size(), config.parallel.bucket_mb,
              config.parallel.overlap ? ", reduced during backward" : "");
  if (parallel.size(Axis::pp) > 1) {
    std::string held;  // this rank's chunks' layers (stage 0 is rank 0's)
    for (const LayerRange& r : s.stage.stage.chunks)
      held += (held.empty() ? "" : ", ") + std::to_string(r.first) + ".." + std::to_string(r.first + r.count - 1);
    std::printf("pipeline: %d stages, layers %s, schedule %s%s; stage 0 holds layers %s and %d activation sets%s\n",
                parallel.size(Axis::pp), config.parallel.pp_layers.empty() ? "balanced" : config.parallel.pp_layers.c_str(),
                name_of(config.parallel.schedule),
                s.plan.chunks > 1 ? (" with " + std::to_string(s.plan.chunks) + " chunks per stage").c_str() : "",
                held.c_str(), s.stage.slots, s.plan.chunks > 1 ? " (one chunk's each)" : "");
  }
  if (s.data_parallel.shards_optimizer_state())
    std::printf("ZeRO-%d: states sharded over %d dp ranks%s\n", s.data_parallel.zero_stage(),
                s.data_parallel.shard_group().size(),
                s.hybrid.replica ? (", replicated over " + std::to_string(s.hybrid.replica->size()) +
                                    " groups (hybrid sharding)").c_str()
                                 : "");
  if (config.parallel.sequence_parallel && tp > 1)
    std::printf("sequence parallel: each tp rank holds %d of the %d rows of a micro-batch's residual stream\n",
                config.train.micro_batch * config.model.seq_len / tp, config.train.micro_batch * config.model.seq_len);
  if (s.shared_heads != nullptr)
    std::printf("tensor parallel: %d key/value heads over tp %d: each held by %d ranks, their gradients summed\n",
                spec.n_kv_head, tp, s.shared_heads->size());
  std::printf("device: %s, %s%s%s, %d threads per rank; setup %.2f s\n", k.name().c_str(),
              kernels::precision_name(k.precision()), k.details().empty() ? "" : ", ", k.details().c_str(),
              omp_get_max_threads(), setup_s);
  std::printf("MFU peak: %.1f GFLOP/s in all, %.1f per rank (%s)\n", peak.total_gflops, peak.per_rank_gflops,
              peak.source.c_str());
}

// Where this rank's memory stood before the setup allocated anything.
struct MemoryBaseline {
  size_t resident = 0, device_free = 0;
};

// What the rank took since: the growth of its peak resident size (host memory), or the
// device memory now taken; to hold against the plan's total (device part on a GPU).
size_t memory_taken(const MemoryBaseline& b, kernels::Kernels& k) {
  if (k.host_memory()) {
    const size_t peak = peak_resident_bytes();
    return peak > b.resident ? peak - b.resident : 0;
  }
  const size_t now = k.memory_pool().free_bytes;
  return b.device_free > now ? b.device_free - now : 0;
}

// What one optimizer step measured.
struct StepOutcome {
  double loss = 0, lr = 0, seconds = 0, data_seconds = 0;
  double compute_seconds = 0, update_seconds = 0;  // forward/backward passes; clip + update
  double aux_loss = std::numeric_limits<double>::quiet_NaN();  // a mixture of experts' (NaN: none)
  std::vector<double> expert_load;  // per MoE layer (StepRunner::expert_load)
  double all_to_all_bytes = 0, tokens_routed = 0, tokens_dropped = 0;  // StepRunner's
  std::vector<std::vector<double>> expert_tokens;  // per MoE layer and expert (StepRunner::expert_tokens)
  GradientNorm norm;
  uint64_t host_syncs = 0;  // the kernels' host synchronizations (kernels.h: on a GPU, drained queues)
};

// The step's work: this rank's slice of the global batch, gradients, update.
StepOutcome run_step(int step, const Config& config, ParallelState& parallel, TrainingSetup& s, kernels::Kernels& k,
                     const BatchSampler& sampler, const LearningRateSchedule& schedule, std::vector<int32_t>& inputs,
                     std::vector<int32_t>& targets) {
  const trace::Span whole("step", [&] { return "step " + std::to_string(step + 1); });
  Timer timer;
  StepOutcome o;
  {
    const trace::Span span("data", "data");
    sampler.fill(step, parallel.coord(Axis::dp) * s.local_batch, s.local_batch, inputs, targets);
    // data.stream: the next step's sequences come down while this one computes.
    if (step + 1 < config.train.steps) sampler.prefetch(step + 1, parallel.coord(Axis::dp) * s.local_batch, s.local_batch);
  }
  o.data_seconds = timer.seconds();
  const double slowed = injected_faults::slow_down(parallel.rank());
  const uint64_t syncs_before = k.host_syncs();
  o.loss = s.runner.compute_gradients(inputs.data(), targets.data(), s.local_batch, config.train.global_batch);
  if (const RouterTotals& routing = s.runner.routing(); !routing.expert_load().empty()) {  // a mixture of experts (its count may be the family's default)
    o.aux_loss = routing.aux_loss();
    o.expert_load = routing.expert_load();
    o.all_to_all_bytes = routing.all_to_all_bytes();
    o.tokens_routed = routing.tokens_routed();
    o.tokens_dropped = routing.tokens_dropped();
    o.expert_tokens = routing.expert_tokens();
  }
  o.compute_seconds = s.runner.compute_s() + slowed;
  o.host_syncs = k.host_syncs() - syncs_before;
  o.lr = schedule.at(step);
  injected_faults::poison_gradient(parallel.rank(), step + 1, k, [&s]() -> std::pair<float*, std::string> {
    for (const FlatRange& r : s.data_parallel.owned())  // a counted tensor inside a range this rank owns
      for (const ParameterTensor& t : s.model.layout().tensors()) {
        const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
        if (t.placement.counted && begin < end) return {s.data_parallel.gradient_at(begin), t.name};
      }
    return {nullptr, ""};
  });
  const double before_update = timer.seconds();
  const uint64_t syncs_before_update = k.host_syncs();
  o.norm = s.runner.update(o.lr, config.train.grad_clip, std::isfinite(o.loss));
  o.host_syncs += k.host_syncs() - syncs_before_update;
  o.seconds = timer.seconds();
  o.update_seconds = o.seconds - before_update;
  return o;
}

// The per-step work after the step itself: the log line, the checkpoint (when due or
// asked for by a signal) and the stop, the validation.
class StepEnd {
 public:
  // resumed_from: the checkpoint's step (0: a fresh start); stragglers: whether a rank's
  // work time means anything here (not where ranks take turns on the cores).
  StepEnd(const Config& config, ParallelState& parallel, TrainingSetup& s, Checkpointer& checkpointer,
          const TrainingData& data, const Tokenizer& tokenizer, const DevicePeak& peak, TrainResult& result,
          int resumed_from, bool stragglers, RunMonitor& monitor, HostFaults& faults, CheckpointLease* lease,
          GoodputLedger& goodput)
      : config_(config), parallel_(parallel), s_(s), checkpointer_(checkpointer), data_(data), tokenizer_(tokenizer),
        result_(result), monitor_(monitor), faults_(faults), lease_(lease), goodput_(goodput),
        log_(parallel.is_root() ? config.log.run_dir : "", resumed_from,
             parallel.is_root() ? config.log.tensorboard_folder() : ""),
        flops_per_token_(flops_per_token(s.model.spec())),
        tokens_per_step_(static_cast<double>(config.train.global_batch) * config.model.seq_len),
        peak_total_(peak.total_gflops),
        have_val_(has_sequences(data.val, config.model.seq_len) && config.log.val_batches > 0),
        stragglers_(stragglers && config.log.straggler_factor > 0 && parallel.dims().world() > 1) {}

  bool have_val() const { return have_val_; }
  bool saved_any() const { return saved_any_; }
  const MetricsLog& log() const { return log_; }

  MetricsLog& log() { return log_; }

  // Back at checkpoint `step` after a streak of non-finite steps: what was logged after it
  // is trained again (TensorBoard told so, metrics.jsonl cut back), the interval mean afresh.
  void rolled_back_to(int step) {
    interval_loss_ = 0;
    interval_steps_ = 0;
    if (parallel_.is_root()) log_.rolled_back_to(step);
  }

  // Accounts the step and prints its line when due (rank 0); `guard`: its counts so far.
  void record(int step, int start_step, const StepOutcome& o, const DivergenceGuard& guard) {
    const TrainConfig& tc = config_.train;
    if (monitor_.exporter() != nullptr && parallel_.is_root()) monitor_.exporter()->step_done();
    result_.step_time_s += o.seconds;
    result_.data_wait_s += o.data_seconds;
    goodput_.step(step, o.seconds, o.data_seconds);
    result_.comm_wait_s += s_.runner.comm_wait_s();
    time_per_step_ = step == start_step ? o.seconds : 0.9 * time_per_step_ + 0.1 * o.seconds;
    if (step == start_step) result_.first_loss = o.loss;
    result_.last_loss = o.loss;
    if (step > start_step) {  // the first step warms up (allocation, caches, kernel choice)
      result_.steady_steps++;
      result_.host_syncs_per_step = std::max(result_.host_syncs_per_step, o.host_syncs);
      result_.steady_time_s += o.seconds;
      // The rest of the step: waiting on the pipeline's neighbours (this stage's bubble).
      result_.pipeline_wait_s += std::max(0.0, o.seconds - o.data_seconds - o.compute_seconds -
                                                   s_.runner.comm_wait_s() - o.update_seconds);
    }
    result_.last_step_tokens_per_s = tokens_per_step_ / o.seconds;
    result_.last_step_mfu = flops_per_token_ * tokens_per_step_ / o.seconds / (peak_total_ * 1e9);
    result_.steps_run++;
    if (std::isfinite(o.loss)) {  // the logged loss: the mean since the last line (skipped steps left out)
      interval_loss_ += o.loss;
      interval_steps_++;
    }
    const bool last = step + 1 == tc.steps;
    if (!((step + 1) % config_.log.every_steps == 0 || step == 0 || last)) return;
    // Every rank's own work (not its waiting on the others), against its stage's median.
    const Straggler straggler = stragglers_ ? find_straggler(parallel_, o.data_seconds + o.compute_seconds,
                                                             config_.log.straggler_factor)
                                            : Straggler{};
    std::vector<MachineSample> machines = monitor_.sample_machines();  // every machine's GPUs and host
    const double mean_loss = interval_steps_ > 0 ? interval_loss_ / interval_steps_ : o.loss;
    const int mean_of = std::max(interval_steps_, 1);
    interval_loss_ = 0;
    interval_steps_ = 0;
    // A straggler that stays one, GPU errors that keep coming: the run ends naming the host.
    std::optional<health::Verdict> verdict;
    if (parallel_.is_root()) {
      if (straggler.found) {
        std::printf("%s\n", straggler.describe(step + 1).c_str());
        result_.straggler_reports++;
      }
      verdict = faults_.stragglers().observe(straggler, step + 1, faults_.hosts());
      if (auto gpu = faults_.gpu_errors().observe(machines, step + 1, faults_.hosts()); gpu && !verdict) verdict = gpu;
    }
    faults_.end_run_if(verdict, [&] { checkpointer_.finish(); });
    if (!parallel_.is_root()) return;
    StepMetrics m;
    m.step = step + 1;
    m.total_steps = tc.steps;
    m.loss = mean_loss;
    m.loss_step = o.loss;
    m.loss_steps = mean_of;
    m.aux_loss = o.aux_loss;
    m.expert_load = o.expert_load;
    m.all_to_all_bytes = o.all_to_all_bytes;
    m.tokens_routed = o.tokens_routed;
    m.tokens_dropped = o.tokens_dropped;
    for (const std::vector<double>& layer : o.expert_tokens) {
      m.expert_tokens.resize(layer.size(), 0.0);
      for (size_t e = 0; e < layer.size(); e++) m.expert_tokens[e] += layer[e];
    }
    if (config_.log.expert_tokens_per_layer) m.expert_tokens_per_layer = o.expert_tokens;
    if (const CheckpointUploader* uploader = checkpointer_.uploader()) {
      const CheckpointUploader::Status s = uploader->status();
      m.s3 = {static_cast<double>(s.s3_step), static_cast<double>(s.lag_steps), s.bytes, s.seconds, s.retries};
    }
    m.lr = o.lr;
    m.grad_norm = o.norm.norm;
    m.tokens_per_s = result_.last_step_tokens_per_s;
    m.mfu = result_.last_step_mfu;
    m.step_time_s = o.seconds;
    m.comm_wait_s = s_.runner.comm_wait_s();
    m.data_wait_s = o.data_seconds;
    m.bubble_s = parallel_.size(Axis::pp) > 1 ? std::max(0.0, o.seconds - o.data_seconds - o.compute_seconds -
                                                             s_.runner.comm_wait_s() - o.update_seconds)
                                         : 0.0;
    m.global_batch = tc.global_batch;
    m.skipped_steps = guard.skipped_steps();
    m.loss_spikes = guard.loss_spikes();
    m.straggler_reports = result_.straggler_reports;
    m.machines = std::move(machines);
    m.memory_gib = gib(static_cast<double>(resident_bytes()));
    m.eta_s = time_per_step_ * (tc.steps - step - 1);
    m.goodput = goodput_.values();
    log_.log_step(m);
  }

  // Saves a checkpoint when due or when a stop signal arrived on any rank; true: stop.
  // may_save false (a streak of non-finite steps): nothing is saved. Rank 0 renews the
  // lease on checkpoint.dir first (checked before every periodic save, and before a save
  // on a signal that reached rank 0): a lease another run took over ends this one, exit 2,
  // before it writes again.
  bool checkpoint_or_stop(int step, bool may_save) {
    const CheckpointConfig& cc = config_.checkpoint;
    checkpointer_.poll();
    const bool periodic = checkpoint_due(config_, step);
    const bool lost = lease_ != nullptr && !lease_->renew(/*check_now=*/periodic || stop_signal_received());
    const StepEndVerdict verdict = stop_requested(parallel_, lost);
    if (verdict.lease_lost) end_on_lost_lease(config_, lease_);
    const bool stop = verdict.stop;
    const bool due = periodic || stop;
    if (!cc.dir.empty() && due && !may_save && parallel_.is_root())
      std::printf("checkpoint: step %d not saved: the last steps were non-finite\n", step + 1);
    if (!cc.dir.empty() && due && may_save) {
      saved_any_ = true;
      const Timer saving;
      checkpointer_.save(step + 1);
      goodput_.add(GoodputPart::checkpoint, saving.seconds());
      if (monitor_.exporter() != nullptr && parallel_.is_root()) monitor_.exporter()->checkpoint_saved(saving.seconds());
      if (parallel_.is_root() && cc.async)
        std::printf("checkpoint: step %d: training stalled %.3f s for the save\n", step + 1,
                    checkpointer_.last_stall_s());
    }
    if (!stop) return false;
    const Timer finishing;
    checkpointer_.finish();
    goodput_.add(GoodputPart::checkpoint, finishing.seconds());
    if (parallel_.is_root())
      std::printf("stopping after step %d on a signal%s\n", step + 1,
                  cc.dir.empty() ? " (no checkpoint.dir: nothing saved)"
                : may_save     ? ", checkpoint saved"
                               : " (the last steps were non-finite: no checkpoint saved)");
    return true;
  }

  // The validation loss when due, and after the last step.
  void validate_if_due(int step) {
    const bool due = config_.log.val_every_steps > 0 && (step + 1) % config_.log.val_every_steps == 0;
    if (!have_val_ || !(due || step + 1 == config_.train.steps)) return;
    const BatchSampler val_sampler(data_.val, config_.model.seq_len, config_.train.seed, kValStream);
    const Timer evaluating;
    result_.val_loss = validation_loss(s_.runner, val_sampler, config_.log.val_batches, config_.train.global_batch,
                                       parallel_);
    goodput_.add(GoodputPart::evaluation, evaluating.seconds());
    if (parallel_.is_root()) log_.log_validation(step + 1, result_.val_loss);
  }

  // A greedy continuation of the first tokens of the validation split (else of the
  // training split) when due: what the model has learned, for a person to read.
  void sample_if_due(int step) {
    const int every = config_.log.sample_every_steps;
    if (every <= 0 || ((step + 1) % every != 0 && step + 1 != config_.train.steps)) return;
    if (config_.parallel.cp > 1) return;  // a sequence's positions are spread over the cp group: no single row to read
    const Timer sampling;
    const TokenRange& r = (data_.val.ranges.empty() ? data_.train : data_.val).ranges.front();
    std::vector<int32_t> prompt(static_cast<size_t>(std::min<uint64_t>(16, r.size())));
    r.dataset->read(r.begin, prompt.size(), prompt.data());
    SamplingSettings greedy;
    greedy.max_tokens = 48;
    const std::vector<int32_t> out = generate_tokens(s_.runner, prompt, config_.model.seq_len, greedy,
                                                     tokenizer_.special_tokens().eos);
    if (parallel_.is_root()) {
      const std::string start = tokenizer_.decode(prompt);
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), out.begin(), out.end());
      const std::string whole = tokenizer_.decode(all);
      // The prompt, then what the model made of it.
      std::printf("step %d | sample: %s|%s\n", step + 1, printable(start).c_str(),
                  printable(whole.substr(std::min(start.size(), whole.size()))).c_str());
    }
    goodput_.add(GoodputPart::evaluation, sampling.seconds());
  }

 private:
  const Config& config_;
  ParallelState& parallel_;
  TrainingSetup& s_;
  Checkpointer& checkpointer_;
  const TrainingData& data_;
  const Tokenizer& tokenizer_;
  TrainResult& result_;
  RunMonitor& monitor_;
  HostFaults& faults_;
  CheckpointLease* lease_;  // rank 0's, with a checkpoint.dir; else null
  GoodputLedger& goodput_;
  MetricsLog log_;
  const double flops_per_token_, tokens_per_step_, peak_total_;
  const bool have_val_, stragglers_;
  double time_per_step_ = 0;  // smoothed, for the ETA
  double interval_loss_ = 0;  // the finite losses since the last logged step, and their count
  int interval_steps_ = 0;
  bool saved_any_ = false;
};

// The run's averages over the steps after the first, as sweeps and scripts read them.
std::string run_summary_json(const Config& config, ParallelState& parallel, const TrainingSetup& s,
                             const TrainResult& r, const DevicePeak& peak, kernels::Kernels& k) {
  const ParallelDims& d = parallel.dims();
  const double tokens_per_step = static_cast<double>(config.train.global_batch) * config.model.seq_len;
  const double step_s = r.steady_steps > 0 ? r.steady_time_s / r.steady_steps : r.step_time_s;
  const double tokens_per_s = step_s > 0 ? tokens_per_step / step_s : 0;
  const int micro_batches = s.local_batch / config.train.micro_batch;
  const auto share = [&](double part) { return r.step_time_s > 0 ? part / r.step_time_s : 0.0; };
  nlohmann::json j = {
      {"family", s.model.spec().family},
      {"parameters", parameter_count(s.model.spec())},
      {"ranks", d.world()},
      {"dp", d.size(Axis::dp)},
      {"tp", d.size(Axis::tp)},
      {"pp", d.size(Axis::pp)},
      {"zero", config.parallel.zero},
      {"global_batch", config.train.global_batch},
      {"micro_batch", config.train.micro_batch},
      {"seq_len", config.model.seq_len},
      {"device", k.name()},
      {"precision", kernels::precision_name(k.precision())},
      {"steps", config.train.steps},
      {"steady_steps", r.steady_steps},
      {"step_time_s", step_s},
      {"tokens_per_s", tokens_per_s},
      {"mfu", peak.total_gflops > 0 ? tokens_per_s * flops_per_token(s.model.spec()) / (peak.total_gflops * 1e9) : 0.0},
      {"peak_gflops", peak.total_gflops},
      {"peak_source", peak.source},
      {"memory_gib", gib(static_cast<double>(peak_resident_bytes()))},
      {"dp_wait", share(r.comm_wait_s)},
      {"data_wait", share(r.data_wait_s)},
      // Stage 0's wait on its pipeline neighbours (with pp = 1 there is no pipeline: what
      // the step's timed parts leave over is then other ranks' turn on shared cores).
      {"bubble", d.size(Axis::pp) > 1 && r.steady_time_s > 0 ? r.pipeline_wait_s / r.steady_time_s : 0.0},
      {"bubble_theory", static_cast<double>(d.size(Axis::pp) - 1) / (micro_batches + d.size(Axis::pp) - 1)},
      {"loss_first", r.first_loss},
      {"loss_last", r.last_loss},
  };
  if (r.val_loss > 0) j["val_loss"] = r.val_loss;
  return j.dump();
}

std::string host_name() {
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  return host;
}

// How to run this executable again from here: "build/trident", as the user typed it.
std::string this_executable() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "trident";
  const std::filesystem::path here = std::filesystem::relative(exe, std::filesystem::current_path(), ec);
  return !ec && !here.empty() && here.begin()->string() != ".." ? here.string() : exe.string();
}

// A resumed run's summary covers the whole run: the earlier runs' (their summary.json in
// the same log.run_dir) and this one's, averaged over their steps after the first of each.
void with_earlier_runs(nlohmann::json& summary, const std::string& earlier_text) {
  const nlohmann::json earlier = nlohmann::json::parse(earlier_text, nullptr, /*allow_exceptions=*/false);
  summary["runs"] = 1 + (earlier.is_object() ? earlier.value("runs", 1) : 0);
  if (!earlier.is_object()) return;
  const int n0 = earlier.value("steady_steps", 0), n1 = summary.value("steady_steps", 0);
  const double t0 = earlier.value("step_time_s", 0.0), t1 = summary.value("step_time_s", 0.0);
  if (n0 + n1 > 0 && t1 > 0) {
    const double step_s = (n0 * t0 + n1 * t1) / static_cast<double>(n0 + n1);
    summary["tokens_per_s"] = summary["tokens_per_s"].get<double>() * t1 / step_s;
    summary["mfu"] = summary["mfu"].get<double>() * t1 / step_s;
    summary["step_time_s"] = step_s;
  }
  summary["steady_steps"] = n0 + n1;
  for (const char* sum : {"steps_run", "skipped_steps", "straggler_reports"})
    summary[sum] = earlier.value(sum, 0) + summary.value(sum, 0);
  summary["loss_first"] = earlier.value("loss_first", summary.value("loss_first", 0.0));
  summary["memory_gib"] = std::max(earlier.value("memory_gib", 0.0), summary.value("memory_gib", 0.0));
}

}  // namespace

TrainResult train(const Config& given, ParallelState& parallel) {
  const double run_start = unix_seconds();  // goodput's clock
  Config config = given;  // completed below by what the data says (data.eod_token)
  const TrainConfig& tc = config.train;
  std::unique_ptr<kernels::Kernels> k =
      kernels::make_kernels(tc.device, tc.resolved_precision());
  enable_graceful_stop();  // from here on a stop signal is honoured at the next step's end
  // One folder, one run: rank 0 takes the lease on checkpoint.dir before anything is
  // written there (a live holder: exit 2 on every rank, naming it). It lives until train()
  // returns or throws: any end in order releases it; a process killed leaves it to go stale.
  std::unique_ptr<CheckpointLease> lease;
  run_collectively([&] {
    if (!parallel.is_root() || config.checkpoint.dir.empty()) return;
    CheckpointLease::Options o;
    o.lease_s = config.checkpoint.lease_s;
    o.min_lease_s = config.parallel.timeout_s;
    lease = std::make_unique<CheckpointLease>(config.checkpoint.dir, o);
    if (!lease->taken_over().empty())
      std::fprintf(stderr, "trident: warning: taking over checkpoint.dir %s from the run that held it: %s\n",
                   config.checkpoint.dir.c_str(), lease->taken_over().c_str());
    std::printf("checkpoint: lease on %s taken (renewed at step ends, at most every %.1f s; stale after %g s "
                "without renewal%s)\n",
                lease->path().c_str(), lease->renew_every_s(), lease->lease_s(),
                config.checkpoint.lease_s > 0 ? "" : ": auto, parallel.timeout_s or 4 step times when longer");
  });
  // Where a verdict on a failed host goes (health/), checked before anything else is spent.
  run_collectively([&] {
    health::set_checkpoint_dir(config.checkpoint.dir);
    if (parallel.is_root()) health::clear();  // an earlier run's verdict is not this run's
  });

  // Before anything large is allocated: a run that cannot fit ends here, on every rank.
  const RankMemoryPlan memory_plan = check_memory_fits(config, parallel, *k);
  std::unique_ptr<Tokenizer> tokenizer;
  const TrainingData data = load_data(config, parallel, tokenizer);
  run_collectively([&] {
    resolve_eod_token(config.data, *tokenizer);
    document_end(config.data);  // document masking with no token to end a document ends here
  });
  const BatchSampler train_sampler(data.train, config.model.seq_len, tc.seed, kTrainStream);
  TrainResult result;
  result.unigram_entropy = data.unigram_entropy;

  // MFU's peak, measured before the plan's baseline (on the CPU, rank 0 times sgemm on
  // matrices the plan does not count), and what that freed handed back, so that the setup
  // cannot reuse it unseen.
  const DevicePeak peak = device_peak(config, parallel, *k);
  release_freed_memory();

  Timer setup_time;
  // What the plan says is measured from here: the peak's growth (host memory) or the
  // device memory taken.
  reset_peak_resident();
  const MemoryBaseline baseline{resident_bytes(), k->memory_pool().free_bytes};
  TrainingSetup s(config, parallel, *k);
  s.model.init_parameters(tc.seed);
  Checkpointer checkpointer(config, parallel, s.sharded_state());
  checkpointer.set_data(data.fingerprint);
  // The heartbeat of the run before, read before restore: it tells what a failure cost.
  const std::optional<Heartbeat> previous = parallel.is_root() ? read_heartbeat(config.checkpoint.dir) : std::nullopt;
  MemoryTier memory(config, parallel, s.sharded_state(), data.fingerprint);
  Restored restored = restore_from_memory(config, parallel, memory);
  if (restored.dir.empty()) restored = restore(config, parallel, s.model, checkpointer);
  const int start_step = restored.step;
  GoodputLedger goodput(previous, start_step, run_start);
  // Renewed after a start that may have been long (a checkpoint loaded from S3).
  run_collectively([&] {
    if (lease != nullptr && !lease->renew(/*check_now=*/true)) end_on_lost_lease(config, lease.get());
  });
  // Every rank has the same step: the same verdict everywhere, said once. A requeued Slurm
  // job (a signal that came with the last step, a node lost after the final checkpoint)
  // finds its run complete: that ends the job, not as bad input.
  if (!restored.dir.empty() && start_step >= tc.steps) {
    const char* restarts = std::getenv("SLURM_RESTART_COUNT");
    if (restarts != nullptr && std::atoi(restarts) > 0) {
      if (parallel.is_root())
        std::printf("the checkpoint %s is at step %d, train.steps: the run is complete, nothing is left to train\n",
                    restored.dir.c_str(), start_step);
      finish_uploads(config, checkpointer);  // the last one, if it had not reached S3
      return result;
    }
    throw AgreedUsageError("the checkpoint " + restored.dir + " is at step " + std::to_string(start_step) +
                           ", at or past train.steps (" + std::to_string(tc.steps) +
                           "): nothing is left to train; raise --train.steps to go on, or give another "
                           "--checkpoint.dir to start afresh");
  }
  const LearningRateSchedule schedule = schedule_of(tc);
  const CoreSharing cores = core_sharing(parallel);
  if (parallel.is_root()) {
    print_startup(config, parallel, s, *k, peak, memory_plan, setup_time.seconds());
    print_schedule(config, restored);
    if (tc.device == Device::cpu && !cores.advice().empty()) std::printf("%s\n", cores.advice().c_str());
  }

  // Ranks taking turns on the cores have noisy work times: no straggler reports (but for
  // the fault test that slows one rank on purpose).
  const bool stragglers =
      parallel.world().all_reduce(tc.device != Device::cpu || !cores.ranks_take_turns() || injected_faults::slows_a_rank()
                                      ? 1.0
                                      : 0.0,
                                  ReduceOp::max) > 0;
  RunMonitor monitor(config, parallel, s.model.spec().describe());
  HostFaults faults(config, parallel);
  // The replicas: every dp rank holds all parameters under ZeRO 0-2; under ZeRO-3 only
  // hybrid sharding's replicas hold the same pieces.
  const bool whole = s.data_parallel.zero_stage() < 3;
  ReplicaCheck replicas(parallel, s.model.layout(), whole ? &parallel.dp() : s.hybrid.replica, whole,
                        tc.replica_check_steps);
  if (parallel.is_root() && !replicas.describe().empty()) std::printf("%s\n", replicas.describe().c_str());
  std::unique_ptr<StepEnd> end_of_step;  // its log files, opened on rank 0: an error there is every rank's
  run_collectively([&] {
    end_of_step = std::make_unique<StepEnd>(config, parallel, s, checkpointer, data, *tokenizer, peak, result,
                                            start_step, stragglers, monitor, faults, lease.get(), goodput);
  });
  StepEnd& end = *end_of_step;
  if (parallel.is_root()) {
    end.log().set_exporter(monitor.exporter());
    end.log().log_config(config.to_ini());
    if (monitor.exporter() != nullptr) {
      const nlohmann::json earlier =
          nlohmann::json::parse(end.log().earlier_summary(), nullptr, /*allow_exceptions=*/false);
      monitor.exporter()->set_runs(1 + (start_step > 0 && earlier.is_object() ? earlier.value("runs", 1) : 0));
      std::printf("metrics: Prometheus at http://%s:%d/metrics\n", host_name().c_str(), config.log.metrics_port);
    }
    if (end.log().tensorboard() != nullptr) std::printf("TensorBoard: %s\n", end.log().tensorboard()->path().c_str());
  }
  DivergenceGuard guard(tc.max_bad_steps, tc.spike_factor);
  const bool resumed = start_step > 0;
  // Going back to the last complete checkpoint (a divergence, a replica that differs): the
  // step to go on from (the loop's next is the one after it). With nothing to go back to
  // after all (a run resumed on disks that no longer hold it), `failure(why)` is thrown:
  // never a silent restart from step 0 with these parameters.
  int last_step = start_step;  // the last step completed
  const auto go_back = [&](const auto& failure) {
    checkpointer.finish();  // a save in flight counts as one to go back to
    const Restored back = restore(config, parallel, s.model, checkpointer, /*latest_first=*/true);
    if (back.dir.empty()) throw failure("; no checkpoint is left to go back to");
    memory.remove_all();  // snapshots of the path left (a corrupted state among them, maybe)
    goodput.rolled_back(last_step);
    end.rolled_back_to(back.step);
    return back.step - 1;
  };
  std::vector<int32_t> inputs, targets;
  bool stopped = false;
  goodput.first_step();
  for (int step = start_step; step < tc.steps && !stopped; step++) {
    parallel.set_step(step);
    injected_faults::stall(parallel.rank(), step, progress_board::waiting_now);
    if (data.background) injected_faults::copy_data_at(step + 1, [&] { data.background->wait(); });
    monitor.before_step(step);
    const StepOutcome o = run_step(step, config, parallel, s, *k, train_sampler, schedule, inputs, targets);
    const DivergenceGuard::Verdict verdict = guard.observe(step + 1, o.loss, o.norm, resumed || end.saved_any());
    if (verdict == DivergenceGuard::Verdict::diverged) {  // main prints the message
      checkpointer.finish();
      throw DivergedError(guard.message());
    }
    if (parallel.is_root() && !guard.message().empty()) std::printf("%s\n", guard.message().c_str());
    if (verdict == DivergenceGuard::Verdict::roll_back) {
      step = go_back([&](const std::string& why) { return DivergedError(guard.message() + why); });
      continue;
    }
    end.record(step, start_step, o, guard);
    {
      const ShardedParameters params = s.model.store().parameters();  // the first parameter this rank holds
      injected_faults::flip_bit(parallel.rank(), step + 1, params.layout->total_floats(),
                                params.sharded() ? params.held.front().begin : 0,
                                [&](float* flat) { params.to_host(flat); },
                                [&](const float* flat) {
                                  params.from_host(flat);
                                  if (params.changed) params.changed();
                                });
    }
    // Replicas compared at their interval and before every periodic checkpoint: a corrupted
    // state is not saved (a save on a signal is not checked first).
    const bool saving = checkpoint_due(config, step);
    if (replicas.due(step) || (saving && replicas.enabled())) {
      const Timer checking;
      std::vector<float> buffers(s.model.layout().buffer_floats());
      s.model.buffers_to_host(buffers.data());
      const ReplicaComparison c = replicas.compare(s.model.store().parameters(), step + 1, buffers.data());
      result.replica_checks++;
      result.replica_check_s += checking.seconds();
      if (!c.agree) {
        if (parallel.is_root()) std::printf("%s\n", c.report.c_str());
        checkpointer.finish();  // a save in flight counts as one to go back to
        const bool can_go_back = parallel.world().all_reduce(
            parallel.is_root() && has_checkpoint(config.checkpoint.dir) ? 1.0 : 0.0, ReduceOp::max) > 0;
        std::optional<health::Verdict> verdict;
        if (parallel.is_root())
          verdict = faults.replicas().observe(c.odd_ranks, c.tie, c.report, can_go_back, faults.hosts());
        faults.end_run_if(verdict, [] {});
        if (parallel.is_root())
          std::printf("replica check: going back to the last checkpoint (a second difference on the same host ends "
                      "the run, naming it)\n");
        step = go_back([&](const std::string& why) { return AgreedInfrastructureError(c.report + why); });
        continue;
      }
    }
    last_step = step + 1;
    const std::string trace = monitor.after_step(step);
    if (!trace.empty())
      std::printf("trace of steps %s written to %s (open it in Perfetto)\n", config.log.trace_steps.c_str(),
                  trace.c_str());
    stopped = end.checkpoint_or_stop(step, !guard.in_streak());
    goodput.add(GoodputPart::checkpoint, memory.after_step(step));
    if (memory.due(step) && !stopped && !guard.in_streak()) goodput.add(GoodputPart::checkpoint, memory.save(step));
    // After the saves: the next run resumes from a checkpoint at or before this step.
    if (parallel.is_root())
      write_heartbeat(config.checkpoint.dir, {step + 1, unix_seconds(), step + 1 == tc.steps, goodput.parts()});
    if (stopped) break;
    end.validate_if_due(step);
    end.sample_if_due(step);
  }
  checkpointer.finish();
  finish_uploads(config, checkpointer);
  if (last_step == tc.steps) memory.remove_all();  // complete: no restart will need them
  result.peak_gflops = peak.total_gflops;
  const double planned = static_cast<double>(k->host_memory() ? memory_plan.total_bytes() : memory_plan.device_bytes());
  const double taken = static_cast<double>(memory_taken(baseline, *k));
  // The most any rank's step (after the first) waited on its device: the kernels' blocking
  // calls (kernels.h), the same count on the CPU as on a GPU.
  const auto host_syncs_per_step = static_cast<uint64_t>(
      parallel.world().all_reduce(static_cast<double>(result.host_syncs_per_step), ReduceOp::max));
  // What the data made the run hold beyond its plan (Transformer::grown_bytes), here and at most.
  const double grown = static_cast<double>(s.model.grown_bytes());
  const double most_grown = parallel.world().all_reduce(grown, ReduceOp::max);
  // Every rank against its own plan: the one furthest above it (the lowest of a tie) says
  // where, once, when it is more than kMemoryOverPlanWarning above.
  const double share = planned > 0 ? taken / planned : 0.0;
  const double most_share = parallel.world().all_reduce(share, ReduceOp::max);
  const int world = parallel.dims().world();
  const int furthest = world - static_cast<int>(parallel.world().all_reduce(
                                   share == most_share ? static_cast<double>(world - parallel.rank()) : 0.0, ReduceOp::max));
  const int ranks_over = static_cast<int>(
      parallel.world().all_reduce(share > 1 + kMemoryOverPlanWarning ? 1.0 : 0.0, ReduceOp::sum));
  if (parallel.rank() == furthest && !stopped) {
    char rows[200];
    std::snprintf(rows, sizeof rows,
                  "expert rows received beyond model.moe_dropless_headroom = %g balanced shares: raise it, or set "
                  "model.moe_capacity_factor", config.model.moe_dropless_headroom);
    const std::vector<MemoryPart> beyond = {{"activations", rows, static_cast<size_t>(grown)}};
    const std::string where = beyond_plan(memory_plan, static_cast<size_t>(planned), static_cast<size_t>(taken), beyond);
    if (!where.empty())
      std::fprintf(stderr, "warning: memory: %d rank(s) above their plan by more than %.0f%%; rank %d %s\n", ranks_over,
                   100 * kMemoryOverPlanWarning, furthest, where.c_str());
  }
  if (parallel.is_root()) {
    char beyond[200] = "";
    if (most_grown > 0)
      std::snprintf(beyond, sizeof beyond, "; %.1f MiB of it (%.1f MiB on the rank with most) for expert rows received "
                    "beyond the planned headroom (model.moe_dropless_headroom)", grown / (1 << 20), most_grown / (1 << 20));
    if (!stopped)
      std::printf("memory: rank 0 planned %.1f MiB, took %.1f MiB (%s since setup began): %.1f%% of the plan%s; "
                  "rank %d the most: %.1f%% of its plan\n",
                  planned / (1 << 20), taken / (1 << 20), k->host_memory() ? "peak resident growth" : "device memory",
                  planned > 0 ? 100.0 * taken / planned : 0.0, beyond, furthest, 100.0 * most_share);
    nlohmann::json summary = nlohmann::json::parse(run_summary_json(config, parallel, s, result, peak, *k));
    summary["skipped_steps"] = guard.skipped_steps();
    summary["straggler_reports"] = result.straggler_reports;
    summary["replica_checks"] = result.replica_checks;
    summary["replica_check_seconds"] = result.replica_check_s;
    summary["memory_planned_gib"] = gib(planned);
    summary["memory_taken_gib"] = gib(taken);
    summary["memory_most_of_plan"] = most_share;  // the rank furthest above (or least below) its plan: taken / planned
    summary["memory_grown_gib"] = gib(grown);  // of it, beyond the plan: expert rows past the headroom
    summary["host_syncs_per_step"] = host_syncs_per_step;
    summary["steps_run"] = result.steps_run;
    summary["last_step"] = last_step;
    summary["runs"] = 1;
    // What watching cost rank 0: TensorBoard, the exporter, its machine's telemetry.
    summary["monitor_seconds"] = end.log().writer_seconds() + monitor.sample_seconds();
    const GoodputParts g = goodput.parts();  // the job's: every run in this checkpoint folder
    summary["goodput"] = {{"ratio", g.ratio()}, {"wall_seconds", g.total()}};
    for (int i = 0; i < kGoodputParts; i++) summary["goodput"][kGoodputPartNames[i]] = g.seconds[i];
    if (resumed) with_earlier_runs(summary, end.log().earlier_summary());
    end.log().write_summary(summary.dump());
  }
  if (parallel.is_root() && !stopped) {
    std::printf("done: steps %d-%d (%d) in %s, loss %.4f -> %.4f (unigram entropy %.4f), val loss %s, "
                "data wait %.2f%% and dp wait %.1f%% of step time, peak memory %.2f GiB (rank 0)%s%s\n",
                start_step + 1, last_step, result.steps_run, format_duration(result.step_time_s).c_str(),
                result.first_loss, result.last_loss, result.unigram_entropy,
                end.have_val() ? format_loss(result.val_loss).c_str() : "n/a",
                result.step_time_s > 0 ? 100.0 * result.data_wait_s / result.step_time_s : 0.0,
                result.step_time_s > 0 ? 100.0 * result.comm_wait_s / result.step_time_s : 0.0,
                gib(static_cast<double>(peak_resident_bytes())), end.log().path().empty() ? "" : ", metrics in ",
                end.log().path().c_str());
    if (const std::string restart = goodput.restart_line(); !restart.empty()) std::printf("%s\n", restart.c_str());
    std::printf("%s\n", goodput.describe().c_str());
    for (const auto& dataset : data.datasets)  // data.stream's requests (rank 0's)
      if (const std::string t = dataset->traffic(); !t.empty()) std::printf("data: %s (rank 0)\n", t.c_str());
    if (end.saved_any()) {
      const std::string me = this_executable(), dir = config.checkpoint.dir;
      std::printf("next: %s eval --checkpoint.dir=%s\n      %s generate --checkpoint.dir=%s --prompt \"...\"\n"
                  "      or go on: this command with a larger --train.steps\n",
                  me.c_str(), dir.c_str(), me.c_str(), dir.c_str());
    }
  }
  return result;
}

}  // namespace trident
