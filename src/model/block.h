// A transformer block: residual branches, each x += post_norm(sublayer(pre_norm(x))) in
// turn, either norm optional (GPT-2's and Llama's: pre-norm attention, then the MLP;
// OLMo-2's: post-norm ones). Its family builds it (model/families/); it declares its
// branches' tensors and activations and its residual stream's buffers, and runs them:
// forward, backward (the skip connections pass the residual gradient through, each
// branch adds to it), and zb1's weight half.
#pragma once

#include <memory>
#include <vector>

#include "model/layers/norm.h"

namespace trident {

class Block {
 public:
  using Act = kernels::Act;

  explicit Block(int width) : C_(width) {}  // the residual stream's
  // A branch: the sublayer, with a norm before it (pre-norm) and/or after it (post-norm); null: none.
  void add_branch(std::unique_ptr<Norm> pre_norm, std::unique_ptr<Sublayer> sublayer,
                  std::unique_ptr<Norm> post_norm = nullptr);

  void declare_parameters(ParameterDeclarations& d);
  // Its buffers share the recompute set with every other block's (model/activations.h).
  void declare_activations(ActivationDeclarations& a);

  // The block on `input` (this rank's rows), its output in output(slot). up_to_last_output:
  // stop before the last branch's output projection (full recomputation: the output is
  // kept), or after its post-norm when it has one (whose backward needs its input).
  void forward(LayerRuntime& r, const Pass& p, const Act* input, bool up_to_last_output = false);
  Act* output(const LayerRuntime& r, int slot) const { return r.kept(slot, branches_.back().output); }
  // dresidual holds d loss / d output on entry, and d loss / d input on return.
  void backward(LayerRuntime& r, const Pass& p, const Act* input, Act* dresidual);
  // The weight gradients a deferred backward (p.defer) left for later (`input` as backward's).
  void weight_gradients(LayerRuntime& r, const Pass& p, const Act* input);
  // Selective recomputation: what the branches dropped, rebuilt before backward.
  void recompute_selective(LayerRuntime& r, const Pass& p);
  // Its sublayers' buffers after a step (Layer::update_buffers).
  void update_buffers(LayerRuntime& r, const StepFigures& figures) {
    for (Branch& b : branches_) b.sublayer->update_buffers(r, figures);
  }
  // Its attention's shared pieces, from the stage's context (Sublayer::attach).
  void attach(AttentionContext& context);

 private:
  struct Branch {
    std::unique_ptr<Norm> pre_norm, post_norm;
    std::unique_ptr<Sublayer> sublayer;
    int output = -1;             // kept: the residual stream after the branch
    int sublayer_output = -1;    // kept with a post-norm: the sublayer's output, its input
  };
  // The residual stream entering branch i.
  const Act* branch_input(const LayerRuntime& r, int slot, size_t i, const Act* input) const {
    return i == 0 ? input : r.kept(slot, branches_[i - 1].output);
  }
  // What branch b's sublayer reads (its pre-norm's output, or the stream x itself) and
  // where it writes (the post-norm's input, or the branch's output).
  const Act* sublayer_input(const LayerRuntime& r, int slot, const Branch& b, const Act* x) const {
    return b.pre_norm ? b.pre_norm->output(r, slot) : x;
  }
  Act* sublayer_output(const LayerRuntime& r, int slot, const Branch& b) const {
    return r.kept(slot, b.post_norm ? b.sublayer_output : b.output);
  }
  int C_;
  Act* dpost_norm_ = nullptr;  // backward's scratch with a post-norm: d loss / d sublayer output
  std::vector<Branch> branches_;
};

}  // namespace trident
