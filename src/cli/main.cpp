// trident <command> [--config FILE.ini] [--section.key=value ...]
// Every rank runs this. Bad input: one message (from rank 0), exit code 2 on every rank.
#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/ckpt_command.h"
#include "cli/doctor_command.h"
#include "cli/eval_command.h"
#include "cli/generate_command.h"
#include "cli/plan_command.h"
#include "cli/prepare_command.h"
#include "cli/tokenize_command.h"
#include "cli/version.h"
#include "config/config.h"
#include "parallel/agreement.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_state.h"
#include "kernels/kernels.h"
#include "runtime/exit_codes.h"
#include "kernels/base/memory.h"
#include "runtime/stop_signal.h"
#include "model/transformer_spec.h"
#include "train/setup.h"
#include "train/trainer.h"
#include "train/verify.h"

namespace trident {
namespace {

using Args = std::vector<std::string>;

// Set once the ranks start to communicate: a UsageError after it may be one rank's alone.
bool communication_started = false;

// train's and verify's --help: every config key, with its default.
int print_help(const CommandLine& cl, const MpiWorld& world) {
  if (world.is_root()) std::printf("%s", cl.help_text.c_str());
  return 0;
}

int run_train(const Args& args, const MpiWorld& world) {
  const CommandLine cl = parse_command_line("train", args);
  if (cl.help) return print_help(cl, world);
  Config config = cl.config;
  resolve_for_world(config, world.size());
  communication_started = true;
  ParallelState parallel(config.dims(), config.parallel.ranks_per_node, config.parallel.timeout_s,
                         config.train.device);
  if (world.is_root())
    std::printf("trident train, resolved config:\n%s\n%s\n", config.to_ini().c_str(), parallel.describe().c_str());
  train(config, parallel);
  return 0;
}

int run_verify(const Args& args, const MpiWorld& world) {
  const CommandLine cl = parse_command_line("verify", args);
  if (cl.help) return print_help(cl, world);
  Reference ref;
  run_collectively([&] { ref = load_reference(cl.reference); });
  Config config = cl.config;
  config.model = ref.model;  // the reference fixes the model and the batch
  config.train.global_batch = ref.batch;
  resolve_for_world(config, world.size());
  communication_started = true;
  ParallelState parallel(config.dims(), config.parallel.ranks_per_node, config.parallel.timeout_s,
                         config.train.device);
  if (world.is_root()) std::printf("%s\n", parallel.describe().c_str());
  std::unique_ptr<kernels::Kernels> k =
      kernels::make_kernels(config.train.device, config.train.resolved_precision());
  const VerifyReport r = verify_against_reference(ref, config.train.micro_batch, *k, parallel, config.parallel,
                                                   config.train.recompute, config.train.recompute_layers,
                                                   config.train.recompute_method);
  if (!world.is_root()) return r.passed() ? 0 : 1;

  std::string masks;  // what narrows attention beyond causal
  if (ref.eod_token >= 0) masks += ", documents masked (end token " + std::to_string(ref.eod_token) + ")";
  if (ref.model.sliding_window > 0)
    masks += ", sliding window of " + std::to_string(ref.model.sliding_window) + " tokens";
  std::printf("verify %s: %s, batch %d (micro-batch %d per rank), %d %s steps, "
              "%d rank(s), ZeRO-%d, recompute %s, %s on %s%s\n",
              ref.path.c_str(), transformer_spec(ref.model).describe().c_str(), ref.batch, config.train.micro_batch,
              ref.steps, ref.optimizer.c_str(), world.size(),
              config.parallel.zero, config.train.recompute_description().c_str(), kernels::precision_name(k->precision()),
              k->name().c_str(), masks.c_str());
  std::printf("%-44s %14s %14s\n", "tensor", "grad rel err", "final rel err");
  for (const TensorError& e : r.tensors)
    if (e.compared) std::printf("%-44s %14.3e %14.3e\n", e.name.c_str(), e.gradient, e.final_param);
    else std::printf("%-44s %29s\n", e.name.c_str(), "no rank compared it: FAIL");
  const auto line = [](const char* what, double value, double tolerance) {
    std::printf("%-34s %10.3e  (tolerance %.2g) %s\n", what, value, tolerance,
                value <= tolerance ? "ok" : "FAIL");
  };
  std::printf("step-0 loss %.10f, reference %.10f\n", r.loss, r.loss_reference);
  line("loss, step 0", r.loss_error, r.tolerance.loss);
  line("loss, every step (max)", r.max_step_loss_error, r.tolerance.loss);
  if (r.max_aux_loss_error >= 0) line("auxiliary loss, every step (max)", r.max_aux_loss_error, r.tolerance.loss);
  if (r.max_buffer_error >= 0)
    std::printf("%-34s %10.3e  (tolerance %.2g) %s\n", "expert bias, every step (max abs)", r.max_buffer_error,
                VerifyReport::kBufferTolerance,
                r.max_buffer_error <= VerifyReport::kBufferTolerance ? "ok"
                : r.gradients_unheld()                               ? "not held: the routing differs"
                                                                     : "FAIL");
  if (r.tokens_dropped_differing >= 0)
    std::printf("%-34s %10.0f  (%.0f differ from the reference's) %s\n", "tokens dropped, all steps", r.tokens_dropped,
                r.tokens_dropped_differing,
                r.tokens_dropped_differing == 0 ? "ok" : r.gradients_unheld() ? "not held: the routing differs" : "FAIL");
  // Where the routing differs from the reference's, the gradients are shown, not held.
  const auto gradient_line = [&](const char* what, double value, double tolerance) {
    if (!r.gradients_unheld()) return line(what, value, tolerance);
    std::printf("%-34s %10.3e  (tolerance %.2g) not held: the routing differs\n", what, value, tolerance);
  };
  if (r.routing_choices >= 0) {
    if (!r.routing_differs())
      std::printf("%-34s %10.0f  (all as the reference's; its closest margin %.2g) ok\n", "routing choices, all steps",
                  r.routing_choices, r.routing_margin);
    else
      std::printf("%-34s %10.0f  (%.0f differ from the reference's, the closest at a margin of %.2g) %s\n",
                  "routing choices, all steps", r.routing_choices, r.routing_differing, r.routing_differing_margin,
                  r.routing_held() ? "bf16 may flip near ties: gradients, final parameters and drops not held, the "
                                     "losses are"
                                   : "FAIL");
  }
  gradient_line("grad norm, every step (max)", r.max_grad_norm_error, r.tolerance.gradient);
  gradient_line("gradients, per tensor (max)", r.max_gradient_error(), r.tolerance.gradient);
  gradient_line("final parameters, per tensor (max)", r.max_final_param_error(), r.tolerance.param);
  if (r.max_key_bias_param_error() >= 0)
    gradient_line("final key biases, per tensor (max)", r.max_key_bias_param_error(), r.tolerance.key_bias_param);
  if (const std::vector<std::string> lost = r.not_compared(); !lost.empty()) {
    std::string names;
    for (const std::string& name : lost) names += (names.empty() ? "" : ", ") + name;
    std::printf("%-34s %10zu  (%s) FAIL\n", "tensors that no rank compared", lost.size(), names.c_str());
  }
  std::printf("%s\n", r.passed() ? "PASS" : "FAIL");
  return r.passed() ? 0 : 1;
}

// A command that rank 0 runs alone (it reads files and prints; nothing to share): the
// other ranks wait for it, and an error it raises is raised on every rank.
template <int (*run)(const Args&)>
int on_rank_zero(const Args& args, const MpiWorld& world) {
  int code = 0;
  run_collectively([&] {
    if (world.is_root()) code = run(args);
  });
  return code;
}

struct Command {
  const char* name;
  const char* summary;                                  // its line of the usage text
  int (*run)(const Args& args, const MpiWorld& world);  // returns the exit code
};

// In the order the usage text lists them.
constexpr Command kCommands[] = {
    {"train", "train under the config (configs/tiny.ini, configs/gpt2-124m.ini, ...)", run_train},
    {"verify", "--reference F.h5: run a reference's steps, compare loss, gradients, parameters", run_verify},
    {"ckpt", "ls | inspect | export --checkpoint.dir=DIR: list, check, export checkpoints",
     on_rank_zero<run_ckpt_command>},
    {"tokenize", "--data.tokenizer=KIND --data.tokenizer_path=PATH [--decode]: text on stdin -> JSON ids",
     on_rank_zero<run_tokenize_command>},
    {"prepare", "--input PATH... --out PREFIX: tokenize documents into a Megatron indexed dataset",
     [](const Args& args, const MpiWorld&) { return run_prepare_command(args); }},
    {"eval", "--checkpoint.dir=DIR: validation loss and perplexity of its newest checkpoint", run_eval_command},
    {"generate", "--checkpoint.dir=DIR --prompt TEXT: sample a continuation", run_generate_command},
    {"doctor", "[--config F] [--checkpoint.dir=DIR]: preflight of ranks, GPUs, NCCL, EFA, network, disk",
     run_doctor_command},
    {"plan", "--config F --nodes N --gpus_per_node G --gpu h100: layouts that fit a GPU cluster, fastest first",
     on_rank_zero<run_plan_command>},
};

// The command named `name`; null for none.
const Command* find_command(const std::string& name) {
  for (const Command& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

std::string usage() {
  std::string text =
      "usage: trident <command> [--config FILE.ini] [--section.key=value ...]\n"
      "\n"
      "commands:\n";
  for (const Command& c : kCommands) {
    std::string name = c.name;
    name.resize(std::max<size_t>(name.size(), 9), ' ');  // the summaries line up
    text += "  " + name + " " + c.summary + "\n";
  }
  return text +
         "\n"
         "  trident <command> --help   options of a command\n"
         "  trident --version          what this build was made with\n";
}

}  // namespace
}  // namespace trident

int main(int argc, char** argv) {
  using namespace trident;
  start_stop_signal_thread();  // first: every later thread inherits the blocked signals
  keep_freed_memory();
  // A file-size limit (ulimit -f) should fail the write with EFBIG and a clear error,
  // not kill the process in the middle of a checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  // A file whose write failed (disk full) may refuse to close; HDF5's exit handler would
  // then crash trying again, so it is not installed (before HDF5's first use).
  H5dont_atexit();
  MpiWorld world(&argc, &argv);
  const std::vector<std::string> args(argv + 1, argv + argc);
  const std::string name = args.empty() ? "" : args[0];
  const Command* command = find_command(name);
  try {
    if (name == "--version") {
      if (world.is_root()) print_version(world);
      return 0;
    }
    if (name == "--help" || name == "-h" || name == "help") {
      if (world.is_root()) std::printf("%s", usage().c_str());
      return 0;
    }
    require(command != nullptr, name.empty() ? std::string("no command given") : "unknown command '" + name + "'");
    return command->run({args.begin() + 1, args.end()}, world);
  } catch (const DivergedError& e) {
    std::fflush(stdout);  // the error comes after everything printed before it, in a combined log
    // Every rank saw the same loss and norm and stopped at the same step.
    if (world.is_root()) std::fprintf(stderr, "trident: diverged: %s\n", e.what());
    return kExitDiverged;
  } catch (const AgreedUsageError& e) {
    std::fflush(stdout);  // the error comes after everything printed before it, in a combined log
    // Every rank raised it together: rank 0 says it once, all exit 2.
    if (world.is_root()) std::fprintf(stderr, "trident: error: %s\n", e.what());
    return kExitUsage;
  } catch (const UsageError& e) {
    std::fflush(stdout);  // the error comes after everything printed before it, in a combined log
    // Raised before any communication (command line, config, layout), so every rank
    // parsed the same input and reached the same verdict.
    if (!communication_started) {
      if (world.is_root()) {
        std::fprintf(stderr, "trident: error: %s\n", e.what());
        if (command == nullptr) std::fprintf(stderr, "\n%s", usage().c_str());
      }
      return kExitUsage;
    }
    // Seen by this rank alone, mid-run: the others may be waiting for it in a
    // collective, so end the whole job with the same exit code.
    std::fprintf(stderr, "trident: error: rank %d: %s\n", world.rank(), e.what());
    if (world.size() > 1) MPI_Abort(MPI_COMM_WORLD, kExitUsage);
    return kExitUsage;
  } catch (const AgreedInfrastructureError& e) {
    std::fflush(stdout);  // the error comes after everything printed before it, in a combined log
    if (world.is_root()) std::fprintf(stderr, "trident: error (exit 3, a retry may succeed): %s\n", e.what());
    return kExitInfrastructure;
  } catch (const InfrastructureError& e) {
    std::fflush(stdout);  // the error comes after everything printed before it, in a combined log
    std::fprintf(stderr, "trident: rank %d: infrastructure error (exit 3, a retry may succeed): %s\n", world.rank(),
                 e.what());
    MPI_Abort(MPI_COMM_WORLD, kExitInfrastructure);
    return kExitInfrastructure;
  } catch (const std::exception& e) {
    std::fflush(stdout);  // the error comes after everything printed before it, in a combined log
    std::fprintf(stderr, "trident: rank %d: internal error: %s\n", world.rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
