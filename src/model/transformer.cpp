#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/base/error.h"
#include "model/context_parallel.h"
#include "model/layers/moe.h"
#include "monitor/step_trace.h"
#include "runtime/random.h"

namespace trident {

namespace {

// Backward's buffers of the stage itself: the residual stream's gradient, the copy of it
// a stage past the first sends upstream, sequence parallelism's gathered and reduced rows;
// and per model chunk but the embedding's the buffer its input arrives in.
struct StageBuffers {
  kernels::Act *dresidual = nullptr, *sent = nullptr, *gathered = nullptr, *reduced = nullptr;
  std::vector<int> chunk_inputs;  // kept, per chunk (-1: the embedding's output)
};

// Everything a stage declares, in order: its own buffers, then its layers', each chunk's
// blocks (and input) in the slots the chunks share, the embedding's and head's in their
// chunk's own (model/activations.h).
void declare_stage(StageLayers& layers, const StageSpec& stage, const ParameterLayout& layout, int C,
                   ActivationDeclarations& a, StageBuffers& b) {
  const ActivationShape& s = a.shape();
  const int chunks = layout.chunks();
  a.set_recompute_group(-1);
  a.scratch(b.dresidual, "d residual", s.rows() * C, Element::act);
  if (s.sends_gradients) a.scratch(b.sent, "sent gradient", s.rows() * C, Element::act);
  if (s.sequence_shards > 1) {
    a.scratch(b.gathered, "gathered rows", s.tokens() * C, Element::act);
    a.scratch(b.reduced, "reduced rows", s.rows() * C, Element::act);
  }
  a.set_chunk(0, /*own=*/true);
  if (layers.embedding) layers.embedding->declare_activations(a);
  b.chunk_inputs.assign(chunks, -1);
  for (int c = 0; c < chunks; c++) {
    a.set_recompute_group(-1);
    a.set_chunk(c);
    if (c > 0 || !stage.has_embedding) b.chunk_inputs[c] = a.keep(s.rows() * C, Element::act);
    const int begin = layout.chunk_begin(c), n = layout.chunk_begin(c + 1) - begin;
    for (int l = begin; l < begin + n; l++) {
      a.set_kept_whole(!s.recomputes_block(l - begin, n));
      layers.blocks[l]->declare_activations(a);
    }
    a.set_kept_whole(false);
  }
  a.set_recompute_group(-1);
  a.set_chunk(chunks - 1, /*own=*/true);
  if (layers.head) {
    layers.final_norm->declare_activations(a);
    layers.head->declare_activations(a);
  }
}

}  // namespace

ActivationShape activation_shape(const TransformerSpec& spec, const StageSpec& stage, int micro_batch, int slots,
                                 Recompute recompute, const kernels::Footprint& k, int sequence_shards,
                                 bool split_backward, int context_parallel, const std::vector<int>& chunk_slots) {
  ActivationShape a;
  a.micro_batch = micro_batch;
  a.chunk_slots = chunk_slots;
  a.seq_len = spec.seq_len / context_parallel;  // this rank's tokens of a sequence
  a.context_parallel = context_parallel;
  a.sequence_shards = sequence_shards;
  a.slots = slots;
  a.recompute = recompute;
  a.deferred_weight_gradients = split_backward && recompute == Recompute::none;
  a.sends_gradients = !stage.has_embedding || stage.chunks.size() > 1;  // not the whole model from the embedding
  a.act_type = k.activation_type();
  a.footprint = &k;
  return a;
}

StageActivations measure_activations(const TransformerSpec& spec, const StageSpec& stage, int tp_rank, int tp_size,
                                     const ActivationShape& shape) {
  StageLayers layers = make_stage_layers(spec, stage);
  const ParameterLayout layout(layers, spec, tp_rank, tp_size, 1, stage);  // the layers learn their tp shares
  ActivationDeclarations declared(shape);
  StageBuffers buffers;
  declare_stage(layers, stage, layout, spec.d_model, declared, buffers);
  return {ActivationArena::measure(declared), declared.widest_output(), declared.gemm_operands()};
}

Transformer::Transformer(const ModelConfig& config, kernels::Kernels& k, const TransformerOptions& options)
    : stage_(options.stage), tp_(options.tp), layers_(make_stage_layers(transformer_spec(config), options.stage)),
      layout_(layers_, transformer_spec(config), tp_.rank(), tp_.size(), options.buffer_multiple, options.stage),
      B_(options.micro_batch), k_(k), store_(layout_, k, options.zero, options.shard_group, options.region_groups,
             /*defers_weight_gradients=*/options.split_backward && options.recompute == Recompute::none) {
  const TransformerSpec& s = spec();
  // This rank's tokens of each sequence (all of them, or its share under cp), and what the
  // attention layers share of them.
  Communicator* cp = options.context_parallel;
  cp_ = cp != nullptr ? cp->size() : 1;
  attention_ = std::make_unique<AttentionContext>(k, s.seq_len, B_, options.slots, cp, options.document_end);
  T_ = attention_->tokens();
  if (cp_ > 1) {
    my_tokens_.resize(static_cast<size_t>(B_) * T_);
    my_targets_.resize(my_tokens_.size());
  }
  // The activations every layer declares, in one arena.
  ActivationShape shape = activation_shape(s, stage_, B_, options.slots, options.recompute, k,
                                           tp_.sequence_parallel() ? tp_.size() : 1, options.split_backward, cp_,
                                           options.chunk_slots);
  shape.recompute_layers = options.recompute_layers;
  shape.recompute_method = options.recompute_method;
  ActivationDeclarations declared(shape);
  StageBuffers buffers;
  check((options.expert_parallel != nullptr ? options.expert_parallel->size() : 1) == options.stage.ep,
        "the expert-parallel group does not match the stage's ep");
  declare_stage(layers_, stage_, layout_, s.d_model, declared, buffers);
  activations_ = ActivationArena(declared, k);
  dresidual_ = buffers.dresidual;
  sent_gradient_ = buffers.sent;
  chunk_inputs_ = buffers.chunk_inputs;
  regions_ = std::make_unique<SequenceRegions>(tp_, k, T_, s.d_model);
  regions_->gathered = buffers.gathered;
  regions_->reduced = buffers.reduced;
  for (const auto& block : layers_.blocks) block->attach(*attention_);  // their rotary tables, ring, masks
  loss_sum_ = kernels::DeviceBuffer(k, 4);  // two doubles: the tokens' losses, the routers' auxiliary losses
  router_stats_->tokens.assign(static_cast<size_t>(s.n_layer) * s.n_experts, 0.0);
  router_stats_->aux_loss_on_device = loss_sum() + 1;
  slot_batch_.assign(options.slots, 0);
  runtime_ = std::make_unique<LayerRuntime>(LayerRuntime{k, store_, *regions_, activations_, T_,
                                                         attention_->device_positions(), loss_sum(), cp,
                                                         router_stats_.get(), options.expert_parallel, growing_.get(),
                                                         nullptr});
  // The buffers at their init.
  buffer_values_ = kernels::DeviceBuffer(k, std::max<size_t>(1, layout_.buffer_floats()));
  std::vector<float> initial(layout_.buffer_floats(), 0.0f);
  for (const ParameterTensor& b : layout_.buffers())
    std::fill_n(initial.begin() + static_cast<std::ptrdiff_t>(b.offset), b.stored, b.init == Init::ones ? 1.0f : 0.0f);
  buffers_from_host(initial.data());
  runtime_->buffers = buffer_values_.data();
  // The kernels' workspace for these shapes now, as the memory plan counts it.
  k.reserve_workspace(B_ * T_, s.d_model, declared.widest_output(), B_, T_, s.n_head / tp_.size());
  // And the staging of the layers' uploads: tokens, targets, document starts (B T ints
  // each), a mixture's rows.
  const size_t N = static_cast<size_t>(B_) * T_;
  k.reserve_uploads(std::max(N * sizeof(int32_t),
                             s.n_experts > 0 ? moe_largest_upload_bytes(N, s.experts_per_token, options.stage.ep) : 0));
}

void Transformer::buffers_to_host(float* flat) const {
  k_.copy_to_host(flat, buffer_values_.data(), layout_.buffer_floats() * sizeof(float));
}

void Transformer::buffers_from_host(const float* flat) {
  k_.copy_to_device(buffer_values_.data(), flat, layout_.buffer_floats() * sizeof(float));
}

void Transformer::update_buffers(const StepFigures& figures) {
  if (layout_.buffers().empty()) return;
  for (const std::unique_ptr<Block>& block : layers_.blocks) block->update_buffers(*runtime_, figures);
}

void Transformer::init_parameters(uint64_t seed) {
  const double residual_scale = 1.0 / std::sqrt(2.0 * spec().n_layer);
  const ShardedParameters view = store_.parameters();
  std::vector<float> staging;  // one shard, where the parameters are not host memory
  for (const auto& t : layout_.tensors()) {  // of this stage
    // Each element from its canonical index, straight into this rank's shard: the same
    // values under any tp, and no full copy of a large tensor (the embedding) in memory.
    const bool normal = t.init == Init::normal || t.init == Init::normal_residual;
    const double std = 0.02 * (t.init == Init::normal_residual ? residual_scale : 1.0);
    const float constant = t.init == Init::ones ? 1.0f : 0.0f;
    const uint64_t stream = hash_name(t.name);
    const auto values = [&](int64_t first, int64_t n, float* out) {
      for (int64_t i = 0; i < n; i++)
        out[i] = normal ? static_cast<float>(std * normal_at(seed, stream, static_cast<uint64_t>(first + i))) : constant;
    };
    float* shard = view.host_shard(t);
    if (shard == nullptr) {
      staging.resize(t.stored);
      shard = staging.data();
    }
    layout_.shard_into(t, values, shard);
    if (shard == staging.data()) view.set_shard(t, shard);
  }
  store_.parameters_changed();
}

void Transformer::set_parameter(const std::string& name, const float* host, size_t count) {
  const ParameterTensor& t = layout_.tensor(name);
  require(count == t.numel(), "parameter " + name + " has " + std::to_string(t.numel()) +
                                  " elements, got " + std::to_string(count));
  store_.parameters().set(t, host);
  store_.parameters_changed();
}

std::vector<float> Transformer::full_parameter(const std::string& name) {
  const ParameterTensor& t = layout_.tensor(name);
  return assemble_over_tp(t, store_.parameter_to_host(layout_.index_of(name)));
}

std::vector<float> Transformer::full_gradient(const std::string& name) {
  const ParameterTensor& t = layout_.tensor(name);
  return assemble_over_tp(t, store_.gradient_to_host(layout_.index_of(name)));
}

std::vector<float> Transformer::tensor_from_host(const std::string& name, const float* flat) {
  const ParameterTensor& t = layout_.tensor(name);
  return assemble_over_tp(t, std::vector<float>(flat + t.offset, flat + t.offset + t.stored));
}

std::vector<float> Transformer::assemble_over_tp(const ParameterTensor& t, const std::vector<float>& mine) {
  const int pieces = t.placement.pieces;
  if (pieces == 1) return layout_.assemble(t, mine);
  // Every tp rank's copy, then one per piece (its first holder's).
  std::vector<float> all(t.stored * tp_.size()), gathered(t.stored * pieces);
  std::copy(mine.begin(), mine.end(), all.begin() + tp_.rank() * t.stored);
  tp_.communicator()->all_gather(all);
  const int holders = tp_.size() / pieces;
  for (int p = 0; p < pieces; p++)
    std::copy_n(all.begin() + static_cast<size_t>(p) * holders * t.stored, t.stored, gathered.begin() + p * t.stored);
  return layout_.assemble(t, gathered);
}

ActivationSpan Transformer::gradient_to_send(int B) {
  check(sent_gradient_ != nullptr, "gradient_to_send() on a stage that sends no gradient");
  k_.copy_on_device(sent_gradient_, dresidual_, regions_->rows_of(dresidual_, B).bytes());
  return regions_->rows_of(sent_gradient_, B);
}

kernels::Act* Transformer::chunk_input(int chunk, int slot) const {
  if (embeds(chunk)) return layers_.embedding->output(*runtime_, slot);
  return runtime_->kept(slot, chunk_inputs_[chunk]);
}

kernels::Act* Transformer::chunk_output(int chunk, int slot) const {
  const int end = layout_.chunk_begin(chunk + 1);
  return end > layout_.chunk_begin(chunk) ? layers_.blocks[end - 1]->output(*runtime_, slot) : chunk_input(chunk, slot);
}

kernels::Act* Transformer::block_input(int chunk, int slot, int l) const {
  return l == layout_.chunk_begin(chunk) ? chunk_input(chunk, slot) : layers_.blocks[l - 1]->output(*runtime_, slot);
}

std::string Transformer::trace_name(int global_layer, const char* what) {
  return "layer " + std::to_string(global_layer) + " " + what;
}

void Transformer::forward(int slot, const int32_t* tokens, const int32_t* targets, int B) {
  check(chunks() == 1, "forward(slot, ...) on a stage of several chunks: chunk_forward()");
  chunk_forward(0, slot, tokens, targets, B);
}

void Transformer::chunk_forward(int chunk, int slot, const int32_t* tokens, const int32_t* targets, int B,
                                int chunk_slot) {
  check(B > 0 && B <= B_, "forward: batch " + std::to_string(B) + " exceeds the micro-batch " +
                              std::to_string(B_));
  const int V = spec().vocab_size, seq_len = spec().seq_len;
  for (int i = 0; i < B * seq_len; i++)  // the message is built only on failure (this runs for every token)
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V)
      throw UsageError("token id out of range [0, " + std::to_string(V) + ") at position " + std::to_string(i));
  // Each rank keeps its share (context parallelism: its chunks of each sequence); the
  // attention context finds the documents in the whole sequences.
  const int32_t *my_tokens = tokens, *my_targets = targets;
  if (cp_ > 1) {
    take_positions(tokens, B, seq_len, attention_->positions(), my_tokens_.data());
    take_positions(targets, B, seq_len, attention_->positions(), my_targets_.data());
    my_tokens = my_tokens_.data();
    my_targets = my_targets_.data();
  }
  activations_.bind(slot, chunk, chunk_slot >= 0 ? chunk_slot : slot);
  LayerRuntime& r = *runtime_;
  const Pass p = pass(slot, B);
  // Without waiting for the device: the first stage embeds the tokens, the last scores
  // the targets, attention's masks get their document starts.
  if (embeds(chunk)) layers_.embedding->load(r, p, my_tokens);
  if (has_head(chunk)) layers_.head->load(r, p, my_targets);
  attention_->load(slot, tokens, B);
  slot_batch_.at(slot) = B;
  store_.refresh_weights();

