// Single-rank training throughput beside the machine's sgemm peak, both measured in
// this run: a whole step (forward, backward, clipping, AdamW) on random tokens.
//
//   build/bench/throughput --config configs/gpt2-124m.ini [--steps 3] [--header] [--train.precision=bf16]
//
// Prints one table row: tokens/s, model GFLOP/s (the family's FLOPs per token:
// model/transformer_spec.h), the
// fraction of the sgemm peak, and peak resident memory of this process.
#include <omp.h>

#include <cstdio>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/kernels.h"
#include "model/transformer.h"
#include "model/transformer_spec.h"
#include "optim/gradient_clip.h"
#include "optim/optimizer.h"
#include "kernels/base/memory.h"
#include "runtime/random.h"
#include "runtime/timer.h"

using namespace trident;

int main(int argc, char** argv) {
  keep_freed_memory();
  std::vector<std::string> args;
  int steps = 3;
  bool header = false;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--header") header = true;
    else args.push_back(a);
  }
  CommandLine cl = parse_command_line("train", args);
  Config config = cl.config;
  config.resolve_layout(1);
  const ModelConfig& mc = config.model;
  const int B = config.train.micro_batch, T = mc.seq_len;
  const int accumulation = config.train.accumulation_steps(1);
  // --train.precision=bf16: the CPU's bf16 (GEMMs in bf16 where it has the instructions;
  // DNNL_MAX_CPU_ISA=AVX512_CORE gives the emulated path for comparison). The row names it.
  auto k = kernels::make_cpu_kernels(config.train.resolved_precision());
  const std::string backend = k->precision() == kernels::Precision::fp32 ? "" : " [" + k->name() + "]";

  // The peak first, on a quiet machine: large square sgemm, best of several sizes.
  double peak = 0;
  for (int n : {1024, 2048, 3072}) peak = std::max(peak, k->measure_gemm_gflops(n, 1.0));

  Timer setup;
  Transformer model(mc, *k, {.micro_batch = B});
  model.init_parameters(config.train.seed);
  const auto adamw = make_optimizer("adamw", model.layout(), {0.9, 0.95, 1e-8, 0.1}, *k);
  Optimizer& optimizer = *adamw;
  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) {
    tokens[i] = static_cast<int32_t>(hash_key(1, 1, i) % mc.vocab_size);
    targets[i] = static_cast<int32_t>(hash_key(1, 2, i) % mc.vocab_size);
  }
  const double setup_s = setup.seconds();

  const auto train_step = [&] {
    model.store().zero_grad();
    for (int m = 0; m < accumulation; m++) {
      model.forward(tokens.data(), targets.data(), B);
      model.backward(1.0f / (static_cast<float>(config.train.global_batch) * T));
    }
    const GradientNorm norm = clip_gradients(*k, model.store().grads(), model.layout().total_floats(), 1.0);
    optimizer.step(model.store().params(), model.store().grads(), 1e-4, norm.clip_coefficient);
    model.store().parameters_changed();
  };
  train_step();  // warm-up: first use of every buffer and of oneDNN's JIT kernels
  Timer timer;
  for (int s = 0; s < steps; s++) train_step();
  const double step_s = timer.seconds() / steps;
  const double tokens_per_step = static_cast<double>(config.train.global_batch) * T;
  const double tokens_per_s = tokens_per_step / step_s;
  const double gflops = flops_per_token(model.spec()) * tokens_per_s / 1e9;

  if (header) {
    std::printf("| model | batch x T | threads | step (s) | tokens/s | model GFLOP/s | sgemm peak GFLOP/s | of peak | peak RSS (GiB) | setup (s) |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  }
  std::printf("| %s | %d x %d | %d | %.3f | %.0f | %.1f | %.1f | %.1f%% | %.2f | %.1f |\n",
              (model.spec().describe() + backend).c_str(), config.train.global_batch, T,
              omp_get_max_threads(), step_s, tokens_per_s, gflops, peak, 100.0 * gflops / peak,
              peak_resident_bytes() / double(1 << 30), setup_s);
  return 0;
}
