// One rank's stage of the model: a loop over its layers (model/layers/), which its family
// builds (model/families/): the embedding, the blocks of its chunks, the final norm and
// the head, with explicit forward and backward passes over the kernel API
// (kernels/kernels.h), so the same model runs on any backend and any family. The model
// owns the activations of its micro-batch slots (the arena of what its layers declare)
// and the store of its parameters and gradients (parallel/param_grad_store.h: the fp32
// values, the compute copy of the weights the layers read, and ZeRO's sharding of them),
// all allocated once at construction. Under tensor parallelism each rank holds its shard
// (each tensor's placement: model/placement.h); under context parallelism its share of
// each sequence (model/context_parallel.h). What its attention layers share, that depends
// on the sequence only (positions, rotary tables, the ring, the masks), is the attention
// context's (model/layers/attention_context.h): the model builds it, hands it to the
// layers once, and has it load each micro-batch's document starts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "config/config.h"
#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/activations.h"
#include "model/families/family.h"
#include "model/layers/attention_context.h"
#include "model/layers/layer.h"
#include "model/parameters.h"
#include "model/tensor_parallel.h"
#include "model/transformer_spec.h"
#include "parallel/communicator.h"
#include "parallel/param_grad_store.h"
#include "parallel/zero_stage.h"

namespace trident {

// The activations of one stage on one rank (sequence_shards: tp under sequence
// parallelism, else 1; split_backward: zb1's deferred weight gradients, kept only without
// recompute; context_parallel: cp, each rank holding seq_len / cp tokens of a sequence).
ActivationShape activation_shape(const TransformerSpec& spec, const StageSpec& stage, int micro_batch, int slots,
                                 Recompute recompute, const kernels::Footprint& k, int sequence_shards = 1,
                                 bool split_backward = false, int context_parallel = 1,
                                 const std::vector<int>& chunk_slots = {});

// What the activations of these layers take (declared as the model declares them, not
// allocated), the widest GEMM output and the largest GEMM operands (the kernels'
// workspace): for memory plans.
struct StageActivations {
  ActivationBytes bytes;
  int widest_output = 0;
  kernels::GemmOperands gemm_operands;
};
StageActivations measure_activations(const TransformerSpec& spec, const StageSpec& stage, int tp_rank, int tp_size,
                                     const ActivationShape& shape);

// How one rank's model stage is built; the defaults: the whole model on one rank.
struct TransformerOptions {
  int micro_batch = 1;         // sequences per forward/backward (the activation buffers' size)
  TensorParallel tp = {};      // the tensor-parallel group
  size_t buffer_multiple = 1;  // the flat parameter and gradient buffers are padded to a multiple
  StageSpec stage = {};        // the part of the model held here (pipeline parallelism)
  // Micro-batches whose activations can be alive at once (the schedule's need); under the
  // interleaved schedule (micro-batch, chunk) pairs, and per chunk its micro-batches
  // (pipeline/schedule.h: ActivationSlots; empty: `slots` each).
  int slots = 1;
  std::vector<int> chunk_slots;
  Recompute recompute = Recompute::none;  // what backward recomputes instead of keeping (model/activations.h)
  int recompute_layers = 0;               // full: the blocks of each chunk recomputed, 0 all (model/activations.h)
  RecomputeMethod recompute_method = RecomputeMethod::block;
  // zb1: backward runs as two halves, the weight gradients deferred (BackwardPart); without
  // recompute only (with it the input half does the whole backward, the weight half nothing).
  bool split_backward = false;
  // How the store shards the parameters and gradients (parallel/param_grad_store.h:
  // from ZeRO-2 the blocks' gradients in two windows, ZeRO-3 the parameters too), and
  // over which ranks (ZeRO-3's; the stages below shard in DataParallel).
  ZeroStage zero = ZeroStage::none;
  Communicator* shard_group = nullptr;
  GroupOf region_groups = {};  // the groups of the layout's data regions (ParamGradStore)
  // Document masking (model/document_mask.h): the end-of-document token id; -1: attention
  // over the whole sequence.
  int32_t document_end = -1;
  // Context parallelism's group (model/context_parallel.h); null: each sequence whole here.
  Communicator* context_parallel = nullptr;
  // Expert parallelism's group (parallel/parallel_dims.h): the ranks holding the other
  // experts, which tokens are exchanged with; null: every expert here.
  Communicator* expert_parallel = nullptr;
};

// Which part of a micro-batch's backward pass to run (pipeline/schedule.h): all of it, or
// under zb1 the input gradients (sent upstream at once), then later the weight gradients.
enum class BackwardPart { whole, input, weight };

class Transformer {
 public:
  Transformer(const ModelConfig& config, kernels::Kernels& k, const TransformerOptions& options = {});

