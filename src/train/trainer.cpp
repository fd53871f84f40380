#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "ckpt/checkpoint.h"
#include "data/text_corpus.h"
#include "parallel/agreement.h"
#include "parallel/data_parallel.h"
#include "kernels/kernels.h"
#include "model/gpt2.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "runtime/stop_signal.h"
#include "runtime/timer.h"
#include "train/metrics_log.h"
#include "train/pipeline_plan.h"
#include "train/step_runner.h"

namespace trident {

namespace {

constexpr uint64_t kTrainStream = 1, kValStream = 2;

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

std::string format_loss(double loss) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", loss);
  return text;
}

// Mean loss over `batches` fixed validation batches (the same ones at every
// evaluation), each dp rank taking its slice of every batch.
double validation_loss(StepRunner& runner, const BatchSampler& sampler, int batches, int global_batch,
                       ParallelState& parallel) {
  const int local = global_batch / parallel.dims().dp;
  std::vector<int32_t> inputs, targets;
  double total = 0;
  for (int v = 0; v < batches; v++) {
    sampler.fill(v, parallel.coords().dp * local, local, inputs, targets);
    total += runner.evaluate(inputs.data(), targets.data(), local, global_batch);
  }
  return total / batches;
}

// SIGTERM and SIGUSR1 (what Slurm sends before a time limit or a preemption) ask every
// rank to finish its step, save a checkpoint and exit 0: a signal on any rank counts.
bool stop_requested(ParallelState& parallel) {
  return parallel.world().all_reduce(stop_signal_received() ? 1.0 : 0.0, ReduceOp::max) > 0;
}

// Where training starts: a checkpoint (checkpoint.load, else the latest under
// checkpoint.dir, if any), or exported parameters (checkpoint.init_from), or step 0.
int restore(const Config& config, ParallelState& parallel, GPT2& model, Checkpointer& checkpointer) {
  const CheckpointConfig& cc = config.checkpoint;
  std::string chosen;
  run_collectively([&] {
    if (!parallel.is_root()) return;
    if (!cc.load.empty()) chosen = read_manifest(cc.load).dir;
    else if (!cc.dir.empty())
      if (auto latest = find_latest_checkpoint(cc.dir)) chosen = latest->dir;
  });
  chosen = broadcast_string(chosen);
  if (!chosen.empty()) {
    int step = 0;
    Timer loading;
    double bytes = 0;
    run_collectively([&] {
      const Manifest m = read_manifest(chosen, /*verify_files=*/false);
      for (const ManifestFile& f : m.files) bytes += static_cast<double>(f.bytes);
      step = checkpointer.load(m);
    });
    parallel.world().barrier();
    if (parallel.is_root())
      std::printf("resumed from %s: continuing after step %d (%.3f GB of node files loaded in %.2f s)\n", chosen.c_str(),
                  step, bytes / 1e9, loading.seconds());
    return step;
  }
  if (!cc.init_from.empty()) {
    run_collectively([&] { init_parameters_from(model, cc.init_from); });
    if (parallel.is_root()) std::printf("parameters initialized from %s\n", cc.init_from.c_str());
  }
  return 0;
}

// Fault injection for the timeout test: TRIDENT_TEST_STALL_RANK=r makes rank r stop
// participating at step TRIDENT_TEST_STALL_STEP (default 1), as a dead node would.
void maybe_stall(int rank, int step) {
  const char* stall_rank = std::getenv("TRIDENT_TEST_STALL_RANK");
  if (stall_rank == nullptr || std::atoi(stall_rank) != rank) return;
  const char* stall_step = std::getenv("TRIDENT_TEST_STALL_STEP");
  if (step != (stall_step != nullptr ? std::atoi(stall_step) : 1)) return;
  std::fprintf(stderr, "trident: rank %d: TRIDENT_TEST_STALL_RANK set: stalling at step %d\n", rank, step);
  while (true) pause();
}

}  // namespace

