#include "train/step_runner.h"

#include <cmath>

#include "runtime/error.h"

namespace trident {

StepRunner::StepRunner(GPT2& model, AdamW& optimizer, DataParallel& data_parallel, Communicator& dp,
                       kernels::Kernels& k)
    : model_(model), optimizer_(optimizer), data_parallel_(data_parallel), dp_(dp), k_(k) {}

double StepRunner::compute_gradients(const int32_t* inputs, const int32_t* targets, int local_batch,
                                     int global_batch) {
  const int B = model_.micro_batch(), T = model_.config().seq_len;
  check(local_batch % B == 0, "local batch must be a multiple of the micro-batch");
  const int micro_steps = local_batch / B;
  // Gradients of the mean over the global batch: summed over dp, no division after.
  const float loss_scale = 1.0f / (static_cast<float>(global_batch) * T);
  model_.zero_grad();
  double loss_sum = 0;
  for (int m = 0; m < micro_steps; m++) {
    const size_t first = static_cast<size_t>(m) * B * T;
    loss_sum += static_cast<double>(model_.forward(inputs + first, targets + first, B)) * B * T;
    if (m + 1 < micro_steps) {
      model_.backward(loss_scale);
    } else {  // the last backward completes the gradients: reduce while it runs
      data_parallel_.start_backward(model_.grads());
      model_.backward(loss_scale, [this](size_t offset) { data_parallel_.gradients_final_from(offset); });
    }
  }
  comm_wait_s_ = data_parallel_.finish_gradients();
  return dp_.all_reduce(loss_sum) / (static_cast<double>(global_batch) * T);
}

GradientNorm StepRunner::update(double lr, double grad_clip) {
  GradientNorm norm;
  norm.norm = std::sqrt(data_parallel_.gradient_norm_squared(k_, model_.grads()));
  norm.clip_coefficient = clip_coefficient(norm.norm, grad_clip);
  optimizer_.step(model_.params(), model_.grads(), lr, norm.clip_coefficient);
  data_parallel_.gather_parameters(model_.params());
  return norm;
}

}  // namespace trident
