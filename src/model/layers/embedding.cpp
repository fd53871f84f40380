#include "model/layers/embedding.h"

namespace trident {

void Embedding::declare_parameters(ParameterDeclarations& d) {
  const int tp = d.tp_size();
  const int64_t padded = (static_cast<int64_t>(o_.vocab) + 64 * tp - 1) / (64 * tp) * (64 * tp);
  tokens_ = d.add({.name = o_.tokens,
                   .shape = {o_.vocab, o_.d_model},
                   .sharding = Sharding::rows,
                   .pieces = tp,
                   .init = Init::normal,
                   .padded_rows = padded,
                   .multiplied = o_.tied,
                   // A tied table: its gradient's parts from the embedding and the head.
                   .summed_over = o_.tied ? kDataParallel | AxisSet{MeshAxis::pp_ends} : kDataParallel});
  vocab_shard_ = static_cast<int>(padded / tp);
  vocab_start_ = d.tp_rank() * vocab_shard_;
  if (!o_.positions.empty() && !o_.table_only)
    positions_ = d.add({.name = o_.positions, .shape = {o_.seq_len, o_.d_model}, .init = Init::normal,
                        .multiplied = false});
}

void Embedding::declare_activations(ActivationDeclarations& a) {
  if (o_.table_only) return;
  const ActivationShape& s = a.shape();
  token_ids_ = a.keep(s.tokens(), Element::i32);
  out_ = a.keep(s.rows() * o_.d_model, Element::act);
  host_tokens_.resize(s.slots);
}

void Embedding::load(LayerRuntime& r, const Pass& p, const int32_t* tokens) {
  const size_t BT = static_cast<size_t>(p.B) * r.T;
  r.k.upload(r.kept<int32_t>(p.slot, token_ids_), tokens, BT * sizeof(int32_t));
  host_tokens_.at(p.slot).assign(tokens, tokens + BT);
}

void Embedding::forward(LayerRuntime& r, const Pass& p) const {
  const int B = p.B, T = r.T, C = o_.d_model;
  const int32_t* tokens = r.kept<int32_t>(p.slot, token_ids_);
  Act* out = output(r, p.slot);
  TensorParallel& tp = r.tp();
  if (tp.sequence_parallel()) {
    // The partial sums of all rows, positions added once (rank 0), each rank's rows summed.
    Act* partial = r.regions.gathered;
    r.k.embedding_forward(partial, tokens, r.weight(tokens_), vocab_start_, vocab_shard_, B, T, C);
    if (positions_ >= 0 && tp.rank() == 0) r.k.add_positions(partial, r.weight(positions_), r.positions, B, T, C);
    tp.scatter_sequence(r.regions.all_rows(partial, B), r.regions.rows_of(out, B));
    return;
  }
  r.k.embedding_forward(out, tokens, r.weight(tokens_), vocab_start_, vocab_shard_, B, T, C);
  tp.sum_embedding_shards(r.regions.all_rows(out, B));
  if (positions_ >= 0) r.k.add_positions(out, r.weight(positions_), r.positions, B, T, C);
}

void Embedding::backward(LayerRuntime& r, const Pass& p, const Act* dout) const {
  // A tied table's gradient has the head's part and now the embedding's (all rows).
  const Act* dall = r.regions.gathered_rows(dout, p.B);
  r.k.embedding_backward(r.grad(tokens_), dall, r.kept<int32_t>(p.slot, token_ids_), host_tokens_.at(p.slot).data(),
                         vocab_start_, vocab_shard_, p.B, r.T, o_.d_model);
  if (positions_ >= 0) r.k.positions_backward(r.grad(positions_), dall, r.positions, p.B, r.T, o_.d_model);
}

}  // namespace trident
