#include "model/parameters.h"

#include <algorithm>
#include <numeric>

#include "kernels/base/error.h"

namespace trident {

size_t ParameterTensor::numel() const {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

ParameterLayout::ParameterLayout(const TransformerSpec& spec, int tp_rank, int tp_size, size_t pad_to,
                                 const StageSpec& stage)
    : spec_(spec), tp_rank_(tp_rank), tp_size_(tp_size) {
  check_tensor_parallel(spec, tp_size);
  const int64_t d = spec.d_model, V = spec.vocab_size, T = spec.seq_len, hd = spec.head_dim;
  const int64_t H = spec.n_head, KV = spec.n_kv_head, F = spec.ffn_dim;
  const int tp = tp_size, kv_shards = spec.kv_shards(tp);
  check(!stage.chunks.empty(), "a stage without a model chunk");
  chunk_begin_.push_back(0);
  for (const LayerRange& chunk : stage.chunks) {
    const int last = chunk.count < 0 ? spec.n_layer : chunk.first + chunk.count;
    check(chunk.first >= 0 && last <= spec.n_layer, "stage layers out of range");
    check(global_layers_.empty() || chunk.first > global_layers_.back(), "a stage's chunks must ascend");
    for (int i = chunk.first; i < last; i++) global_layers_.push_back(i);
    chunk_begin_.push_back(static_cast<int>(global_layers_.size()));
  }
  const int64_t Vp = spec.padded_vocab(tp);

  if (stage.has_embedding || (stage.has_head && spec.tied_head)) {
    token_embedding_ = add(spec.token_embedding, {V, d}, Sharding::rows, tp, Init::normal, Vp);
    if (spec.tied_head) {
      tied_ = token_embedding_;
      // The last stage's copy only serves the head; the first stage's counts.
      tensors_[tied_].tied_copy = !stage.has_embedding;
      tensors_[tied_].counted = tensors_[tied_].counted && stage.has_embedding;
    }
    if (!stage.has_embedding) token_embedding_ = -1;
  }
  if (stage.has_embedding && spec.positions == PositionKind::learned)
    position_embedding_ = add(spec.position_embedding, {T, d}, Sharding::replicated, 1, Init::normal);

  // Units (the embeddings, each block, the final norm and head) start and end at a
  // multiple of pad_to, so that ZeRO can reduce-scatter each unit in equal blocks;
  // every tensor start stays 64-byte aligned.
  const size_t unit_align = std::lcm<size_t>(16, pad_to);
  const auto end_unit = [&](size_t begin) {
    total_ = (total_ + unit_align - 1) / unit_align * unit_align;
    if (total_ > begin) units_.push_back({begin, total_});
    return total_;
  };
  size_t unit_begin = end_unit(0);

  // A norm: gain (and bias).
  const auto norm = [&](const std::string& name, int& weight, int& bias) {
    weight = add(name + ".weight", {d}, Sharding::replicated, 1, Init::ones);
    bias = spec.biases ? add(name + ".bias", {d}, Sharding::replicated, 1, Init::zeros) : -1;
    tensors_[weight].is_norm_parameter = true;
    if (bias >= 0) tensors_[bias].is_norm_parameter = true;
  };
  for (int i : global_layers_) {
    unit_begin = total_;
    const BlockNames names = spec.block(i);
    BlockParameterIndex b{};
    norm(names.norm_1, b.norm_1_weight, b.norm_1_bias);
    b.first = b.norm_1_weight;
    // Attention's input: one GEMM over q | k | v, column-parallel (heads over tp).
    if (names.qkv.size() == 1) {  // GPT-2's c_attn: q, k, v fused in one tensor
      b.qkv_weight = add(names.qkv[0] + ".weight", {3 * H * hd, d}, Sharding::qkv_rows, tp, Init::normal);
      b.qkv_bias = spec.biases ? add(names.qkv[0] + ".bias", {3 * H * hd}, Sharding::qkv_rows, tp, Init::zeros) : -1;
    } else {  // q, k, v apart: the key/value heads may be fewer than tp, then shared
      b.qkv_weight = add(names.qkv[0] + ".weight", {H * hd, d}, Sharding::rows, tp, Init::normal);
      for (int kv = 1; kv <= 2; kv++)
        add(names.qkv[kv] + ".weight", {KV * hd, d}, Sharding::rows, kv_shards, Init::normal, 0, /*adjacent=*/true);
      b.qkv_bias = -1;
      check(!spec.biases, "separate q, k, v projections with biases");
    }
    // Attention's output: row-parallel; its bias is added once, after the sum over tp.
    b.attn_out_weight = add(names.attn_out + ".weight", {d, H * hd}, Sharding::columns, tp, Init::normal_residual);
    b.attn_out_bias = spec.biases ? add(names.attn_out + ".bias", {d}, Sharding::replicated, 1, Init::zeros) : -1;
    norm(names.norm_2, b.norm_2_weight, b.norm_2_bias);
    // The MLP: column-parallel c_fc (or gate | up), row-parallel c_proj (or down).
    b.mlp_in_weight = -1;
    for (const std::string& name : names.mlp_in) {
      const int index = add(name + ".weight", {F, d}, Sharding::rows, tp, Init::normal, 0, b.mlp_in_weight >= 0);
      if (b.mlp_in_weight < 0) b.mlp_in_weight = index;
    }
    b.mlp_in_bias = spec.biases ? add(names.mlp_in[0] + ".bias", {F}, Sharding::rows, tp, Init::zeros) : -1;
    check(!spec.biases || names.mlp_in.size() == 1, "a split MLP input with biases");
    b.mlp_out_weight = add(names.mlp_out + ".weight", {d, F}, Sharding::columns, tp, Init::normal_residual);
    b.mlp_out_bias = spec.biases ? add(names.mlp_out + ".bias", {d}, Sharding::replicated, 1, Init::zeros) : -1;
    blocks_.push_back(b);
    block_units_.push_back(static_cast<int>(units_.size()));
    unit_begin = end_unit(unit_begin);
  }
  if (stage.has_head) {
    norm(spec.final_norm, final_norm_weight_, final_norm_bias_);
    head_ = spec.tied_head ? tied_ : add(spec.head, {V, d}, Sharding::rows, tp, Init::normal, Vp);
  }
  end_unit(unit_begin);
  unit_is_block_.assign(units_.size(), false);
  for (int u : block_units_) unit_is_block_[u] = true;
}

int ParameterLayout::add(const std::string& name, std::vector<int64_t> shape, Sharding sharding, int shards,
                         Init init, int64_t padded_rows, bool adjacent) {
  check(tp_size_ % shards == 0, "a tensor's pieces must divide tp");
  ParameterTensor t;
  t.name = name;
  t.shape = shape;
  t.padded_shape = shape;
  if (padded_rows > 0) t.padded_shape[0] = padded_rows;
  t.sharding = sharding;
  t.shards = shards;
  const int holders = tp_size_ / shards;  // ranks holding each piece
  t.shard = tp_rank_ / holders;
  t.counted = tp_rank_ % holders == 0;
  t.partial_gradient = sharding != Sharding::replicated && holders > 1;
  t.init = init;
  if (adjacent) {
    check(!tensors_.empty(), "an adjacent tensor needs one before it");
    total_ = tensors_.back().offset + tensors_.back().stored;
  }
  t.offset = total_;
  size_t padded = 1;
  for (int64_t s : t.padded_shape) padded *= static_cast<size_t>(s);
  t.stored = padded / shards;
  t.weight_decay = shape.size() >= 2;
  // Every tensor that starts a GEMM's operand is 64-byte aligned for the vector kernels.
  total_ = (t.offset + t.stored + 15) / 16 * 16;
  tensors_.push_back(std::move(t));
  return static_cast<int>(tensors_.size()) - 1;
}

template <typename F>
void ParameterLayout::for_each_shard_row(const ParameterTensor& t, int p, F copy) const {
  const int64_t rows = t.padded_shape[0], columns = t.padded_shape.size() > 1 ? t.padded_shape[1] : 1;
  const int P = t.shards;
  switch (t.sharding) {
    case Sharding::replicated:
      for (int64_t i = 0; i < rows; i++) copy(i, i, 0, columns);
      break;
    case Sharding::rows:
      for (int64_t i = 0; i < rows / P; i++) copy(p * (rows / P) + i, i, 0, columns);
      break;
    case Sharding::qkv_rows: {  // [q | k | v], each `rows/3` rows; my heads of each
      const int64_t block = rows / 3, mine = block / P;
      for (int64_t part = 0; part < 3; part++)
        for (int64_t i = 0; i < mine; i++) copy(part * block + p * mine + i, part * mine + i, 0, columns);
      break;
    }
    case Sharding::columns:
      for (int64_t i = 0; i < rows; i++) copy(i, i, p * (columns / P), columns / P);
      break;
  }
}

std::vector<float> ParameterLayout::shard_of(const ParameterTensor& t, const float* full) const {
  std::vector<float> shard(t.stored);
  shard_into(t, [full](int64_t first, int64_t n, float* out) { std::copy_n(full + first, n, out); }, shard.data());
  return shard;
}

void ParameterLayout::shard_into(const ParameterTensor& t, const ReadFull& read, float* out) const {
  const int64_t full_rows = t.shape[0], full_columns = t.padded_shape.size() > 1 ? t.padded_shape[1] : 1;
  const int64_t shard_columns = t.sharding == Sharding::columns ? full_columns / t.shards : full_columns;
  for_each_shard_row(t, t.shard, [&](int64_t full_row, int64_t shard_row, int64_t first, int64_t n) {
    if (full_row >= full_rows) std::fill_n(out + shard_row * shard_columns, n, 0.0f);  // padding rows
    else read(full_row * full_columns + first, n, out + shard_row * shard_columns);
  });
}

std::vector<float> ParameterLayout::assemble(const ParameterTensor& t, const std::vector<float>& pieces) const {
  check(pieces.size() == t.stored * t.shards, "assemble: not one piece per shard");
  const int64_t full_rows = t.shape[0], full_columns = t.padded_shape.size() > 1 ? t.padded_shape[1] : 1;
  const int64_t shard_columns = t.sharding == Sharding::columns ? full_columns / t.shards : full_columns;
  std::vector<float> full(t.numel());
  for (int p = 0; p < t.shards; p++) {
    const float* shard = pieces.data() + p * t.stored;
    for_each_shard_row(t, p, [&](int64_t full_row, int64_t shard_row, int64_t first, int64_t n) {
      if (full_row >= full_rows) return;
      std::copy_n(shard + shard_row * shard_columns, n, full.begin() + full_row * full_columns + first);
    });
  }
  return full;
}

void ShardedParameters::set(const ParameterTensor& t, const float* full) const {
  const std::vector<float> shard = layout->shard_of(t, full);
  set_shard(t, shard.data());
}

namespace {

// Calls f(range start in the flat buffer, where it is in `values`, floats) for each part of
// [begin, end) that `held` covers (all of it when held is empty).
template <typename F>
void for_each_held(const std::vector<FlatRange>& held, size_t begin, size_t end, F f) {
  if (held.empty()) {
    f(begin, begin, end - begin);
    return;
  }
  size_t stored = 0;
  for (const FlatRange& r : held) {
    const size_t b = std::max(begin, r.begin), e = std::min(end, r.end);
    if (b < e) f(b, stored + (b - r.begin), e - b);
    stored += r.size();
  }
}

}  // namespace

void ShardedParameters::set_shard(const ParameterTensor& t, const float* shard) const {
  for_each_held(held, t.offset, t.offset + t.stored, [&](size_t flat, size_t at, size_t n) {
    memory->copy_to_device(values + at, shard + (flat - t.offset), n * sizeof(float));
  });
}

void ShardedParameters::shard_to_host(const ParameterTensor& t, float* shard) const {
  if (sharded()) std::fill(shard, shard + t.stored, 0.0f);
  for_each_held(held, t.offset, t.offset + t.stored, [&](size_t flat, size_t at, size_t n) {
    memory->copy_to_host(shard + (flat - t.offset), values + at, n * sizeof(float));
  });
}

void ShardedParameters::to_host(float* flat) const {
  const size_t n = layout->total_floats();
  if (sharded()) std::fill(flat, flat + n, 0.0f);
  for_each_held(held, 0, n, [&](size_t begin, size_t at, size_t count) {
    memory->copy_to_host(flat + begin, values + at, count * sizeof(float));
  });
}

void ShardedParameters::from_host(const float* flat) const {
  for_each_held(held, 0, layout->total_floats(), [&](size_t begin, size_t at, size_t count) {
    memory->copy_to_device(values + at, flat + begin, count * sizeof(float));
  });
}

size_t ParameterLayout::unit_of(size_t offset) const {
  const auto u = std::upper_bound(units_.begin(), units_.end(), offset,
                                  [](size_t o, const FlatRange& r) { return o < r.end; });
  check(u != units_.end() && offset >= u->begin, "flat offset " + std::to_string(offset) + " outside the layout's units");
  return static_cast<size_t>(u - units_.begin());
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
