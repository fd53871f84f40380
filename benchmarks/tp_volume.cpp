// Bytes moved by tensor parallelism in one training step, as counted by the
// communicator layer, beside the theoretical volume, and the step time.
//
//   mpirun -np P build/bench/tp_volume [--config F.ini] [--section.key=value ...]
//
// Theory, per micro-batch of B sequences of T tokens, width d, L blocks: each block
// all-reduces B*T*d floats twice in the forward (after the row-parallel c_proj of
// attention and of the MLP) and twice in the backward (the gradients of the
// column-parallel c_attn and c_fc inputs); the vocabulary-parallel embedding adds one
// all-reduce of B*T*d in the forward and the tied head one in the backward; the loss
// combines per-shard row maxima (B*T) and sums with target logits (2*B*T). Per step,
// the squared gradient norm is one more double.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/data_parallel.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_state.h"
#include "model/transformer.h"
#include "optim/gradient_clip.h"
#include "optim/optimizer.h"
#include "kernels/base/memory.h"
#include "runtime/random.h"
#include "runtime/timer.h"
#include "train/step_runner.h"

using namespace trident;

int main(int argc, char** argv) {
  keep_freed_memory();
  MpiWorld world(&argc, &argv);
  std::vector<std::string> args = {"--model.n_layer=6", "--model.n_head=12", "--model.d_model=384",
                                   "--model.seq_len=256", "--model.vocab_size=50257", "--train.global_batch=4",
                                   "--train.micro_batch=2"};
  args.insert(args.end(), argv + 1, argv + argc);
  Config config = parse_command_line("train", args).config;
  config.parallel.tp = world.size();
  config.resolve_layout(world.size());
  const ModelConfig& mc = config.model;
  ParallelState parallel(config.dims(), 0, 600);
  auto k = kernels::make_cpu_kernels();
  const int B = config.train.micro_batch, T = mc.seq_len, G = config.train.global_batch;
  Transformer model(mc, *k, {.micro_batch = B, .tp = TensorParallel(parallel.tp())});
  model.init_parameters(1);
  DataParallel dp(parallel.dp(), *k, model.layout().total_floats(), 25, false);
  const auto adamw = make_optimizer("adamw", model.layout(), {}, *k, dp.owned());
  Optimizer& optimizer = *adamw;
  StepRunner runner(model, optimizer, dp, parallel.groups(), *k);
  std::vector<int32_t> tokens(static_cast<size_t>(G) * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); i++) {
    tokens[i] = static_cast<int32_t>(hash_key(1, 1, i) % mc.vocab_size);
    targets[i] = static_cast<int32_t>(hash_key(1, 2, i) % mc.vocab_size);
  }
  const auto step = [&] {
    runner.compute_gradients(tokens.data(), targets.data(), G, G);
    runner.update(1e-4, 1.0);
  };
  step();  // warm-up
  parallel.tp().reset_stats();
  Timer timer;
  step();
  const double seconds = timer.seconds();
  const CommStats& s = parallel.tp().stats();
  const uint64_t BT = static_cast<uint64_t>(B) * T, micro_steps = G / B, d = mc.d_model, L = mc.n_layer;
  const uint64_t per_block = 4 * BT * d * 4, embedding_and_head = 2 * BT * d * 4, loss = 3 * BT * 4;
  const uint64_t theory =  // one rank communicates nothing
      world.size() == 1 ? 0 : micro_steps * (L * per_block + embedding_and_head + loss) + sizeof(double);
  const uint64_t measured = s.bytes[static_cast<int>(CommOp::all_reduce)];
  if (parallel.is_root()) {
    if (std::getenv("TP_VOLUME_HEADER") != nullptr && *std::getenv("TP_VOLUME_HEADER") != '\0') {
      std::printf("| tp | model | micro-batches x B x T | all-reduces | measured bytes/step | theory bytes/step | blocks' share | equal | step (s) |\n");
      std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    }
    std::printf("| %d | L%d H%d d%d V%d | %llu x %d x %d | %llu | %llu | %llu | %.1f%% | %s | %.2f |\n", world.size(),
                mc.n_layer, mc.n_head, mc.d_model, mc.vocab_size, static_cast<unsigned long long>(micro_steps), B, T,
                static_cast<unsigned long long>(s.calls[static_cast<int>(CommOp::all_reduce)]),
                static_cast<unsigned long long>(measured), static_cast<unsigned long long>(theory),
                theory > 0 ? 100.0 * micro_steps * L * per_block / theory : 0.0, measured == theory && s.total_bytes() == measured ? "yes" : "NO",
                seconds);
  }
  return measured == theory ? 0 : 1;
}
