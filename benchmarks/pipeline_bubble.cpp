// The pipeline bubble: the time stage 0 spends idle (waiting for a neighbour's
// activations or gradients) over the step, beside each schedule's theory, and the
// activation memory each stage holds: 1F1B, GPipe, interleaved (V = 2) and ZB-H1.
//
//   mpirun -np P build/bench/pipeline_bubble [--steps 3] [--section.key=value ...]
//
// Runs m = 4, 8, 16 micro-batches on P stages (pp = world). The theory is the schedule
// played out (pipeline/schedule_timing.h) with the pass times measured in this run (the
// forward, input-gradient and weight-gradient passes of zb1's split backward, per
// micro-batch and stage): 1F1B's (p-1)(F+B+W), interleaved's (p-1)(F+B+W)/V, ZB-H1's
// (p-1)(F+B-W) (W <= F) of bubble on each stage.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/data_parallel.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_state.h"
#include "model/transformer.h"
#include "optim/gradient_clip.h"
#include "optim/optimizer.h"
#include "pipeline/schedule.h"
#include "pipeline/schedule_timing.h"
#include "kernels/base/memory.h"
#include "runtime/random.h"
#include "runtime/timer.h"
#include "train/step_runner.h"

using namespace trident;

namespace {

struct Run {
  double step_s = 0, stage0_idle = 0, activation_mib = 0;
  PassTimes per_micro_batch;  // mean over stages
};

Run run(const Config& config, ParallelState& parallel, kernels::Kernels& k, Schedule schedule, int chunks, int m,
        int steps) {
  const ModelConfig& mc = config.model;
  const int p = parallel.size(Axis::pp), stage = parallel.coord(Axis::pp), T = mc.seq_len, B = 1;
  Transformer model(mc, k,
                    {.micro_batch = B, .stage = stage_spec(mc.n_layer, stage, p, "", chunks),
                     .slots = max_in_flight(schedule, stage, p, m, chunks),
                     .chunk_slots = activation_slots(schedule, stage, p, m, chunks).chunk_slots,
                     .split_backward = schedule == Schedule::zb1});
  model.init_parameters(1);
  DataParallel dp(parallel.dp(), k, model.layout().total_floats(), 25, false);
  const auto adamw = make_optimizer("adamw", model.layout(), {}, k, dp.owned());
  Optimizer& optimizer = *adamw;
  StepRunner runner(model, optimizer, dp, parallel.groups(), k, {&parallel.pp(), schedule});
  std::vector<int32_t> tokens(static_cast<size_t>(m) * B * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) {
    tokens[i] = static_cast<int32_t>(hash_key(1, 1, i) % mc.vocab_size);
    targets[i] = static_cast<int32_t>(hash_key(1, 2, i) % mc.vocab_size);
  }
  runner.compute_gradients(tokens.data(), targets.data(), m * B, m * B);  // warm-up
  // A stage's bubble: the part of the step it does not compute (waiting for its
  // neighbours at the start, between passes, and for the others to drain at the end).
  double idle = 0, total = 0;
  PassTimes passes;
  for (int s = 0; s < steps; s++) {
    parallel.world().barrier();
    Timer timer;
    runner.compute_gradients(tokens.data(), targets.data(), m * B, m * B);
    parallel.world().barrier();  // the step ends when the last stage is done
    total += timer.seconds();
    idle += timer.seconds() - runner.compute_s();
    passes.forward += runner.pass_s().forward;
    passes.input_gradient += runner.pass_s().input_gradient;
    passes.weight_gradient += runner.pass_s().weight_gradient;
  }
  Run r;
  r.step_s = total / steps;
  double mine[4] = {idle / total, passes.forward, passes.input_gradient, passes.weight_gradient};
  double stage0[4] = {mine[0], 0, 0, 0}, sums[4] = {};
  MPI_Bcast(stage0, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Allreduce(mine, sums, 4, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  r.stage0_idle = stage0[0];
  r.per_micro_batch = {sums[1] / (p * steps * m), sums[2] / (p * steps * m), sums[3] / (p * steps * m)};
  r.activation_mib = model.activation_bytes().total() / double(1 << 20);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  MpiWorld world(&argc, &argv);
  int steps = 3;
  // Equal work per stage: 8 layers, a small vocabulary so the head costs little.
  std::vector<std::string> args = {"--model.n_layer=8", "--model.n_head=4", "--model.d_model=256",
                                   "--model.seq_len=128", "--model.vocab_size=256"};
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::stoi(argv[++i]);
    else args.push_back(argv[i]);
  }
  Config config = parse_command_line("train", args).config;
  const int p = world.size();
  ParallelState parallel(ParallelDims::resolve(p, {{Axis::pp, p}}), 0, 600);
  auto k = kernels::make_cpu_kernels();
  if (world.is_root()) {
    std::printf("| p | m | schedule | step (s) | stage 0 idle | theory | measured / theory | activation MiB, stage 0 |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  }
  struct Case {
    Schedule schedule;
    int chunks;
    const char* name;
  };
  for (int m : {4, 8, 16}) {
    // zb1 first: its split backward gives F, B and W for every schedule's theory.
    PassTimes measured;
    for (const Case& c : {Case{Schedule::zb1, 1, "zb1"}, Case{Schedule::one_f_one_b, 1, "1f1b"},
                          Case{Schedule::gpipe, 1, "gpipe"}, Case{Schedule::interleaved, 2, "interleaved, V 2"}}) {
      const Run r = run(config, parallel, *k, c.schedule, c.chunks, m, steps);
      if (c.schedule == Schedule::zb1) measured = r.per_micro_batch;
      const ScheduleTiming t = play_schedule(c.schedule, p, m, c.chunks, measured);
      const double theory = t.bubble(0) / t.step;
      if (world.is_root())
        std::printf("| %d | %d | %s | %.3f | %.1f%% | %.1f%% | %.2f | %.1f |\n", p, m, c.name, r.step_s,
                    100 * r.stage0_idle, 100 * theory, r.stage0_idle / theory, r.activation_mib);
    }
    if (world.is_root())
      std::printf("|  |  | (F, B, W per micro-batch: %.1f, %.1f, %.1f ms) |  |  |  |  |  |\n", 1e3 * measured.forward,
                  1e3 * measured.input_gradient, 1e3 * measured.weight_gradient);
  }
  return 0;
}
