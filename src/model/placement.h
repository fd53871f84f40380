// Where a parameter lives over the mesh and how its gradient is completed, as its layer
// declares it (model/layers/): one placement per tensor, over the named axes of
// parallel/mesh_axes.h, read by everyone who needs to know (the layout, the optimizer, data
// parallelism, the gradient norm, checkpoints, the replica check, the memory plan), none
// of whom asks what kind of tensor it is. On each axis a tensor is
//   sharded     its ranks hold different parts: tp (cut as `sharding` says), ep (an
//               expert lives on one rank of each ep group), pp (each stage its own layers);
//   replicated  its ranks hold the same values: the rest. Of those, the axes in `summed_over`
//               see different tokens (or rows, or heads) and each computes a part of the
//               gradient: it is summed over them after backward, and ZeRO shards it over
//               the data-parallel ones. The first rank of a replicated set is the one
//               whose copy counts (a norm's sum, a checkpoint's writer).
#pragma once

#include "parallel/mesh_axes.h"

namespace trident {

// The data-parallel axes of a tensor that every rank of dp x cp holds.
inline constexpr AxisSet kDataParallel = {MeshAxis::dp, MeshAxis::cp};

// How a tensor is cut over the tensor-parallel ranks (Megatron's layout).
enum class Sharding {
  replicated,  // every tp rank holds all of it (norms, wpe, row-parallel biases)
  rows,        // split by rows (dim 0): column-parallel q/k/v, c_fc, gate/up; vocabulary-parallel tables
  qkv_rows,    // GPT-2's fused c_attn: rows split within each of the q, k, v blocks (heads over tp)
  columns,     // split by columns (dim 1): row-parallel c_proj, o_proj, down_proj weights
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
  // Beyond tp's cut and pp's stages: the axes it is sharded over (ep for an expert).
  AxisSet sharded_over;
  // The axes its gradient is summed over: data parallelism's (dp x cp; an expert's, the
  // ranks holding it: edp), and where the layer says so sp (a norm under sequence
  // parallelism sees its rows), tp (a per-head weight each rank sees its heads through),
  // pp_ends (a tied table: the embedding's part and the head's); tp_piece when fewer
  // pieces than tp ranks (a shared key/value head sees only each rank's query heads).
  AxisSet summed_over = kDataParallel;
  ZeroResidence zero = ZeroResidence::kept_gathered;
  // This rank's copy is the one that counts (the gradient norm, checkpoints): the first
  // rank of its replicated set over tp and pp (its piece's first holder; a tied table's
  // first stage).
  bool counted = true;
  bool weight_decay = false;  // decoupled weight decay (matrices and embeddings)
  // A block's matrix over the hidden states (TensorDeclaration::hidden_matrix): an
  // optimizer that updates whole matrices (Muon) takes these, owned round robin.
  bool hidden_matrix = false;
  // It takes part in matrix multiplies (6 N of the model's FLOPs): not a table only
  // looked up (GPT-2's wpe, an untied token embedding).
  bool multiplied = true;
  // The share of the tokens it multiplies: 1, or an expert's K / E (each token reaches K
  // of E experts): the active parameters, what a token's FLOPs count.
  double active = 1.0;
  // The axes data parallelism sums its gradient over, and ZeRO shards it over.
  AxisSet data_axes() const { return summed_over & kDataAxes; }
  // The axes its gradient is summed over besides: before the data-parallel sum (pp_ends)
  // and after it (tp, tp_piece, sp: on the reduced values each rank owns).
  AxisSet model_sums() const { return summed_over - kDataAxes; }

  bool sharded() const { return pieces > 1; }
};

}  // namespace trident
