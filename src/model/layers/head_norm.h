// RMSNorm of each attention head's vector, over its head_dim (Qwen3's q_norm and k_norm,
// before the rotary embedding): one gain [head_dim] for all heads of q (or of k). It runs
// on the q (or k) columns of attention's qkv rows, through a copy into rows of head_dim
// (the norm kernels' layout). Each tp rank holds the whole gain but sees only its heads:
// its gradient is summed over tp (its placement says so). Attention's per-head q/k norm
// slot (qk_norm.h).
#pragma once

#include <string>

#include "model/layers/qk_norm.h"

namespace trident {

class HeadNorm : public QkNorm {
 public:
  // name: of its gain, "<name>.weight".
  HeadNorm(std::string name, int head_dim, double eps) : name_(std::move(name)), hd_(head_dim), eps_(static_cast<float>(eps)) {}

  void declare_parameters(ParameterDeclarations& d) override;
  void declare_activations(ActivationDeclarations& a, int heads, int column, int row_width) override;
  void forward(LayerRuntime& r, const Pass& p, Act* qkv) const override;
  void backward(LayerRuntime& r, const Pass& p, Act* dqkv) const override;
  void weight_gradients(LayerRuntime& r, const Pass& p) const override;

 private:
  std::string name_;
  int hd_;
  float eps_;
  int weight_ = -1;
  int heads_ = 0, column_ = 0, row_width_ = 0;
  int input_ = -1, rstd_ = -1, stash_ = -1;  // kept
  Act *a_ = nullptr, *b_ = nullptr;           // backward's (and forward's) scratch: rows of head_dim
};

}  // namespace trident
