#include "model/block.h"

#include "kernels/base/error.h"

namespace trident {

void Block::add_branch(std::unique_ptr<Norm> norm, std::unique_ptr<Sublayer> sublayer) {
  branches_.push_back({std::move(norm), std::move(sublayer)});
}

void Block::declare_parameters(ParameterDeclarations& d) {
  check(!branches_.empty(), "a block without a branch");
  for (Branch& b : branches_) {
    b.norm->declare_parameters(d);
    b.sublayer->declare_parameters(d);
  }
}

void Block::declare_activations(ActivationDeclarations& a) {
  a.set_recompute_group(0);  // every block's buffers at the same places of one shared set
  for (size_t i = 0; i < branches_.size(); i++) {
    Branch& b = branches_[i];
    b.norm->declare_activations(a);
    b.sublayer->declare_activations(a);
    // The block's output is kept under every mode (the next block's input); the stream
    // between branches is rerun under full recomputation.
    const bool last = i + 1 == branches_.size();
    b.output = a.keep(a.shape().rows() * C_, Element::act, last ? Retention::always : Retention::dropped_by_full);
  }
}

void Block::forward(LayerRuntime& r, const Pass& p, const Act* input, bool up_to_last_output) {
  const size_t n = static_cast<size_t>(r.regions.rows(p.B)) * C_;
  const Act* x = input;
  for (size_t i = 0; i < branches_.size(); i++) {
    Branch& b = branches_[i];
    const bool stop = up_to_last_output && i + 1 == branches_.size();
    Act* out = r.kept(p.slot, b.output);
    b.sublayer->forward(r, p, b.norm->forward(r, p, x), out, /*output_needed=*/!stop);
    if (stop) return;
    r.k.add(out, out, x, n);  // the skip connection
    x = out;
  }
}

void Block::backward(LayerRuntime& r, const Pass& p, const Act* input, Act* dresidual) {
  for (size_t i = branches_.size(); i-- > 0;) {
    Branch& b = branches_[i];
    const Act* x = branch_input(r, p.slot, i, input);
    const Act* dnormed = b.sublayer->backward(r, p, b.norm->output(r, p.slot), dresidual, r.kept(p.slot, b.output));
    b.norm->backward(r, p, dnormed, x, dresidual);  // adds to the skip connection's part
    if (i > 0) r.store.progress_gathers();
  }
}

void Block::weight_gradients(LayerRuntime& r, const Pass& p) {
  for (size_t i = branches_.size(); i-- > 0;) {
    Branch& b = branches_[i];
    b.sublayer->weight_gradients(r, p, b.norm->output(r, p.slot), r.kept(p.slot, b.output));
    b.norm->weight_gradients(r, p);
  }
}

void Block::recompute_selective(LayerRuntime& r, const Pass& p) {
  for (Branch& b : branches_) b.sublayer->recompute_selective(r, p);
}

}  // namespace trident
