#include "model/block.h"

#include "kernels/base/error.h"

namespace trident {

void Block::add_branch(std::unique_ptr<Norm> pre_norm, std::unique_ptr<Sublayer> sublayer,
                       std::unique_ptr<Norm> post_norm) {
  Branch b;
  b.pre_norm = std::move(pre_norm);
  b.sublayer = std::move(sublayer);
  b.post_norm = std::move(post_norm);
  branches_.push_back(std::move(b));
}

void Block::declare_parameters(ParameterDeclarations& d) {
  check(!branches_.empty(), "a block without a branch");
  for (Branch& b : branches_) {
    if (b.pre_norm) b.pre_norm->declare_parameters(d);
    b.sublayer->declare_parameters(d);
    if (b.post_norm) b.post_norm->declare_parameters(d);
  }
}

void Block::declare_activations(ActivationDeclarations& a) {
  a.set_recompute_group(0);  // every block's buffers at the same places of one shared set
  const size_t stream = a.shape().rows() * C_;
  for (size_t i = 0; i < branches_.size(); i++) {
    Branch& b = branches_[i];
    if (b.pre_norm) b.pre_norm->declare_activations(a);
    b.sublayer->declare_activations(a);
    if (b.post_norm) {
      b.sublayer_output = a.keep(stream, Element::act, Retention::dropped_by_full);
      b.post_norm->declare_activations(a);
      a.scratch(dpost_norm_, "d post-norm", stream, Element::act);
    }
    // The block's output is kept under every mode (the next block's input); the stream
    // between branches is rerun under full recomputation.
    const bool last = i + 1 == branches_.size();
    b.output = a.keep(stream, Element::act, last ? Retention::always : Retention::dropped_by_full);
  }
}

void Block::forward(LayerRuntime& r, const Pass& p, const Act* input, bool up_to_last_output) {
  const size_t n = static_cast<size_t>(r.regions.rows(p.B)) * C_;
  const Act* x = input;
  for (size_t i = 0; i < branches_.size(); i++) {
    Branch& b = branches_[i];
    const bool last = up_to_last_output && i + 1 == branches_.size();
    const Act* in = b.pre_norm ? b.pre_norm->forward(r, p, x) : x;
    Act* y = sublayer_output(r, p.slot, b);
    b.sublayer->forward(r, p, in, y, /*output_needed=*/!last || b.post_norm != nullptr);
    const Act* added = b.post_norm ? b.post_norm->forward(r, p, y) : y;
    if (last) return;
    Act* out = r.kept(p.slot, b.output);
    r.k.add(out, added, x, n);  // the skip connection
    x = out;
  }
}

void Block::backward(LayerRuntime& r, const Pass& p, const Act* input, Act* dresidual) {
  const size_t n = static_cast<size_t>(r.regions.rows(p.B)) * C_;
  for (size_t i = branches_.size(); i-- > 0;) {
    Branch& b = branches_[i];
    const Act* x = branch_input(r, p.slot, i, input);
    const Act* dy = dresidual;  // d loss / d (the sublayer's output)
    if (b.post_norm) {
      r.k.fill_zero(dpost_norm_, r.k.activation_bytes(n));  // the norm's backward adds into it
      b.post_norm->backward(r, p, dresidual, sublayer_output(r, p.slot, b), dpost_norm_);
      dy = dpost_norm_;
    }
    const Act* din = b.sublayer->backward(r, p, sublayer_input(r, p.slot, b, x), dy, sublayer_output(r, p.slot, b));
    if (b.pre_norm)
      b.pre_norm->backward(r, p, din, x, dresidual);  // adds to the skip connection's part
    else
      r.k.add(dresidual, dresidual, din, n);
    if (i > 0) r.store.progress_gathers();
  }
}

void Block::weight_gradients(LayerRuntime& r, const Pass& p, const Act* input) {
  for (size_t i = branches_.size(); i-- > 0;) {
    Branch& b = branches_[i];
    if (b.post_norm) b.post_norm->weight_gradients(r, p);
    const Act* x = branch_input(r, p.slot, i, input);
    b.sublayer->weight_gradients(r, p, sublayer_input(r, p.slot, b, x), sublayer_output(r, p.slot, b));
    if (b.pre_norm) b.pre_norm->weight_gradients(r, p);
  }
}

void Block::recompute_selective(LayerRuntime& r, const Pass& p) {
  for (Branch& b : branches_) b.sublayer->recompute_selective(r, p);
}

void Block::attach(AttentionContext& context) {
  for (Branch& b : branches_) b.sublayer->attach(context);
}

}  // namespace trident
