// The activations one pipeline stage keeps between a micro-batch's forward and backward
// passes, and the backward's scratch: every buffer laid out in one arena, once, from an
// ActivationShape. The memory plan (plan/memory_plan.h) measures the same layout
// without allocating it, so what it prints is what the run holds.
//
// Recomputation trades compute for memory (Megatron's --recompute-granularity):
//   none       every layer keeps all it produced.
//   selective  attention's core is recomputed in backward (Megatron's selective
//              recompute): its statistics (each row's log-sum-exp) and its output
//              are not kept per layer; one attention forward per layer in backward.
//   full       each layer keeps only its output (the next layer's input); backward
//              reruns the layer's forward up to the MLP's output projection first.
// Under sequence parallelism (Megatron's) the residual stream, the norms' outputs and
// their statistics hold this rank's B*T/tp rows only; what the column- and row-parallel
// GEMMs read and write holds all rows (split by width).
// What is not kept per layer lives in one shared "recompute" set, reused by every layer.
#pragma once

#include <algorithm>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/choices.h"
#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/context_parallel.h"

namespace trident {

// The sizes of one stage's activations on one rank (its tensor-parallel share).
struct ActivationShape {
  int micro_batch = 1, seq_len = 1, d_model = 1;
  int qkv_width = 1, attention_width = 1, ffn = 1, mlp_in = 1, vocab_shard = 1;
  int layers = 0;
  bool layernorm = true, swiglu = false, has_head = true;
  int slots = 1;  // micro-batches whose activations are alive at once (the pipeline's)
  // Sequence parallelism: the residual stream and the norms' outputs hold 1/tp of the
  // B*T rows (this rank's), the rest all of them; 1 without.
  int sequence_shards = 1;
  // Context parallelism: seq_len is this rank's share of a sequence (model.seq_len / cp),
  // and backward's scratch holds the ring's buffers (model/context_parallel.h).
  int context_parallel = 1;
  Recompute recompute = Recompute::none;
  // zb1 (pipeline/schedule.h): the weight-gradient half of backward runs later, from what
  // the input-gradient half leaves in the slot (model/transformer.h); only without recompute.
  bool deferred_weight_gradients = false;
  bool sends_gradients = false;  // a pipeline stage past the first: its input's gradient goes upstream
  kernels::DType act_type = kernels::DType::f32;
  size_t attention_stats_floats = 0;  // one layer's, for a whole micro-batch (the backend's)

  size_t act_bytes(size_t elements) const { return elements * kernels::dtype_bytes(act_type); }
  // The widest output a GEMM writes (what the kernels' workspace is sized by).
  int widest_output() const { return std::max({qkv_width, mlp_in, d_model, vocab_shard}); }
};

// One layer's activations of one micro-batch. norm_*_mean: LayerNorm only.
struct LayerActivations {
  kernels::Act *norm_1 = nullptr, *qkv = nullptr, *atty = nullptr, *residual_2 = nullptr, *norm_2 = nullptr,
               *fc = nullptr, *fc_act = nullptr, *residual_3 = nullptr;
  float *norm_1_mean = nullptr, *norm_1_rstd = nullptr, *attention_stats = nullptr, *norm_2_mean = nullptr,
        *norm_2_rstd = nullptr;
  // Deferred weight gradients: the norms' gains' (and biases') gradients, [4, C], until
  // the weight-gradient half adds them (the GEMMs' output gradients wait in qkv, fc,
  // residual_2 and residual_3, which the input-gradient half no longer needs).
  float* norm_gradients = nullptr;
};

// One micro-batch's activations.
struct SlotActivations {
  int32_t *tokens = nullptr, *targets = nullptr;
  kernels::Act *encoded = nullptr, *final_norm = nullptr, *logits = nullptr;
  float *final_norm_mean = nullptr, *final_norm_rstd = nullptr, *losses = nullptr, *row_max = nullptr,
        *sum_and_target = nullptr, *lse = nullptr;
  float* final_norm_gradients = nullptr;  // deferred weight gradients: the final norm's, [2, C]
  std::vector<LayerActivations> layers;
  int B = 0;  // sequences of the micro-batch now in the slot
};

// Backward's buffers, shared by all layers and slots; with sequence parallelism also
// the all-gathered rows (`gathered`, [B*T, C], forward's too) and a reduce-scatter's
// output (`dnorm_rows`, this rank's rows).
struct BackwardScratch {
  // sent_gradient: the copy of d loss / d input a pipeline stage sends upstream while the
  // next backward receives into dresidual (no stage waits on its own last send before
  // taking its next gradient: that wait can close a cycle between two stages).
  kernels::Act *sent_gradient = nullptr;
  kernels::Act *dresidual = nullptr, *dnorm = nullptr, *datty = nullptr, *dqkv = nullptr, *dfc = nullptr,
               *dfc_act = nullptr, *gathered = nullptr, *dnorm_rows = nullptr;
  RingBuffers ring;  // context parallelism's, forward's too
};

// The arena's bytes by part.
struct ActivationBytes {
  size_t per_slot = 0;   // one micro-batch's kept activations
  size_t slots = 0;      // all slots: per_slot * shape.slots
  size_t recompute = 0;  // the shared set that recomputation refills
  size_t backward = 0;   // BackwardScratch
  size_t total() const { return slots + recompute + backward; }
};

class ActivationArena {
 public:
  ActivationArena(const ActivationShape& shape, kernels::Kernels& k);
  // What the arena of `shape` takes, without allocating it.
  static ActivationBytes measure(const ActivationShape& shape);

  const ActivationShape& shape() const { return shape_; }
  const ActivationBytes& bytes() const { return bytes_; }
  std::vector<SlotActivations> slots;
  LayerActivations recompute;  // the shared set (pointers of the layers that do not keep their own)
  BackwardScratch scratch;

 private:
  ActivationArena(const ActivationShape& shape, kernels::Kernels* k);
  ActivationShape shape_;
  ActivationBytes bytes_;
  kernels::DeviceBuffer memory_;
};

}  // namespace trident