  const TransformerSpec& spec() const { return layout_.spec(); }
  const ParameterLayout& layout() const { return layout_; }
  TensorParallel& tensor_parallel() { return tp_; }
  // Expert parallelism's group (null: every expert here).
  Communicator* expert_parallel() const { return runtime_->experts; }
  int micro_batch() const { return B_; }
  Recompute recompute() const { return activations_.shape().recompute; }
  int slots() const { return activations_.slots(); }
  // Slots of a chunk's own buffers (the embedding's, the head's; `slots()` with one chunk).
  int chunk_slots(int chunk) const { return activations_.chunk_slots(chunk); }
  // The parameters and gradients: what the optimizer, data parallelism and checkpoints use.
  ParamGradStore& store() { return store_; }
  const ParamGradStore& store() const { return store_; }

  // Initialization from a seed, as the spec says per tensor: normal(0, 0.02) weights and
  // embeddings, residual projections scaled by 1/sqrt(2 n_layer), zero biases, unit norm
  // gains. Each value depends only on (seed, tensor name, index), never on the layout.
  void init_parameters(uint64_t seed);

  // The declared buffers (layout().buffers(): StateKind::buffer), all of this stage's, as
  // one flat host buffer of layout().buffer_floats() floats, and back; each starts at its
  // init (zeros, ones) when the model is built.
  void buffers_to_host(float* flat) const;
  void buffers_from_host(const float* flat);
  // After a step's update: each layer moves its buffers by the step's figures.
  void update_buffers(const StepFigures& figures);

  // Copies a named parameter in its full canonical shape from the host into this
  // rank's shard.
  void set_parameter(const std::string& name, const float* host, size_t count);
  // The full canonical tensor, gathered over tp: collective (under ZeRO-3 over the
  // shard group too); and its gradient (over tp).
  std::vector<float> full_parameter(const std::string& name);
  std::vector<float> full_gradient(const std::string& name);
  // The same from a flat buffer of this rank's layout in host memory (collective).
  std::vector<float> tensor_from_host(const std::string& name, const float* flat);

  // Runs this stage's forward pass for a micro-batch in activation slot `slot`, on
  // tokens/targets [B, T] (host memory, B <= micro_batch): the first stage embeds the
  // tokens; a later stage reads its input from stage_input(slot), where the pipeline
  // put the previous stage's output. Keeps the activations for backward(). The last
  // stage adds the sum of the micro-batch's token losses to a total on the device (no
  // host synchronization); elsewhere the output is stage_output(slot).
  void forward(int slot, const int32_t* tokens, const int32_t* targets, int B);
  // The last stage's total of token losses since the last take or discard (reading it
  // is a host synchronization), then zero; 0 on other stages.
  double take_loss_sum();
  void discard_loss_sum();  // and the auxiliary losses'
  // The auxiliary losses (a mixture of experts' router) since the last take or discard,
  // this stage's: the sum over sequences of each one's (model/layers/moe.h); 0 for a dense model.
  // The routers' totals since the last take or discard (RouterStats), then cleared.
  RouterStats take_router_stats();
  // Verify's: the mixtures' choices appended to `record` from now on (null: no longer).
  void record_routing(RoutingRecord* record);
  void discard_router_stats();
  // Adds d(loss_scale * sum of token losses)/d(params) into the gradients, for the
  // micro-batch in `slot`. For a mean over G sequences: loss_scale = 1/(G*T). A stage
  // other than the last starts from stage_gradient(), filled by the pipeline; a stage
  // other than the first leaves d loss / d input there.
  // grads_final_from(offset), if given, is called as soon as the gradients at
  // [offset, end) of the flat buffer are complete (the last layers come first), so that
  // their reduction can start while backward goes on.
  // unit_begins(offset), if given, is called before the gradients of a windowed unit
  // (parallel/param_grad_store.h: a block, or a ZeRO-3 end) starting at `offset` are
  // written (its window must be free and zeroed first); grads_final_from(offset) follows
  // when they are complete (a tied table's: after the head, and after the embedding).
  void backward(int slot, float loss_scale, const std::function<void(size_t)>& grads_final_from = {},
                const std::function<void(size_t)>& unit_begins = {});
  // The same for one model chunk of the stage (layout().chunks(); one but under the
  // interleaved schedule): its blocks, the embedding if it is the model's first chunk, the
  // head if its last. forward(slot, ...) and backward(slot, ...) are chunk 0's. Several
  // chunks share the slots of their blocks' activations; the chunk's own (the embedding's,
  // the head's) are in its slot `chunk_slot` (-1: `slot`) until `slot` is used again.
  void chunk_forward(int chunk, int slot, const int32_t* tokens, const int32_t* targets, int B,
                     int chunk_slot = -1);
  // part: the whole backward, or its input-gradient half (leaves d loss / d input in
  // stage_gradient(), adds no weight gradient: the callbacks are the weight half's), or
  // its weight-gradient half (of a slot whose input half ran; touches no activation
  // gradient). Without deferred weight gradients (defers_weight_gradients()) the input
  // half is the whole backward and the weight half does nothing.
  void chunk_backward(int chunk, int slot, float loss_scale, BackwardPart part,
                      const std::function<void(size_t)>& grads_final_from = {},
                      const std::function<void(size_t)>& unit_begins = {});
  bool defers_weight_gradients() const { return activations_.shape().deferred_weight_gradients; }
  // Whether a pass of `part` adds weight gradients (a chunk's last such pass completes them).
  bool adds_weight_gradients(BackwardPart part) const {
    return part == BackwardPart::whole || (part == BackwardPart::weight) == defers_weight_gradients();
  }
  // One stage, one slot: the mean loss of the micro-batch on the last stage (0 elsewhere).
  float forward(const int32_t* tokens, const int32_t* targets, int B);
  void backward(float loss_scale, const std::function<void(size_t)>& grads_final_from = {}) {
    backward(0, loss_scale, grads_final_from);
  }

