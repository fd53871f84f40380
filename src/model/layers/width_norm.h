// RMSNorm of q (or k) over the whole projection's width, n_heads * head_dim (OLMo-2's
// q_norm and k_norm, before the split into heads and the rotary embedding): one gain of
// that width. Under tp each rank holds only its heads' columns, and a row's RMS is over
// all of them: each rank gathers the rows whole (an all-gather over tp), normalizes them
// as one rank would and keeps its own columns; backward gathers the output's gradient the
// same way (the row's dot product with the input runs over every rank's columns). Each
// rank holds the whole gain and adds only its columns' gradient (summed over tp, as its placement says).
// When tp exceeds the key/value heads, ranks share a piece of k: the gathered gradient
// sums their parts, and the first rank of each group returns the piece's whole input
// gradient (the others zero), as its projection's gradients are summed over the group.
#pragma once

#include <string>

#include "model/layers/qk_norm.h"

namespace trident {

class WidthNorm : public QkNorm {
 public:
  // name: of its gain, "<name>.weight"; heads: all of them (over every tp rank).
  WidthNorm(std::string name, int heads, int head_dim, double eps)
      : name_(std::move(name)), W_(heads * head_dim), hd_(head_dim), eps_(static_cast<float>(eps)) {}

  void declare_parameters(ParameterDeclarations& d) override;
  void declare_activations(ActivationDeclarations& a, int heads, int column, int row_width) override;
  void forward(LayerRuntime& r, const Pass& p, Act* qkv) const override;
  void backward(LayerRuntime& r, const Pass& p, Act* dqkv) const override;
  void weight_gradients(LayerRuntime& r, const Pass& p) const override;

 private:
  // The rows of this rank's columns (`columns`, rows row_width_ apart) gathered whole
  // into `whole` [BT, W]: each piece's columns (its holders' summed when `sum_holders`).
  void gather_rows(LayerRuntime& r, int BT, const Act* columns, Act* whole, bool sum_holders) const;
  bool holds_gradient() const { return tp_rank_ % holders_ == 0; }  // the first of its piece's holders
  std::string name_;
  int W_, hd_;  // the whole width, a head's
  float eps_;
  int weight_ = -1;
  int tp_rank_ = 0, tp_ = 1, holders_ = 1;  // holders: the tp ranks that hold each piece
  int width_ = 0, column_ = 0, row_width_ = 0;  // this rank's columns of the qkv rows
  int input_ = -1, rstd_ = -1, stash_ = -1;     // kept: the rows whole, their 1/rms, deferred gradient
  Act *gathered_ = nullptr, *a_ = nullptr, *b_ = nullptr;  // scratch: tp blocks of this rank's columns; rows whole
  float* dweight_ = nullptr;                               // scratch: the whole gain's gradient
};

}  // namespace trident
