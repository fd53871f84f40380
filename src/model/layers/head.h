// The language-model head, vocabulary-parallel: this rank's logits are x @ table_shard^T
// (its rows of the vocabulary; a tied head reads the token embedding's table), and the
// softmax cross-entropy over the whole vocabulary is assembled from per-shard maxima and
// sums (Megatron's vocab-parallel cross-entropy). The padded columns are masked.
#pragma once

#include <string>
#include <vector>

#include "model/layers/layer.h"

namespace trident {

struct HeadOptions {
  std::string table;  // its weight [vocab, d]; with `tied`, the token embedding's
  int vocab = 0, d_model = 0;
  bool tied = false;
};

class Head : public Layer {
 public:
  using Act = kernels::Act;
  explicit Head(HeadOptions o) : o_(std::move(o)) {}

  void declare_parameters(ParameterDeclarations& d) override;
  void declare_activations(ActivationDeclarations& a) override;

  // Takes the micro-batch's targets [B, T] (host memory) to the device, without waiting.
  void load(LayerRuntime& r, const Pass& p, const int32_t* targets);
  // The token losses of `in` (this rank's rows of the final norm's output), their sum
  // added to r.loss_sum on the device (no host synchronization).
  void forward(LayerRuntime& r, const Pass& p, const Act* in) const;
  // d(loss_scale * sum of token losses) / d in: returns where this rank's rows are; the
  // table's gradient unless p.defer.
  const Act* backward(LayerRuntime& r, const Pass& p, float loss_scale, const Act* in) const;
  void weight_gradients(LayerRuntime& r, const Pass& p, const Act* in) const;
  // After forward: this rank's shard of the logits of sequence b, position t.
  const Act* logits(const LayerRuntime& r, int slot, size_t row) const;
  int vocab_shard() const { return vocab_shard_; }

 private:
  HeadOptions o_;
  int table_ = -1;
  int vocab_shard_ = 0, vocab_start_ = 0, vocab_valid_ = 0;  // this rank's columns, and its real ones
  int targets_ = -1, logits_ = -1, losses_ = -1, row_max_ = -1, sum_and_target_ = -1, lse_ = -1;  // kept
  Act* dinput_ = nullptr;
};

}  // namespace trident
