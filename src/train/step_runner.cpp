#include "train/step_runner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "monitor/step_trace.h"
#include "kernels/base/error.h"

namespace trident {

StepRunner::StepRunner(Transformer& model, Optimizer& optimizer, DataParallel& data_parallel, MeshGroups mesh,
                       kernels::Kernels& k, PipelineLinks pipeline, AxisSet zero_axes)
    : model_(model), optimizer_(optimizer), data_parallel_(data_parallel), mesh_(std::move(mesh)),
      dp_(mesh_.group(kDataParallel)), zero_axes_(zero_axes), k_(k), pipeline_(model, pipeline) {
  for (const ParameterTensor& t : model.layout().tensors()) {
    const AxisSet axes = norm_axes(t.placement);
    auto at = std::lower_bound(norm_sets_.begin(), norm_sets_.end(), axes);
    if (at == norm_sets_.end() || *at != axes) norm_sets_.insert(at, axes);
  }
  for (const ParameterTensor& t : model.layout().tensors()) {
    norm_set_of_.push_back(static_cast<int>(std::lower_bound(norm_sets_.begin(), norm_sets_.end(), norm_axes(t.placement)) -
                                            norm_sets_.begin()));
    ends_sum_.push_back(group_of(t.placement.model_sums() & kBeforeDataParallel));
    tp_sum_.push_back(group_of(t.placement.model_sums() - kBeforeDataParallel));
  }
  norm_total_ = kernels::DeviceBuffer(k, std::max<size_t>(1, norm_sets_.size()) * 2);  // a double per set
}

Communicator* StepRunner::group_of(AxisSet axes) {
  const AxisSet ranks = mesh_.dims.normalized(axes);
  return ranks.empty() ? nullptr : &mesh_.group(ranks);
}

AxisSet StepRunner::norm_axes(const Placement& p) const {
  AxisSet axes = kModelAxes | p.sharded_over;
  if (data_parallel_.shards_optimizer_state()) axes = axes | (p.data_axes() == kDataParallel ? zero_axes_ : p.data_axes());
  return axes;
}

double StepRunner::compute_gradients(const int32_t* inputs, const int32_t* targets, int local_batch,
                                     int global_batch) {
  routers_.start(model_);
  const int B = model_.micro_batch(), T = model_.spec().seq_len;
  check(local_batch % B == 0, "local batch must be a multiple of the micro-batch");
  const int micro_batches = local_batch / B;
  // Gradients of the mean over the global batch: summed over dp, no division after.
  const float loss_scale = 1.0f / (static_cast<float>(global_batch) * T);
  model_.store().zero_grad();
  model_.discard_loss_sum();
  data_parallel_.start_backward(model_.store().grads());
  // Per chunk, the passes that added weight gradients (under zb1 the weight halves): the
  // chunk's last one completes its gradients. Chunks finish from the last to the first,
  // so the offsets reported final only go down.
  std::vector<int> weight_passes(model_.chunks(), 0);
  pipeline_.run_schedule(inputs, targets, micro_batches, [&](int chunk, int slot, BackwardPart part) {
    if (data_parallel_.reduces_every_micro_batch()) {  // ZeRO-2/3: each windowed unit, every micro-batch
      model_.chunk_backward(
          chunk, slot, loss_scale, part, [this](size_t offset) { data_parallel_.gradients_final_from(offset); },
          [this](size_t offset) { data_parallel_.unit_begins(offset); });
    } else if (!model_.adds_weight_gradients(part) || ++weight_passes[chunk] < micro_batches) {
      model_.chunk_backward(chunk, slot, loss_scale, part);
    } else {  // the chunk's last weight gradients: reduce while they are computed
      // Everything but offset 0 (which holds the tied wte): that waits for the
      // embedding sum below.
      model_.chunk_backward(chunk, slot, loss_scale, part, [this](size_t offset) {
        if (offset > 0) data_parallel_.gradients_final_from(offset);
      });
    }
  });
  compute_s_ = pipeline_.compute_s();
  sum_over_stages();
  data_parallel_.gradients_final_from(0);
  comm_wait_s_ = data_parallel_.finish_gradients();
  sum_over_tensor_parallel();
  // The step's one read of the losses (the last stage has them; a host synchronization),
  // with the routers' figures (every stage's blocks'): one reduction for all.
  std::vector<double> sums = {model_.take_loss_sum()};
  routers_.append_to(model_, sums);
  if (pipeline_.pp() != nullptr) pipeline_.pp()->all_reduce(std::span<double>(sums));
  dp_.all_reduce(std::span<double>(sums));
  routers_.read(model_, sums, 1, global_batch);
  return sums[0] / (static_cast<double>(global_batch) * T);
}

double StepRunner::forward_loss(const int32_t* inputs, const int32_t* targets, int B) {
  model_.discard_loss_sum();
  pipeline_.forward_only(inputs, targets, B);
  return model_.take_loss_sum() / (static_cast<double>(B) * model_.spec().seq_len);
}

double StepRunner::evaluate(const int32_t* inputs, const int32_t* targets, int local_batch, int global_batch) {
  const int B = model_.micro_batch(), T = model_.spec().seq_len;
  model_.discard_loss_sum();
  for (int mb = 0; mb * B < local_batch; mb++) {
    const size_t first = static_cast<size_t>(mb) * B * T;
    pipeline_.forward_only(inputs + first, targets + first, B);
  }
  double loss_sum = model_.take_loss_sum();
  if (pipeline_.pp() != nullptr) loss_sum = pipeline_.pp()->all_reduce(loss_sum);
  return dp_.all_reduce(loss_sum) / (static_cast<double>(global_batch) * T);
}

std::vector<float> StepRunner::next_token_logits(const int32_t* tokens, int position) {
  pipeline_.forward_only(tokens, tokens, 1);  // targets unused: the loss is not asked for
  std::vector<float> logits(model_.spec().vocab_size, 0.0f);
  if (model_.last_stage()) logits = model_.logits(0, 0, position);
  // The last stage has them; the others hold zeros.
  if (pipeline_.pp() != nullptr) pipeline_.pp()->all_reduce(std::span<float>(logits));
  // Every dp rank samples from dp rank 0's logits, so that all take the same token and run
  // the same number of forwards (under ZeRO-3 each forward is collective over dp).
  if (dp_.size() > 1) dp_.broadcast(std::span<float>(logits), 0);
  return logits;
}

// A tied embedding lives on the first stage (embedding) and the last (head); each holds
// part of its gradient. Summed between the two, as Megatron's embedding group does,
// both copies take the same update and stay identical.
void StepRunner::sum_over_stages() {
  const std::vector<ParameterTensor>& tensors = model_.layout().tensors();
  for (size_t i = 0; i < tensors.size(); i++) {
    Communicator* ends = ends_sum_[i];
    if (ends == nullptr) continue;
    float* grad = model_.store().grad(static_cast<int>(i));
    for (size_t at = 0; at < tensors[i].stored; at += kReductionPieceFloats)
      ends->all_reduce(std::span<float>(grad + at, std::min(kReductionPieceFloats, tensors[i].stored - at)));
  }
}

// After the data-parallel reduction (sums commute), on the ranges whose reduced
// gradients this rank holds (the same ranges on every rank of a tp group): the shared
// key/value heads' parts, per-head weights, and under sequence parallelism the norms'.
void StepRunner::sum_over_tensor_parallel() {
  std::vector<RequestPtr> sums;
  const std::vector<ParameterTensor>& tensors = model_.layout().tensors();
  for (const FlatRange& r : data_parallel_.owned())
    for (size_t i = 0; i < tensors.size(); i++) {
      const ParameterTensor& t = tensors[i];
      const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
      Communicator* group = tp_sum_[i];
      if (begin < end && group != nullptr)
        sums.push_back(group->all_reduce_async(std::span<float>(data_parallel_.gradient_at(begin), end - begin), ReduceOp::sum));
    }
  for (RequestPtr& s : sums) finish(s);
}

double StepRunner::gradient_norm_squared() {
  // Every parameter once: each piece from the first rank of its replicated set over tp and
  // pp (Placement::counted); with ZeRO each rank holds the reduced gradients of its own
  // ranges. One sum per set of axes (norm_axes), on the device, in order, read once (one
  // host synchronization); each set's sum reduced over its axes beyond the ones every set
  // shares, then the total over those: dp x cp's (ZeRO), tp, pp, one after the other.
  const ParameterLayout& layout = model_.layout();
  double* total = reinterpret_cast<double*>(norm_total_.data());
  k_.fill_zero(total, norm_sets_.size() * sizeof(double));
  for (const FlatRange& r : data_parallel_.owned())
    for (size_t i = 0; i < layout.tensors().size(); i++) {
      const ParameterTensor& t = layout.tensors()[i];
      const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
      if (begin < end && t.placement.counted)
        k_.accumulate_sum_squares(total + norm_set_of_[i], data_parallel_.gradient_at(begin), end - begin);
    }
  std::vector<double> sums(norm_sets_.size());
  k_.copy_to_host(sums.data(), total, sums.size() * sizeof(double));
  const ParallelDims& mesh = mesh_.dims;
  const AxisSet shared = mesh.normalized(kModelAxes | (data_parallel_.shards_optimizer_state() ? zero_axes_ : AxisSet{}));
  double sum = 0;
  for (size_t s = 0; s < sums.size(); s++) {
    const AxisSet beyond = mesh.normalized(norm_sets_[s]) - shared;
    sum += beyond.empty() ? sums[s] : group_of(beyond)->all_reduce(sums[s]);
  }
  for (AxisSet axes : {shared & kDataAxes, shared & AxisSet{MeshAxis::tp}, shared & AxisSet{MeshAxis::pp}})
    if (!axes.empty()) sum = group_of(axes)->all_reduce(sum);
  return sum;
}

GradientNorm StepRunner::update(double lr, double grad_clip, bool loss_finite) {
  const trace::Span span("optimizer", "optimizer");
  GradientNorm norm;
  norm.norm = std::sqrt(gradient_norm_squared());
  // The loss and the norm are global, so every rank should agree; a rank whose reduced
  // gradients alone went bad (dp ranks each hold them all without ZeRO) still must not
  // update while the others skip: the verdict is agreed over dp (tp and pp are in the norm).
  const bool bad = !loss_finite || !std::isfinite(norm.norm);
  if (dp_.all_reduce(bad ? 1.0 : 0.0, ReduceOp::max) > 0) {
    norm.skipped = true;
    if (!bad) norm.norm = std::numeric_limits<double>::quiet_NaN();  // another rank's gradients were not finite
    return norm;
  }
  norm.clip_coefficient = clip_coefficient(norm.norm, grad_clip);
  ParamGradStore& store = model_.store();
  optimizer_.step([&store](size_t offset) { return store.parameter_at(offset); },
                  [this](size_t offset) { return data_parallel_.gradient_at(offset); }, lr, norm.clip_coefficient);
  if (!store.parameters_sharded()) data_parallel_.gather_parameters(store.params());  // ZeRO-3: the store gathers
  store.parameters_changed();
  // The buffers after the parameters (a skipped step moves neither), from the step's
  // figures, which every rank holds summed.
  model_.update_buffers(StepFigures{.expert_tokens = &routers_.expert_tokens()});
  return norm;
}

}  // namespace trident