  if (embeds(chunk)) {
    store_.use_embeddings();  // ZeRO-3: gathered where they are sharded at rest, block 0 on its way
    layers_.embedding->forward(r, p);
  }
  for (int l = layout_.chunk_begin(chunk); l < layout_.chunk_begin(chunk + 1); l++) {
    store_.use_block(l, l + 1);  // ZeRO-3: its weights gathered, the next block's (or the head's) on their way
    const trace::Span span("layer", [&] { return trace_name(layout_.global_layer(l), "forward"); });
    layers_.blocks[l]->forward(r, p, block_input(chunk, slot, l));
  }
  if (!has_head(chunk)) return;
  store_.use_head();
  layers_.head->forward(r, p, layers_.final_norm->forward(r, p, chunk_output(chunk, slot)));
}

double Transformer::take_loss_sum() {
  if (!stage_.has_head) return 0.0;
  double sum = 0.0;
  k_.copy_to_host(&sum, loss_sum(), sizeof sum);
  k_.fill_zero(loss_sum(), sizeof(double));
  return sum;
}

void Transformer::discard_loss_sum() {
  if (stage_.has_head) k_.fill_zero(loss_sum(), sizeof(double));
  discard_router_stats();
}

void Transformer::discard_router_stats() {
  router_stats_->clear();
  if (spec().n_experts > 0) k_.fill_zero(router_stats_->aux_loss_on_device, sizeof(double));
}

