// `trident verify`: run a reference file's steps (shared/reference/FORMAT.md) and
// compare the loss, every gradient and the final parameters with its float64 values.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/parallel_state.h"
#include "kernels/kernels.h"

namespace trident {

struct Reference {
  std::string path;
  ModelConfig model;
  int batch = 0, steps = 0;
  double lr = 0, beta1 = 0, beta2 = 0, adam_eps = 0, weight_decay = 0, grad_clip = 0;
  std::vector<int32_t> tokens;  // [steps, batch, seq_len + 1]
  int32_t eod_token = -1;       // the root attribute eod_token: attention masked by document; -1: none
  std::string optimizer = "adamw";  // the root attribute optimizer (train.optimizer); absent: AdamW
};

Reference load_reference(const std::string& path);

// Relative errors ||ours - reference|| / ||reference|| (absolute where the reference is 0).
// compared: whether some rank held the tensor and compared it (the errors are -1 if not).
// param_tolerance: the bound of final_param for this tensor (VerifyReport::Tolerances).
struct TensorError {
  std::string name;
  double gradient = 0, final_param = 0;
  bool compared = true;
  double param_tolerance = 0;
};

struct VerifyReport {
  double loss = 0, loss_reference = 0, loss_error = 0;  // step 0
  double max_step_loss_error = 0, max_grad_norm_error = 0;  // over all steps
  // A mixture of experts' auxiliary losses, every step (the reference's steps/aux_loss):
  // -1 when the reference has none.
  double max_aux_loss_error = -1;
  // With a capacity factor, the (token, expert) pairs dropped each step, summed over the
  // steps, and how many of those differ from the reference's steps/tokens_dropped (-1:
  // the reference has none).
  double tokens_dropped = 0, tokens_dropped_differing = -1;
  // The declared buffers after every step against the reference's (steps/expert_bias: the
  // expert bias of loss-free balancing, [steps, layers, E]): the largest absolute
  // difference (-1: the reference has none). They move by +-rate a step: 1e-6 is far below.
  double max_buffer_error = -1;
  static constexpr double kBufferTolerance = 1e-6;
  // A mixture of experts' routing, every step, against the reference's steps/router_chosen:
  // the (token, expert) choices compared (-1: none, the reference has no routing) and
  // those that differ; the reference's smallest margin (a token's K-th score over its next)
  // among the tokens whose choice differs, and among all (+inf: none). Rounding flips a
  // near tie (bf16: margins of 1e-4 do flip), and one flipped choice moves its expert's
  // gradient by 10-25%: with any, the gradients, final parameters and dropped pairs (which
  // follow the routing) are shown, not held.
  double routing_choices = -1, routing_differing = 0;
  double routing_differing_margin = INFINITY, routing_margin = INFINITY;
  bool routing_differs() const { return routing_differing > 0; }
  bool routing_held() const { return !routing_differs() || tolerance.routing_may_differ; }
  // The gradients, final parameters and drops left unheld: a routing that differs, as bf16's may.
  bool gradients_unheld() const { return routing_differs() && tolerance.routing_may_differ; }
  std::vector<TensorError> tensors;
  double max_gradient_error() const;
  double max_final_param_error() const;      // over the tensors held to tolerance.param
  double max_key_bias_param_error() const;   // over those held to tolerance.key_bias_param (-1: none)
  std::vector<std::string> not_compared() const;  // the tensors that no rank compared: a failure

  // Tolerances that a correct float32 implementation meets with margin (FORMAT.md).
  static constexpr double kLossTolerance = 1e-5, kGradientTolerance = 1e-4, kParamTolerance = 1e-3;
  // Under bf16 compute (8 significant bits, relative rounding error up to 2^-8) the loss moves by
  // ~1e-5 and the gradients by ~1e-2 (measured on the CPU's exact bf16 emulation). The final
  // parameters after the references' 3 AdamW steps, the largest of each kind over every
  // reference and bf16 layout of the tests (oneDNN's bf16 GEMMs and the emulation alike):
  // matrices 3.3e-2, embeddings 2.5e-2, routers 2.8e-2, experts 5.2e-2 (fewer tokens
  // each), zero-initialized biases 4.7e-2, norm gains 1.4e-3: 7.5e-2 for all of them,
  // against updates of about 0.3 relative. The key biases are the exception (0.25): softmax
  // ignores a shift of every key, so GPT-2's (c_attn.bias holds them) gets an analytically
  // zero gradient and Qwen2's (k_proj.bias, rotated per position) a nearly zero one, and
  // AdamW moves them by +-lr on rounding noise: 0.18 and 0.11 relative at most.
  static constexpr double kBf16LossTolerance = 5e-3, kBf16GradientTolerance = 5e-2, kBf16ParamTolerance = 7.5e-2,
                          kBf16KeyBiasParamTolerance = 0.25;
  struct Tolerances {
    double loss, gradient, param;
    double key_bias_param;  // the final key biases' (is_key_bias)
    // bf16: a near tie may flip a routing choice (the gradients then shown, not held);
    // fp32: the references' margins (2e-6 at least) are far above its rounding: a choice
    // that differs fails.
    bool routing_may_differ;
  };
  // A tensor that holds a projection's key biases (GPT-2's c_attn.bias, Qwen2's k_proj.bias).
  static bool is_key_bias(const std::string& tensor);
  bool held_to_key_bias_tolerance(const TensorError& t) const;  // a key bias, where its bound differs
  static Tolerances tolerances_for(kernels::Precision precision);
  Tolerances tolerance = tolerances_for(kernels::Precision::fp32);  // of the run's precision
  bool passed() const;
};

// Runs the reference's steps data-parallel over `parallel`'s dp group (each rank takes
// its contiguous slice of the batch) with `micro_batch` sequences per forward/backward
// (0: the rank's whole slice at once), recomputing `recompute` in backward (full:
// `recompute_layers` of each chunk, 0 all, chosen by `method`). Every rank gets the same report.
VerifyReport verify_against_reference(const Reference& ref, int micro_batch, kernels::Kernels& k,
                                      ParallelState& parallel, const ParallelConfig& settings,
                                      Recompute recompute = Recompute::none, int recompute_layers = 0,
                                      RecomputeMethod method = RecomputeMethod::block);

}  // namespace trident
