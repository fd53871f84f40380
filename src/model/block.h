// A transformer block: pre-norm residual branches, x += sublayer(norm(x)) for each in
// turn (GPT-2's and Llama's: attention, then the MLP). Its family builds it
// (model/families/); it declares its branches' tensors and activations and its residual
// stream's buffers, and runs them: forward, backward (the skip connections pass the
// residual gradient through, each branch adds to it), and zb1's weight half.
#pragma once

#include <memory>
#include <vector>

#include "model/layers/norm.h"

namespace trident {

class Block {
 public:
  using Act = kernels::Act;

  explicit Block(int width) : C_(width) {}  // the residual stream's
  void add_branch(std::unique_ptr<Norm> norm, std::unique_ptr<Sublayer> sublayer);

  void declare_parameters(ParameterDeclarations& d);
  // Its buffers share the recompute set with every other block's (model/activations.h).
  void declare_activations(ActivationDeclarations& a);

  // The block on `input` (this rank's rows), its output in output(slot). up_to_last_output:
  // stop before the last branch's output projection (full recomputation: the output is kept).
  void forward(LayerRuntime& r, const Pass& p, const Act* input, bool up_to_last_output = false);
  Act* output(const LayerRuntime& r, int slot) const { return r.kept(slot, branches_.back().output); }
  // dresidual holds d loss / d output on entry, and d loss / d input on return.
  void backward(LayerRuntime& r, const Pass& p, const Act* input, Act* dresidual);
  // The weight gradients a deferred backward (p.defer) left for later.
  void weight_gradients(LayerRuntime& r, const Pass& p);
  // Selective recomputation: what the branches dropped, rebuilt before backward.
  void recompute_selective(LayerRuntime& r, const Pass& p);

 private:
  struct Branch {
    std::unique_ptr<Norm> norm;
    std::unique_ptr<Sublayer> sublayer;
    int output = -1;  // kept: the residual stream after the branch
  };
  // The residual stream entering branch i.
  const Act* branch_input(const LayerRuntime& r, int slot, size_t i, const Act* input) const {
    return i == 0 ? input : r.kept(slot, branches_[i - 1].output);
  }
  int C_;
  std::vector<Branch> branches_;
};

}  // namespace trident