  // After forward() on the last stage: the logits of sequence `b`, position `t` of the
  // micro-batch in `slot`, over the whole vocabulary (gathered over tp: collective).
  std::vector<float> logits(int slot, int b, int t);

  bool first_stage() const { return stage_.has_embedding; }
  bool last_stage() const { return stage_.has_head; }
  int chunks() const { return layout_.chunks(); }
  // The chunk that embeds the tokens (the model's first) / holds the head (its last).
  bool embeds(int chunk) const { return stage_.has_embedding && chunk == 0; }
  bool has_head(int chunk) const { return stage_.has_head && chunk == chunks() - 1; }
  // Hidden states [B, T, d] entering / leaving a chunk of this stage for the micro-batch
  // in `slot` (each chunk's in its own buffers). Under sequence parallelism each holds
  // this rank's rows only.
  ActivationSpan stage_input(int chunk, int slot, int B) const { return regions_->rows_of(chunk_input(chunk, slot), B); }
  ActivationSpan stage_output(int chunk, int slot, int B) const { return regions_->rows_of(chunk_output(chunk, slot), B); }
  // The gradient [B, T, d] flowing through this stage, in one buffer: before backward()
  // d loss / d (stage output), coming in from the next stage; after it d loss / d (stage
  // input), going out to the previous one (backward turns one into the other in place).
  ActivationSpan stage_gradient(int B) const { return regions_->rows_of(dresidual_, B); }
  // After a backward: stage_gradient() copied aside, to be sent upstream while the next
  // backward's gradient is received (the copy is overwritten by the next call: its last
  // send must have left).
  ActivationSpan gradient_to_send(int B);

  // Activation bytes held for all slots (for the memory report).
  const ActivationBytes& activation_bytes() const { return activations_.bytes(); }
  // Bytes held beyond the arena because the data needed them (a dropless mixture's rows
  // received beyond the planned headroom, under expert parallelism): not in the memory plan.
  size_t grown_bytes() const { return growing_->bytes(); }

 private:
  using Act = kernels::Act;

  // The residual stream entering a chunk (the embedding's output, or where the pipeline
  // puts it), leaving it (its last block's output), and entering its local block l.
  Act* chunk_input(int chunk, int slot) const;
  Act* chunk_output(int chunk, int slot) const;
  Act* block_input(int chunk, int slot, int l) const;
  // The full canonical tensor from this rank's piece of it (host memory), over tp.
  std::vector<float> assemble_over_tp(const ParameterTensor& t, const std::vector<float>& mine);
  // The pass of the micro-batch of B sequences in `slot`.
  Pass pass(int slot, int B, bool defer = false) const { return {slot, B, defer}; }
  // A span of trace for local block l: "layer 3 forward".
  static std::string trace_name(int global_layer, const char* what);

  StageSpec stage_;
  TensorParallel tp_;
  StageLayers layers_;  // built by the family; they keep their tensors' and buffers' places
  ParameterLayout layout_;
  int B_;
  kernels::Kernels& k_;
  ParamGradStore store_;
  kernels::DeviceBuffer buffer_values_;  // the declared buffers, fp32 (layout_.buffers())
  // The attention layers' positions, rotary tables, ring and masks (one for the stage).
  std::unique_ptr<AttentionContext> attention_;
  // Context parallelism (model/context_parallel.h): cp_ ranks share each sequence, this one
  // holds T_ = seq_len / cp_ of its tokens, at attention_->positions(); the batch's share
  // of tokens and targets taken on the host.
  int cp_ = 1, T_ = 0;
  std::vector<int32_t> my_tokens_, my_targets_;

  ActivationArena activations_;  // every slot's, the recompute set, backward's scratch
  std::vector<int> slot_batch_;  // per slot: the sequences of the micro-batch now in it
  std::vector<int> chunk_inputs_;  // kept, per chunk: its input, where the pipeline puts it (-1: the embedding's)
  Act *dresidual_ = nullptr, *sent_gradient_ = nullptr;  // backward's: the residual stream's gradient, a copy to send
  std::unique_ptr<SequenceRegions> regions_;
  kernels::DeviceBuffer loss_sum_;  // a double: the token losses summed since the last take
  // Host: the routers' totals since the last take (the layers' runtime points at it: a
  // place of its own, that stays where it is when the model moves).
  std::unique_ptr<RouterStats> router_stats_ = std::make_unique<RouterStats>();
  std::unique_ptr<GrowingScratch> growing_ = std::make_unique<GrowingScratch>();
  double* loss_sum() const { return reinterpret_cast<double*>(loss_sum_.data()); }
  std::unique_ptr<LayerRuntime> runtime_;
};

}  // namespace trident
