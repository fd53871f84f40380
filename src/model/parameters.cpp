#include "model/parameters.h"

#include "runtime/error.h"

namespace trident {

size_t ParameterTensor::numel() const {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

ParameterLayout::ParameterLayout(const ModelConfig& model, size_t pad_to) {
  const int64_t d = model.d_model, V = model.vocab_size, T = model.seq_len;
  wte_ = add("wte.weight", {V, d}, static_cast<size_t>(model.padded_vocab()) * d);
  wpe_ = add("wpe.weight", {T, d});
  for (int i = 0; i < model.n_layer; i++) {
    const std::string p = "h." + std::to_string(i) + ".";
    BlockParameterIndex b{};
    b.ln_1_weight = add(p + "ln_1.weight", {d});
    b.ln_1_bias = add(p + "ln_1.bias", {d});
    b.c_attn_weight = add(p + "attn.c_attn.weight", {3 * d, d});
    b.c_attn_bias = add(p + "attn.c_attn.bias", {3 * d});
    b.attn_c_proj_weight = add(p + "attn.c_proj.weight", {d, d});
    b.attn_c_proj_bias = add(p + "attn.c_proj.bias", {d});
    b.ln_2_weight = add(p + "ln_2.weight", {d});
    b.ln_2_bias = add(p + "ln_2.bias", {d});
    b.c_fc_weight = add(p + "mlp.c_fc.weight", {4 * d, d});
    b.c_fc_bias = add(p + "mlp.c_fc.bias", {4 * d});
    b.mlp_c_proj_weight = add(p + "mlp.c_proj.weight", {d, 4 * d});
    b.mlp_c_proj_bias = add(p + "mlp.c_proj.bias", {d});
    blocks_.push_back(b);
  }
  ln_f_weight_ = add("ln_f.weight", {d});
  ln_f_bias_ = add("ln_f.bias", {d});
  total_ = (total_ + pad_to - 1) / pad_to * pad_to;
}

int ParameterLayout::add(const std::string& name, std::vector<int64_t> shape, size_t stored) {
  ParameterTensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.offset = total_;
  t.stored = stored != 0 ? stored : t.numel();
  t.weight_decay = t.shape.size() >= 2;
  // Keep every tensor 64-byte aligned for the vector kernels.
  total_ += (t.stored + 15) / 16 * 16;
  tensors_.push_back(std::move(t));
  return static_cast<int>(tensors_.size()) - 1;
}

const ParameterTensor& ParameterLayout::tensor(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw UsageError("no parameter named '" + name + "'");
}

}  // namespace trident