void Transformer::record_routing(RoutingRecord* record) { runtime_->routing = record; }

RouterStats Transformer::take_router_stats() {
  RouterStats stats = *router_stats_;
  // The routers' losses, added on the device: one read a step, where there are routers.
  if (spec().n_experts > 0) k_.copy_to_host(&stats.aux_loss_sum, router_stats_->aux_loss_on_device, sizeof(double));
  discard_router_stats();
  return stats;
}

float Transformer::forward(const int32_t* tokens, const int32_t* targets, int B) {
  discard_loss_sum();
  forward(0, tokens, targets, B);
  return static_cast<float>(take_loss_sum() / (static_cast<double>(B) * T_));
}

std::vector<float> Transformer::logits(int slot, int b, int t) {
  check(stage_.has_head && b < slot_batch_.at(slot) && t < spec().seq_len && cp_ == 1,
        "logits: no such row on this stage");
  const size_t row = static_cast<size_t>(b) * spec().seq_len + t;
  const int shard = layers_.head->vocab_shard();
  std::vector<float> all(static_cast<size_t>(shard) * tp_.size());
  k_.activations_to_host(all.data() + static_cast<size_t>(tp_.rank()) * shard,
                         layers_.head->logits(*runtime_, slot, row), shard);
  if (tp_.communicator() != nullptr) tp_.communicator()->all_gather(all);
  all.resize(spec().vocab_size);  // the shards in order, padding last
  return all;
}

