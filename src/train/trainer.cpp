#include "train/trainer.h"

#include <omp.h>

#include <cstdio>

#include "data/text_corpus.h"
#include "kernels/kernels.h"
#include "model/gpt2.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "runtime/random.h"
#include "runtime/timer.h"
#include "train/metrics_log.h"

namespace trident {

namespace {

constexpr uint64_t kTrainStream = 1, kValStream = 2;

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

// Mean loss over `batches` fixed validation batches (the same ones at every evaluation).
double validation_loss(GPT2& model, const BatchSampler& sampler, int batches, int batch_size) {
  std::vector<int32_t> inputs, targets;
  double total = 0;
  int count = 0;
  for (int v = 0; v < batches; v++)
    for (int first = 0; first < batch_size; first += model.micro_batch()) {
      const int n = std::min(model.micro_batch(), batch_size - first);
      sampler.fill(v, first, n, inputs, targets);
      total += static_cast<double>(model.forward(inputs.data(), targets.data(), n)) * n;
      count += n;
    }
  return count > 0 ? total / count : 0.0;
}

}  // namespace

TrainResult train(const Config& config, const MpiWorld& world) {
  const ModelConfig& mc = config.model;
  const TrainConfig& tc = config.train;
  require(world.size() == 1,
          "this build trains on one rank; data, tensor and pipeline parallelism come in later releases "
          "(launched with " + std::to_string(world.size()) + " ranks)");
  const bool root = world.is_root();
  std::unique_ptr<kernels::Kernels> k = kernels::make_cpu_kernels();

  // ---- data ----
  const TextCorpus corpus = load_text_corpus(config.data.path, config.data.val_fraction);
  require(mc.vocab_size >= 256, "model.vocab_size must be at least 256 for byte-level tokens");
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
  GPT2 model(mc, tc.micro_batch, *k);
  model.init_parameters(tc.seed);
  AdamW optimizer(model.layout(), {tc.beta1, tc.beta2, tc.adam_eps, tc.weight_decay}, *k);
  const LearningRateSchedule schedule{tc.lr, tc.min_lr, tc.warmup_steps, tc.steps};
  const double peak_gflops =
      config.log.peak_gflops > 0 ? config.log.peak_gflops : k->measure_gemm_gflops(1024, 0.3);
  if (root) {
    const double params = static_cast<double>(model.layout().total_floats()) * sizeof(float);
    std::printf("model: gpt2 L%d H%d d%d T%d V%d (padded %d): %.2fM parameters, %.1f MFLOP/token\n",
                mc.n_layer, mc.n_head, mc.d_model, mc.seq_len, mc.vocab_size, mc.padded_vocab(),
                model.layout().total_floats() / 1e6, mc.flops_per_token() / 1e6);
    std::printf("memory: parameters %.3f GiB, gradients %.3f GiB, optimizer state %.3f GiB, "
                "activations %.3f GiB (micro-batch %d); resident %.3f GiB\n",
                gib(params), gib(params), gib(2 * params),
                gib(static_cast<double>(model.activation_floats()) * sizeof(float)), tc.micro_batch,
                gib(static_cast<double>(resident_bytes())));
    std::printf("device: %s, %d threads, GEMM peak %.1f GFLOP/s (%s); setup %.2f s\n", k->name().c_str(),
                omp_get_max_threads(), peak_gflops, config.log.peak_gflops > 0 ? "from config" : "measured",
                setup.seconds());
  }

  // ---- the loop ----
  MetricsLog log(root ? config.log.run_dir : "");
  const int accumulation = tc.accumulation_steps(config.parallel.dp);
  const int T = mc.seq_len;
  const double tokens_per_step = static_cast<double>(tc.global_batch) * T;
  std::vector<int32_t> inputs, targets;
  double elapsed = 0, time_per_step = 0;
  for (int step = 0; step < tc.steps; step++) {
    Timer timer;
    model.zero_grad();
    double loss = 0;
    for (int m = 0; m < accumulation; m++) {
      train_sampler.fill(step, m * tc.micro_batch, tc.micro_batch, inputs, targets);
      loss += model.forward(inputs.data(), targets.data(), tc.micro_batch) / accumulation;
      model.backward(static_cast<float>(1.0 / tokens_per_step));
    }
    const GradientNorm norm = clip_gradients(*k, model.grads(), model.layout().total_floats(), tc.grad_clip);
    const double lr = schedule.at(step);
    optimizer.step(model.params(), model.grads(), lr, norm.clip_coefficient);
    const double dt = timer.seconds();
    // The first steps warm caches; the ETA averages the later ones.
    elapsed += dt;
    time_per_step = step == 0 ? dt : 0.9 * time_per_step + 0.1 * dt;
    if (step == 0) result.first_loss = loss;
    result.last_loss = loss;
    result.tokens_per_s = tokens_per_step / dt;
    result.mfu = mc.flops_per_token() * tokens_per_step / dt / (peak_gflops * 1e9);
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
      m.memory_gib = gib(static_cast<double>(resident_bytes()));
      m.eta_s = time_per_step * (tc.steps - step - 1);
      log.log_step(m);
    }
    const bool validate = config.log.val_every_steps > 0 && (step + 1) % config.log.val_every_steps == 0;
    if (have_val && (validate || last)) {
      const BatchSampler val_sampler(corpus.val, T, tc.seed, kValStream);
      result.val_loss = validation_loss(model, val_sampler, config.log.val_batches, tc.global_batch);
      if (root) log.log_validation(step + 1, result.val_loss);
    }
  }
  if (root)
    std::printf("done: %d steps in %s, loss %.4f -> %.4f (unigram entropy %.4f), val loss %.4f, peak memory %.2f GiB%s%s\n",
                tc.steps, format_duration(elapsed).c_str(), result.first_loss, result.last_loss,
                result.unigram_entropy, result.val_loss, gib(static_cast<double>(peak_resident_bytes())),
                log.path().empty() ? "" : ", metrics in ", log.path().c_str());
  return result;
}

}  // namespace trident