TrainResult train(const Config& config, ParallelState& parallel) {
  const ModelConfig& mc = config.model;
  const TrainConfig& tc = config.train;
  const bool root = parallel.is_root();
  const int dp = parallel.dims().dp, dp_rank = parallel.coords().dp;
  const int local_batch = tc.global_batch / dp;
  std::unique_ptr<kernels::Kernels> k =
      kernels::make_kernels(tc.device, kernels::parse_precision(tc.resolved_precision()));
  enable_graceful_stop();  // from here on a stop signal is honoured at the next step's end

  // ---- data: every rank reads the text and takes its slice of each global batch ----
  TextCorpus corpus;
  run_collectively([&] {
    corpus = load_text_corpus(config.data.path, config.data.val_fraction);
    require(mc.vocab_size >= 256, "model.vocab_size must be at least 256 for byte-level tokens");
    BatchSampler check_enough_text(corpus.train, mc.seq_len, tc.seed, kTrainStream);
  });
  const BatchSampler train_sampler(corpus.train, mc.seq_len, tc.seed, kTrainStream);
  const bool have_val = corpus.val.size() > static_cast<size_t>(mc.seq_len) + 1 && config.log.val_batches > 0;
  TrainResult result;
  result.unigram_entropy = corpus.unigram_entropy();
  if (root)
    std::printf("data: %s: %zu files, %zu documents, %zu train / %zu val tokens (bytes); unigram entropy %.4f nats\n",
                config.data.path.c_str(), corpus.files, corpus.documents, corpus.train.size(),
                corpus.val.size(), result.unigram_entropy);

  // ---- model and optimizer, every buffer allocated here, once ----
  Timer setup;
  const PipelinePlan plan = plan_pipeline(config, parallel, local_batch, tc.micro_batch);
  GPT2 model(mc, tc.micro_batch, *k, TensorParallel(parallel.tp()), dp, plan.stage, plan.slots);
  model.init_parameters(tc.seed);
  DataParallel data_parallel(parallel.dp(), *k, model.layout().total_floats(), config.parallel.bucket_mb,
                             config.parallel.zero == 1, config.parallel.overlap);
  AdamW optimizer(model.layout(), {tc.beta1, tc.beta2, tc.adam_eps, tc.weight_decay}, *k, data_parallel.owned());
  StepRunner runner(model, optimizer, data_parallel, parallel.dp(), *k, plan.links);
  const CheckpointConfig& cc = config.checkpoint;
  Checkpointer checkpointer(config, parallel, model, optimizer, data_parallel);
  const int start_step = restore(config, parallel, model, checkpointer);
  const LearningRateSchedule schedule{tc.lr, tc.min_lr, tc.warmup_steps, tc.steps};
  double peak_gflops = config.log.peak_gflops;
  if (peak_gflops == 0) {
    // Measured on rank 0 with the others idle at the broadcast, so ranks sharing the
    // machine do not slow each other down.
    // A GPU needs large matrices to reach its peak; a CPU core is there at 1024.
    if (root) peak_gflops = k->measure_gemm_gflops(tc.device == "cuda" ? 8192 : 1024, tc.device == "cuda" ? 1.0 : 0.3);
    peak_gflops = parallel.world().all_reduce(peak_gflops, ReduceOp::max);
  }
  if (root) {
    const double floats = static_cast<double>(model.layout().total_floats());
    std::printf("model: gpt2 L%d H%d d%d T%d V%d (padded %d): %.2fM parameters on this rank (1/%d of the split "
                "tensors), %.1f MFLOP/token\n",
                mc.n_layer, mc.n_head, mc.d_model, mc.seq_len, mc.vocab_size, mc.padded_vocab(parallel.dims().tp),
                floats / 1e6, parallel.dims().tp, mc.flops_per_token() / 1e6);
    char compute_copy[64] = "";  // none under fp32: the layers read the parameters
    if (model.compute_weight_bytes() > 0)
      std::snprintf(compute_copy, sizeof compute_copy, " + %.3f GiB bf16 compute copy",
                    gib(static_cast<double>(model.compute_weight_bytes())));
    std::printf("memory per rank: parameters %.3f GiB (fp32)%s, gradients %.3f GiB, "
                "optimizer state %.3f GiB%s, activations %.3f GiB (micro-batch %d); resident %.3f GiB\n",
                gib(floats * 4), compute_copy, gib(floats * 4),
                gib(static_cast<double>(optimizer.state_floats()) * 4), data_parallel.zero() ? " (ZeRO-1: 1/dp)" : "",
                gib(static_cast<double>(model.activation_bytes())), tc.micro_batch,
                gib(static_cast<double>(resident_bytes())));
    std::printf("batch: %d sequences per step = %d dp x %d micro-batches x %d; %zu gradient buckets of <= %.0f MiB%s\n",
                tc.global_batch, dp, local_batch / tc.micro_batch, tc.micro_batch, data_parallel.buckets().size(),
                config.parallel.bucket_mb, config.parallel.overlap ? ", reduced during backward" : "");
    if (parallel.dims().pp > 1)
      std::printf("pipeline: %d stages, layers %s, schedule %s; stage 0 holds layers %d..%d and %d activation sets\n",
                  parallel.dims().pp, config.parallel.pp_layers.empty() ? "balanced" : config.parallel.pp_layers.c_str(),
                  config.parallel.schedule.c_str(), plan.stage.first_layer, plan.stage.first_layer + plan.stage.layers - 1,
                  plan.slots);
    std::printf("device: %s, %s, %d threads per rank, GEMM peak %.1f GFLOP/s per rank (%s); setup %.2f s\n",
                k->name().c_str(), kernels::precision_name(k->precision()), omp_get_max_threads(), peak_gflops,
                config.log.peak_gflops > 0 ? "from config" : "measured", setup.seconds());
  }

  // ---- the loop ----
  MetricsLog log(root ? config.log.run_dir : "");
  const int T = mc.seq_len;
  const double tokens_per_step = static_cast<double>(tc.global_batch) * T;
  const double peak_total = peak_gflops * parallel.dims().world();
  std::vector<int32_t> inputs, targets;
  double time_per_step = 0;
  for (int step = start_step; step < tc.steps; step++) {
    parallel.set_step(step);
    maybe_stall(parallel.rank(), step);
    Timer timer;
    train_sampler.fill(step, dp_rank * local_batch, local_batch, inputs, targets);
    const double loss = runner.compute_gradients(inputs.data(), targets.data(), local_batch, tc.global_batch);
    const double lr = schedule.at(step);
    const GradientNorm norm = runner.update(lr, tc.grad_clip);
    const double dt = timer.seconds();
    result.step_time_s += dt;
    result.comm_wait_s += runner.comm_wait_s();
    time_per_step = step == start_step ? dt : 0.9 * time_per_step + 0.1 * dt;
    if (step == start_step) result.first_loss = loss;
    result.last_loss = loss;
    result.tokens_per_s = tokens_per_step / dt;
    result.mfu = mc.flops_per_token() * tokens_per_step / dt / (peak_total * 1e9);
    const bool last = step + 1 == tc.steps;
    if (root && ((step + 1) % config.log.every_steps == 0 || step == 0 || last)) {
      StepMetrics m;
      m.step = step + 1;
      m.total_steps = tc.steps;
      m.loss = loss;
      m.lr = lr;
      m.grad_norm = norm.norm;
      m.tokens_per_s = result.tokens_per_s;
      m.mfu = result.mfu;
      m.step_time_s = dt;
      m.comm_wait_s = runner.comm_wait_s();
      m.memory_gib = gib(static_cast<double>(resident_bytes()));
      m.eta_s = time_per_step * (tc.steps - step - 1);
      log.log_step(m);
    }
    checkpointer.poll();
    const bool stop = stop_requested(parallel);
    if (!cc.dir.empty() && ((cc.every_steps > 0 && ((step + 1) % cc.every_steps == 0 || last)) || stop)) {
      checkpointer.save(step + 1);
      if (root && cc.async) std::printf("checkpoint: step %d: training stalled %.3f s for the save\n", step + 1, checkpointer.last_stall_s());
    }
    if (stop) {
      checkpointer.finish();
      if (root)
        std::printf("stopping after step %d on a signal%s\n", step + 1,
                    cc.dir.empty() ? " (no checkpoint.dir: nothing saved)" : ", checkpoint saved");
      return result;
    }
    const bool validate = config.log.val_every_steps > 0 && (step + 1) % config.log.val_every_steps == 0;
    if (have_val && (validate || last)) {
      const BatchSampler val_sampler(corpus.val, T, tc.seed, kValStream);
      result.val_loss = validation_loss(runner, val_sampler, config.log.val_batches, tc.global_batch, parallel);
      if (root) log.log_validation(step + 1, result.val_loss);
    }
  }
  checkpointer.finish();
  if (root)
    std::printf("done: %d steps in %s, loss %.4f -> %.4f (unigram entropy %.4f), val loss %s, "
                "dp wait %.1f%% of step time, peak memory %.2f GiB (rank 0)%s%s\n",
                tc.steps, format_duration(result.step_time_s).c_str(), result.first_loss, result.last_loss,
                result.unigram_entropy, have_val ? format_loss(result.val_loss).c_str() : "n/a",
                result.step_time_s > 0 ? 100.0 * result.comm_wait_s / result.step_time_s : 0.0,
                gib(static_cast<double>(peak_resident_bytes())), log.path().empty() ? "" : ", metrics in ",
                log.path().c_str());
  return result;
}

}  // namespace trident
