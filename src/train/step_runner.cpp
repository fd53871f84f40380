#include "train/step_runner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "monitor/step_trace.h"
#include "kernels/base/error.h"

namespace trident {

StepRunner::StepRunner(Transformer& model, Optimizer& optimizer, DataParallel& data_parallel, Communicator& dp,
                       kernels::Kernels& k, PipelineLinks pipeline)
    : model_(model), optimizer_(optimizer), data_parallel_(data_parallel), dp_(dp), k_(k),
      pipeline_(model, pipeline) {
  norm_total_ = kernels::DeviceBuffer(k, 4);  // two doubles: the shared tensors', the experts'
}

uint64_t StepRunner::exchanged_bytes() const {
  const Communicator* ep = model_.expert_parallel();
  return ep == nullptr ? 0 : ep->stats().bytes[static_cast<int>(CommOp::all_to_all)];
}

double StepRunner::compute_gradients(const int32_t* inputs, const int32_t* targets, int local_batch,
                                     int global_batch) {
  const uint64_t exchanged_before = exchanged_bytes();
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
  sync_tied_embedding();
  data_parallel_.gradients_final_from(0);
  comm_wait_s_ = data_parallel_.finish_gradients();
  sum_shared_head_gradients();
  // The step's one read of the losses (the last stage has them; a host synchronization).
  // With the routers' auxiliary losses and tokens per expert (every stage's blocks'): one
  // reduction for all.
  const RouterStats router = model_.take_router_stats();
  const uint64_t exchanged = exchanged_bytes() - exchanged_before;
  struct At {  // `sums`' order: the tokens per layer and expert last
    enum { loss, aux_loss, routed, not_computed, exchanged, tokens };
  };
  std::vector<double> sums = {model_.take_loss_sum(), router.aux_loss_sum, router.rows_routed,
                              router.rows_routed - router.rows_computed, static_cast<double>(exchanged)};
  sums.insert(sums.end(), router.tokens.begin(), router.tokens.end());
  if (pipeline_.pp() != nullptr) pipeline_.pp()->all_reduce(std::span<double>(sums));
  dp_.all_reduce(std::span<double>(sums));
  aux_loss_ = sums[At::aux_loss] / global_batch;
  tokens_routed_ = sums[At::routed];
  tokens_dropped_ = sums[At::not_computed];
  // Summed over pp and dp x cp; every tp rank exchanges as many.
  const Communicator* tp = model_.tensor_parallel().communicator();
  all_to_all_bytes_ = sums[At::exchanged] * (tp != nullptr ? tp->size() : 1);
  const int E = model_.spec().n_experts;
  expert_load_.clear();
  expert_tokens_.clear();
  for (size_t first = At::tokens; E > 0 && first < sums.size(); first += E) {
    const auto begin = sums.begin() + static_cast<std::ptrdiff_t>(first), end = begin + E;
    const double total = std::accumulate(begin, end, 0.0);
    expert_load_.push_back(total > 0 ? *std::max_element(begin, end) * E / total : 1.0);
    expert_tokens_.emplace_back(begin, end);
  }
  return sums[At::loss] / (static_cast<double>(global_batch) * T);
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
void StepRunner::sync_tied_embedding() {
  if (pipeline_.embedding() == nullptr) return;
  const std::vector<ParameterTensor>& tensors = model_.layout().tensors();
  for (size_t i = 0; i < tensors.size(); i++) {
    if (tensors[i].placement.gradient_sum != GradientSum::pipeline_ends) continue;
    float* grad = model_.store().grad(static_cast<int>(i));
    for (size_t at = 0; at < tensors[i].stored; at += kReductionPieceFloats)
      pipeline_.embedding()->all_reduce(std::span<float>(grad + at, std::min(kReductionPieceFloats, tensors[i].stored - at)));
  }
}

// After the data-parallel reduction (sums commute), on the ranges whose reduced
// gradients this rank holds (the same ranges on every rank of a tp group): the shared
// key/value heads' parts, and under sequence parallelism the norms' (each rank saw its rows).
void StepRunner::sum_shared_head_gradients() {
  std::vector<RequestPtr> sums;
  for (const FlatRange& r : data_parallel_.owned())
    for (const ParameterTensor& t : model_.layout().tensors()) {
      const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
      if (begin >= end) continue;
      TensorParallel& tp = model_.tensor_parallel();
      const std::span<float> reduced(data_parallel_.gradient_at(begin), end - begin);
      if (t.placement.gradient_sum == GradientSum::piece_holders) sums.push_back(tp.sum_shared_head_gradients(reduced));
      if (t.placement.gradient_sum == GradientSum::sequence_shards)
        sums.push_back(tp.sum_sequence_partial_gradients(reduced));
      if (t.placement.gradient_sum == GradientSum::tp_ranks) sums.push_back(tp.sum_head_partial_gradients(reduced));
    }
  for (RequestPtr& s : sums) finish(s);
}

double StepRunner::gradient_norm_squared() {
  // Every parameter once: each tensor from the rank whose copy counts (the first holder
  // of its tp piece; not the last stage's copy of a tied embedding); with ZeRO each dp
  // rank holds the reduced gradients of its own ranges.
  // Summed on the device, in order, and read once (one host synchronization).
  TensorParallel& tp = model_.tensor_parallel();
  const ParameterLayout& layout = model_.layout();
  // Without ZeRO under expert parallelism each rank holds only its experts: theirs are
  // summed over the ep group (with ZeRO the sum over dp x cp covers them once, as the rest).
  double* total = reinterpret_cast<double*>(norm_total_.data());
  k_.fill_zero(total, 2 * sizeof(double));
  for (const FlatRange& r : data_parallel_.owned())
    for (const ParameterTensor& t : layout.tensors()) {
      const size_t begin = std::max(r.begin, t.offset), end = std::min(r.end, t.offset + t.stored);
      if (begin < end && t.placement.counted)
        k_.accumulate_sum_squares(total + (t.placement.expert ? 1 : 0), data_parallel_.gradient_at(begin), end - begin);
    }
  double sums[2] = {0.0, 0.0};
  k_.copy_to_host(sums, total, sizeof sums);
  Communicator* experts = model_.expert_parallel();
  if (experts != nullptr && !data_parallel_.shards_optimizer_state()) sums[1] = experts->all_reduce(sums[1]);
  double sum = sums[0] + sums[1];
  if (data_parallel_.shards_optimizer_state()) sum = data_parallel_.shard_group().all_reduce(sum);
  if (tp.communicator() != nullptr) sum = tp.communicator()->all_reduce(sum);
  if (pipeline_.pp() != nullptr) sum = pipeline_.pp()->all_reduce(sum);
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
  return norm;
}

}  // namespace trident
