// The token embedding, vocabulary-parallel (each tp rank holds a shard of the table's rows:
// a token's row comes from the shard that owns it, summed over tp), and the learned
// position table if the family has one (GPT-2's wpe; rotary positions are attention's).
// A head tied to the token table reads it too: then the table is held by the first and
// the last pipeline stage, whose parts of its gradient are summed between them; on the
// last stage the layer is the table alone (a copy that does not count).
#pragma once

#include <string>
#include <vector>

#include "model/layers/layer.h"

namespace trident {

struct EmbeddingOptions {
  std::string tokens;     // the token table [vocab, d]
  std::string positions;  // the position table [seq_len, d]; "" without
  int vocab = 0, d_model = 0, seq_len = 0;
  bool tied = false;       // the head reads the token table
  bool table_only = false;  // the last stage's copy of a tied table: no pass runs here
};

class Embedding : public Layer {
 public:
  using Act = kernels::Act;
  explicit Embedding(EmbeddingOptions o) : o_(std::move(o)) {}

  void declare_parameters(ParameterDeclarations& d) override;
  void declare_activations(ActivationDeclarations& a) override;

  // Takes the micro-batch's tokens [B, T] (host memory) to the device, without waiting.
  void load(LayerRuntime& r, const Pass& p, const int32_t* tokens);
  // The embedded tokens (their positions added) into output(slot): this rank's rows.
  void forward(LayerRuntime& r, const Pass& p) const;
  Act* output(const LayerRuntime& r, int slot) const { return r.kept(slot, out_); }
  // The tables' gradients from dout (this rank's rows of d loss / d output).
  void backward(LayerRuntime& r, const Pass& p, const Act* dout) const;
  int token_table() const { return tokens_; }  // its index in the layout (a tied head's weight)

 private:
  EmbeddingOptions o_;
  int tokens_ = -1, positions_ = -1;
  int vocab_shard_ = 0, vocab_start_ = 0;  // this rank's rows of the table
  int token_ids_ = -1, out_ = -1;          // kept: the tokens on the device, the output
  std::vector<std::vector<int32_t>> host_tokens_;  // per slot: the same ids in host memory
};

}  // namespace trident
