// Where a parameter lives and how its gradient is completed, as its layer declares it
// (model/layers/): one placement per tensor, read by everyone who needs to know
// (the layout, the optimizer, data parallelism, the gradient norm, checkpoints).
#pragma once

namespace trident {

// How a tensor is cut over the tensor-parallel ranks (Megatron's layout).
enum class Sharding {
  replicated,  // every tp rank holds all of it (norms, wpe, row-parallel biases)
  rows,        // split by rows (dim 0): column-parallel q/k/v, c_fc, gate/up; vocabulary-parallel tables
  qkv_rows,    // GPT-2's fused c_attn: rows split within each of the q, k, v blocks (heads over tp)
  columns,     // split by columns (dim 1): row-parallel c_proj, o_proj, down_proj weights
};

// Beyond the data-parallel reduction (over dp x cp), the ranks whose parts of a
// tensor's gradient are summed after backward.
enum class GradientSum {
  none,              // every rank holding it computed all of it
  piece_holders,     // the tp ranks holding the same piece each computed part of it (a
                     // key/value head shared by several ranks sees only their query heads)
  sequence_shards,   // a norm's gain or bias: under sequence parallelism each tp rank saw
                     // its rows only (summed over tp then)
  pipeline_ends,     // a table held by the first and the last pipeline stage (a tied
                     // embedding: the embedding's part and the head's)
  tp_ranks,          // a per-head weight every tp rank holds whole but sees only its heads
                     // through (Qwen3's q/k norms): summed over tp
};

// Where ZeRO-3 keeps a tensor's gathered values (FSDP's units): gathered around each use,
// in one of two windows (a block), or an end's (the embeddings, the final norm and the
// head): in the windows too where its unit fits one, else gathered after each update and
// kept, as FSDP2 keeps its root module (ParamGradStore::windowed_units decides).
enum class ZeroResidence { gathered_per_use, kept_gathered };

struct Placement {
  Sharding sharding = Sharding::replicated;
  // Distinct pieces over tp (1 when replicated). Fewer than tp: consecutive groups of
  // tp / pieces ranks hold the same piece.
  int pieces = 1;
  int piece = 0;  // the piece this rank holds
  GradientSum gradient_sum = GradientSum::none;
  ZeroResidence zero = ZeroResidence::kept_gathered;
  // This rank's copy is the one that counts (the gradient norm, checkpoints): its piece's
  // first holder, and not the last stage's copy of a tied table.
  bool counted = true;
  bool weight_decay = false;  // decoupled weight decay (matrices and embeddings)
  // It takes part in matrix multiplies (6 N of the model's FLOPs): not a table only
  // looked up (GPT-2's wpe, an untied token embedding).
  bool multiplied = true;
  // The share of the tokens it multiplies: 1, or an expert's K / E (each token reaches K
  // of E experts): the active parameters, what a token's FLOPs count.
  double active = 1.0;
  // One of a mixture's experts, held by one rank of each expert-parallel group: its
  // gradient is summed over the ranks holding the same experts (the expert-data-parallel
  // group), not over all of dp x cp, and ZeRO shards it over them.
  bool expert = false;

  bool sharded() const { return pieces > 1; }
};

}  // namespace trident
