// Attention's q/k norm slot: a norm of the q (or k) columns of attention's qkv rows, in
// place, after the projection and before the rotary embedding. Two kinds: each head's
// vector over head_dim (Qwen3: head_norm.h), or the whole projection's width (OLMo-2:
// width_norm.h, an RMS whose sum runs over every tp rank's heads).
#pragma once

#include "model/layers/layer.h"

namespace trident {

enum class QkNormKind { none, per_head, full_width };

class QkNorm {
 public:
  using Act = kernels::Act;
  virtual ~QkNorm() = default;

  virtual void declare_parameters(ParameterDeclarations& d) = 0;
  // heads: this rank's; their columns start at `column` of qkv rows `row_width` wide.
  virtual void declare_activations(ActivationDeclarations& a, int heads, int column, int row_width) = 0;

  // The heads' columns of qkv normalized in place (what backward needs kept).
  virtual void forward(LayerRuntime& r, const Pass& p, Act* qkv) const = 0;
  // The same columns of dqkv: d loss / d output in, d loss / d input out; the gain's
  // gradient, or under p.defer its stash.
  virtual void backward(LayerRuntime& r, const Pass& p, Act* dqkv) const = 0;
  virtual void weight_gradients(LayerRuntime& r, const Pass& p) const = 0;
};

}  // namespace trident
