// The pipeline bubble: the time each stage spends idle (waiting for a neighbour's
// activations or gradients) over the step, beside the theoretical (p-1)/(m+p-1), and the
// activation memory each stage holds under 1F1B and GPipe.
//
//   mpirun -np P build/bench/pipeline_bubble [--steps 3] [--section.key=value ...]
//
// Runs m = 1, 2, 4, 8 micro-batches with both schedules on P stages (pp = world).
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
#include "optim/adamw.h"
#include "pipeline/schedule.h"
#include "kernels/base/memory.h"
#include "runtime/random.h"
#include "runtime/timer.h"
#include "train/step_runner.h"

using namespace trident;

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
  const ModelConfig& mc = config.model;
  const int p = world.size(), T = mc.seq_len, B = 1;
  ParallelState parallel(ParallelDims::resolve(p, {{Axis::pp, p}}), 0, 600);
  auto k = kernels::make_cpu_kernels();
  const int stage = parallel.coord(Axis::pp);
  if (world.is_root()) {
    std::printf("| p | m | schedule | step (s) | idle per stage (%%) | measured bubble | theory (p-1)/(m+p-1) | activation MiB per stage |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  }
  for (int m : {1, 2, 4, 8}) {
    for (Schedule schedule : {Schedule::one_f_one_b, Schedule::gpipe}) {
      Transformer model(mc, *k,
                        {.micro_batch = B, .stage = stage_spec(mc.n_layer, stage, p, ""),
                         .slots = max_in_flight(schedule, stage, p, m)});
      model.init_parameters(1);
      DataParallel dp(parallel.dp(), *k, model.layout().total_floats(), 25, false);
      AdamW optimizer(model.layout(), {}, *k, dp.owned());
      StepRunner runner(model, optimizer, dp, parallel.dp(), *k, {&parallel.pp(), parallel.embedding(), schedule});
      std::vector<int32_t> tokens(static_cast<size_t>(m) * B * T), targets(tokens.size());
      for (size_t i = 0; i < tokens.size(); i++) {
        tokens[i] = static_cast<int32_t>(hash_key(1, 1, i) % mc.vocab_size);
        targets[i] = static_cast<int32_t>(hash_key(1, 2, i) % mc.vocab_size);
      }
      runner.compute_gradients(tokens.data(), targets.data(), m * B, m * B);  // warm-up
      // A stage's bubble: the part of the step it does not compute (waiting for its
      // neighbours at the start, between passes, and for the others to drain at the end).
      double idle = 0, total = 0;
      for (int s = 0; s < steps; s++) {
        parallel.world().barrier();
        Timer timer;
        runner.compute_gradients(tokens.data(), targets.data(), m * B, m * B);
        parallel.world().barrier();  // the step ends when the last stage is done
        total += timer.seconds();
        idle += timer.seconds() - runner.compute_s();
      }
      double mine[2] = {idle / total, model.activation_bytes().total() / double(1 << 20)};
      std::vector<double> all(2 * p);
      MPI_Gather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      if (!world.is_root()) continue;
      std::string idle_list, memory_list;
      double mean = 0;
      for (int r = 0; r < p; r++) {
        char item[32];
        std::snprintf(item, sizeof item, "%s%.0f", r ? " / " : "", 100 * all[2 * r]);
        idle_list += item;
        std::snprintf(item, sizeof item, "%s%.1f", r ? " / " : "", all[2 * r + 1]);
        memory_list += item;
        mean += all[2 * r] / p;
      }
      std::printf("| %d | %d | %s | %.3f | %s | %.1f%% | %.1f%% | %s |\n", p, m,
                  schedule == Schedule::gpipe ? "gpipe" : "1f1b", total / steps, idle_list.c_str(), 100 * mean,
                  100.0 * (p - 1) / (m + p - 1), memory_list.c_str());
    }
  }
  return 0;
}