void Transformer::backward(int slot, float loss_scale, const std::function<void(size_t)>& grads_final_from,
                           const std::function<void(size_t)>& unit_begins) {
  check(chunks() == 1, "backward(slot, ...) on a stage of several chunks: chunk_backward()");
  chunk_backward(0, slot, loss_scale, BackwardPart::whole, grads_final_from, unit_begins);
}

void Transformer::chunk_backward(int chunk, int slot, float loss_scale, BackwardPart part,
                                 const std::function<void(size_t)>& grads_final_from,
                                 const std::function<void(size_t)>& unit_begins) {
  const int B = slot_batch_.at(slot);
  check(B > 0, "backward() without forward()");
  const auto report = [&](size_t offset) {
    if (grads_final_from) grads_final_from(offset);
  };
  // Where the gradients of unit u (the final norm and head's, block l's) begin in the flat buffer.
  const auto unit_offset = [&](int u) { return layout_.units()[u].begin; };
  const auto head_unit = [&] { return unit_offset(layout_.head_unit()); };
  const auto block_unit = [&](int l) { return unit_offset(layout_.block_unit(l)); };
  // ZeRO-3: the windowed unit an end writes gradients into (the head's: the embeddings' if
  // tied); its window is made ready first and its gradients reported when complete.
  const auto end_begins = [&](int position) {
    const int u = store_.windowed_unit_at(position);
    if (u >= 0 && unit_begins) unit_begins(unit_offset(u));
    return u;
  };
  LayerRuntime& r = *runtime_;
  const int first = layout_.chunk_begin(chunk), end = layout_.chunk_begin(chunk + 1);
  const bool defer = part == BackwardPart::input && defers_weight_gradients();
  Pass p = pass(slot, B, defer);
  p.loss_scale = loss_scale;
  if (part == BackwardPart::weight) {
    if (!adds_weight_gradients(part)) return;  // the input half did it all
    if (has_head(chunk)) {
      layers_.head->weight_gradients(r, p, layers_.final_norm->output(r, slot));
      layers_.final_norm->weight_gradients(r, p);
      report(head_unit());
    }
    for (int l = end - 1; l >= first; l--) {
      if (unit_begins) unit_begins(block_unit(l));
      const trace::Span span("layer", [&] { return trace_name(layout_.global_layer(l), "weight gradients"); });
      layers_.blocks[l]->weight_gradients(r, p, block_input(chunk, slot, l));
      report(block_unit(l));
    }
    if (chunk == 0) report(0);
    return;
  }
  if (has_head(chunk)) {
    // Head: logits become dlogits in place, then through the head and the final norm.
    store_.use_head();
    const int windowed = defer ? -1 : end_begins(layout_.layers());
    const kernels::Act* dnormed = layers_.head->backward(r, p, loss_scale, layers_.final_norm->output(r, slot));
    k_.fill_zero(dresidual_, regions_->rows_of(dresidual_, B).bytes());
    layers_.final_norm->backward(r, p, dnormed, chunk_output(chunk, slot), dresidual_);
    if (!defer) report(head_unit());
    if (windowed >= 0 && windowed != layout_.head_unit()) report(unit_offset(windowed));  // a tied table
  }  // else the pipeline put d loss / d output into dresidual_
  for (int l = end - 1; l >= first; l--) {
    if (unit_begins && !defer) unit_begins(block_unit(l));
    store_.use_block(l, l - 1);
    // What the block did not keep, recomputed into the shared set (model/activations.h).
    if (recompute() == Recompute::full && activations_.shape().recomputes_block(l - first, end - first)) {
      const trace::Span span("layer", [&] { return trace_name(layout_.global_layer(l), "recompute"); });
      layers_.blocks[l]->forward(r, p, block_input(chunk, slot, l), /*up_to_last_output=*/true);
    } else if (recompute() == Recompute::selective) {
      layers_.blocks[l]->recompute_selective(r, p);
    }
    const trace::Span span("layer", [&] {
      return trace_name(layout_.global_layer(l), defer ? "input gradients" : "backward");
    });
    layers_.blocks[l]->backward(r, p, block_input(chunk, slot, l), dresidual_);
    if (!defer) report(block_unit(l));
  }
  // A tied embedding's gradient has the head's part and now the embedding's (all rows):
  // under ZeRO-3 in windows, each part reduced on its own.
  if (embeds(chunk)) {
    store_.embedding_takes_gradients();
    if (!defer) end_begins(-1);
    layers_.embedding->backward(r, p, dresidual_);
  }
  if (!defer && chunk == 0) report(0);  // a later chunk's gradients end above chunk 0's
}

}  // namespace trident
