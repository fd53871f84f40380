// A norm over the residual stream's width: LayerNorm (a gain and a bias, the biased
// variance) or RMSNorm (a gain). Its gain's and bias's gradients sum over the rows; under
// sequence parallelism each tp rank sees only its rows, so they are summed over tp
// (their placement's sp axis: model/placement.h). In a block it runs on the residual
// stream before a branch's sublayer (pre-norm), or on the sublayer's output (post-norm:
// OLMo-2); the final norm before the head.
#pragma once

#include <string>

#include "model/layers/layer.h"

namespace trident {

class Norm : public Layer {
 public:
  // name: of its tensors, "<name>.weight" (and "<name>.bias" for LayerNorm).
  Norm(NormKind kind, std::string name, int width, double eps) : kind_(kind), name_(std::move(name)), C_(width),
                                                                  eps_(static_cast<float>(eps)) {}

  void declare_parameters(ParameterDeclarations& d) override;
  void declare_activations(ActivationDeclarations& a) override;

  // Normalizes this rank's rows of `in` into its output buffer; returns it.
  const kernels::Act* forward(LayerRuntime& r, const Pass& p, const kernels::Act* in) const;
  kernels::Act* output(const LayerRuntime& r, int slot) const { return r.kept(slot, out_); }
  // din += d(norm) / d(in) of dout (din is the residual stream's gradient: the skip
  // connection's part is there already); the gain's and bias's gradients, or under
  // p.defer their stash, for weight_gradients().
  void backward(LayerRuntime& r, const Pass& p, const kernels::Act* dout, const kernels::Act* in,
                kernels::Act* din) const;
  void weight_gradients(LayerRuntime& r, const Pass& p) const;

 private:
  bool layernorm() const { return kind_ == NormKind::layernorm; }
  NormKind kind_;
  std::string name_;
  int C_;
  float eps_;
  int weight_ = -1, bias_ = -1;
  int out_ = -1, mean_ = -1, rstd_ = -1, stash_ = -1;  // kept buffers (stash: deferred gradients [2, C])
};

}  // namespace trident
