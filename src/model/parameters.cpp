#include "model/parameters.h"

#include <algorithm>

#include "runtime/error.h"

namespace trident {

size_t ParameterTensor::numel() const {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

ParameterLayout::ParameterLayout(const ModelConfig& model, int tp_rank, int tp_size, size_t pad_to,
                                 const StageSpec& stage)
    : first_layer_(stage.first_layer), tp_rank_(tp_rank), tp_size_(tp_size) {
  const int64_t d = model.d_model, V = model.vocab_size, T = model.seq_len;
  check(model.n_head % tp_size == 0 && d % tp_size == 0, "tp must divide the heads");
  const int last_layer = stage.layers < 0 ? model.n_layer : stage.first_layer + stage.layers;
  check(stage.first_layer >= 0 && last_layer <= model.n_layer, "stage layers out of range");
  if (stage.has_embedding || stage.has_head) wte_ = add("wte.weight", {V, d}, Sharding::rows, model.padded_vocab(tp_size));
  if (stage.has_embedding) wpe_ = add("wpe.weight", {T, d}, Sharding::replicated);
  for (int i = stage.first_layer; i < last_layer; i++) {
    const std::string p = "h." + std::to_string(i) + ".";
    BlockParameterIndex b{};
    b.ln_1_weight = add(p + "ln_1.weight", {d}, Sharding::replicated);
    b.ln_1_bias = add(p + "ln_1.bias", {d}, Sharding::replicated);
    b.c_attn_weight = add(p + "attn.c_attn.weight", {3 * d, d}, Sharding::qkv_rows);
    b.c_attn_bias = add(p + "attn.c_attn.bias", {3 * d}, Sharding::qkv_rows);
    b.attn_c_proj_weight = add(p + "attn.c_proj.weight", {d, d}, Sharding::columns);
    b.attn_c_proj_bias = add(p + "attn.c_proj.bias", {d}, Sharding::replicated);
    b.ln_2_weight = add(p + "ln_2.weight", {d}, Sharding::replicated);
    b.ln_2_bias = add(p + "ln_2.bias", {d}, Sharding::replicated);
    b.c_fc_weight = add(p + "mlp.c_fc.weight", {4 * d, d}, Sharding::rows);
    b.c_fc_bias = add(p + "mlp.c_fc.bias", {4 * d}, Sharding::rows);
    b.mlp_c_proj_weight = add(p + "mlp.c_proj.weight", {d, 4 * d}, Sharding::columns);
    b.mlp_c_proj_bias = add(p + "mlp.c_proj.bias", {d}, Sharding::replicated);
    blocks_.push_back(b);
  }
  if (stage.has_head) {
    ln_f_weight_ = add("ln_f.weight", {d}, Sharding::replicated);
    ln_f_bias_ = add("ln_f.bias", {d}, Sharding::replicated);
  }
  total_ = (total_ + pad_to - 1) / pad_to * pad_to;
}

int ParameterLayout::add(const std::string& name, std::vector<int64_t> shape, Sharding sharding,
                         int64_t padded_rows) {
  ParameterTensor t;
  t.name = name;
  t.shape = shape;
  t.padded_shape = shape;
  if (padded_rows > 0) t.padded_shape[0] = padded_rows;
  t.sharding = sharding;
  t.offset = total_;
  size_t padded = 1;
  for (int64_t s : t.padded_shape) padded *= static_cast<size_t>(s);
  t.stored = sharding == Sharding::replicated ? padded : padded / tp_size_;
  t.weight_decay = shape.size() >= 2;
  // Keep every tensor 64-byte aligned for the vector kernels.
  total_ += (t.stored + 15) / 16 * 16;
  tensors_.push_back(std::move(t));
  return static_cast<int>(tensors_.size()) - 1;
}

template <typename F>
void ParameterLayout::for_each_shard_row(const ParameterTensor& t, int r, F copy) const {
  const int64_t rows = t.padded_shape[0], columns = t.padded_shape.size() > 1 ? t.padded_shape[1] : 1;
  const int P = tp_size_;
  switch (t.sharding) {
    case Sharding::replicated:
      for (int64_t i = 0; i < rows; i++) copy(i, i, 0, columns);
      break;
    case Sharding::rows:
      for (int64_t i = 0; i < rows / P; i++) copy(r * (rows / P) + i, i, 0, columns);
      break;
    case Sharding::qkv_rows: {  // [q | k | v], each `rows/3` rows; my heads of each
      const int64_t block = rows / 3, mine = block / P;
      for (int64_t part = 0; part < 3; part++)
        for (int64_t i = 0; i < mine; i++) copy(part * block + r * mine + i, part * mine + i, 0, columns);
      break;
    }
    case Sharding::columns:
      for (int64_t i = 0; i < rows; i++) copy(i, i, r * (columns / P), columns / P);
      break;
  }
}

std::vector<float> ParameterLayout::shard_of(const ParameterTensor& t, const float* full) const {
  const int64_t full_rows = t.shape[0], full_columns = t.padded_shape.size() > 1 ? t.padded_shape[1] : 1;
  std::vector<float> shard(t.stored, 0.0f);
  const int64_t shard_columns = t.sharding == Sharding::columns ? full_columns / tp_size_ : full_columns;
  for_each_shard_row(t, tp_rank_, [&](int64_t full_row, int64_t shard_row, int64_t first, int64_t n) {
    if (full_row >= full_rows) return;  // padding rows stay zero
    std::copy_n(full + full_row * full_columns + first, n, shard.begin() + shard_row * shard_columns);
  });
  return shard;
}

std::vector<float> ParameterLayout::assemble(const ParameterTensor& t, const std::vector<float>& all_shards) const {
  const int64_t full_rows = t.shape[0], full_columns = t.padded_shape.size() > 1 ? t.padded_shape[1] : 1;
  const int64_t shard_columns = t.sharding == Sharding::columns ? full_columns / tp_size_ : full_columns;
  std::vector<float> full(t.numel());
  const int shards = t.sharded() ? tp_size_ : 1;
  for (int r = 0; r < shards; r++) {
    const float* shard = all_shards.data() + r * t.stored;
    for_each_shard_row(t, r, [&](int64_t full_row, int64_t shard_row, int64_t first, int64_t n) {
      if (full_row >= full_rows) return;
      std::copy_n(shard + shard_row * shard_columns, n, full.begin() + full_row * full_columns + first);
    });
  }
  return full;
}

bool ParameterLayout::has(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return true;
  return false;
}

const ParameterTensor& ParameterLayout::tensor(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw UsageError("no parameter named '" + name + "'");
}

}  // namespace trident
