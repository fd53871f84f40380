// The MLP, Megatron-style over tp: a column-parallel input projection (GPT-2's c_fc, or
// SwiGLU's gate | up read side by side), the activation (GELU, or SwiGLU: silu(gate) *
// up), and a row-parallel output projection (c_proj, down_proj).
#pragma once

#include <string>
#include <vector>

#include "model/layers/parallel_linear.h"

namespace trident {

struct MlpOptions {
  MlpKind activation = MlpKind::gelu;
  std::vector<std::string> in;  // the input projection [ffn, d]: one (GELU), or gate and up (SwiGLU)
  std::string out;              // the output projection [d, ffn]
  int d_model = 0, ffn = 0;
  bool bias = false;
};

class Mlp : public Sublayer {
 public:
  explicit Mlp(MlpOptions o);

  void declare_parameters(ParameterDeclarations& d) override;
  void declare_activations(ActivationDeclarations& a) override;
  void forward(LayerRuntime& r, const Pass& p, const Act* in, Act* out, bool output_needed = true) override;
  const Act* backward(LayerRuntime& r, const Pass& p, const Act* in, const Act* dout, Act* out) override;
  void weight_gradients(LayerRuntime& r, const Pass& p, const Act* in, Act* out) override;

 private:
  bool swiglu() const { return o_.activation == MlpKind::swiglu; }
  MlpOptions o_;
  ColumnParallelLinear in_;
  RowParallelLinear out_;
  int fc_ = -1, fc_act_ = -1;  // kept: the input projection's output, the activation's
  Act *dfc_ = nullptr, *dfc_act_ = nullptr, *dinput_ = nullptr;  // backward's scratch
};

}  // namespace trident
