#include "train/step_runner.h"

#include <algorithm>
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

double StepRunner::gradient_norm_squared() {
  // Every parameter once: the shards of split tensors on each tp rank, replicated
  // tensors (identical on all tp ranks) from tp rank 0 only; with ZeRO-1 each dp rank
  // holds the reduced gradients of its own ranges.
  TensorParallel& tp = model_.tensor_parallel();
  double sum = 0.0;
  for (const FlatRange& r : data_parallel_.owned())
    for (const ParameterTensor& t : model_.layout().tensors()) {
      const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
      if (begin < end && (t.sharded() || tp.rank() == 0)) sum += k_.sum_squares(model_.grads() + begin, end - begin);
    }
  if (data_parallel_.zero()) sum = dp_.all_reduce(sum);
  if (tp.communicator() != nullptr) sum = tp.communicator()->all_reduce(sum);
  return sum;
}

GradientNorm StepRunner::update(double lr, double grad_clip) {
  GradientNorm norm;
  norm.norm = std::sqrt(gradient_norm_squared());
  norm.clip_coefficient = clip_coefficient(norm.norm, grad_clip);
  optimizer_.step(model_.params(), model_.grads(), lr, norm.clip_coefficient);
  data_parallel_.gather_parameters(model_.params());
  return norm;
}

}  // namespace trident
