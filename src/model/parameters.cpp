#include "model/parameters.h"

#include <algorithm>
#include <numeric>

#include "kernels/base/error.h"
#include "model/families/family.h"

namespace trident {

size_t ParameterTensor::numel() const {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

ParameterLayout::ParameterLayout(const TransformerSpec& spec, int tp_rank, int tp_size, size_t pad_to,
                                 const StageSpec& stage) {
  StageLayers layers = make_stage_layers(spec, stage);
  *this = ParameterLayout(layers, spec, tp_rank, tp_size, pad_to, stage);
}

ParameterLayout::ParameterLayout(StageLayers& layers, const TransformerSpec& spec, int tp_rank, int tp_size,
                                 size_t pad_to, const StageSpec& stage)
    : spec_(spec), tp_rank_(tp_rank), tp_size_(tp_size), ep_rank_(stage.ep_rank), ep_(stage.ep),
      has_embedding_(stage.has_embedding) {
  check_tensor_parallel(spec, tp_size);
  check(ep_ >= 1 && ep_rank_ >= 0 && ep_rank_ < ep_, "expert-parallel rank out of range");
  check(!stage.chunks.empty(), "a stage without a model chunk");
  chunk_begin_.push_back(0);
  for (const LayerRange& chunk : stage.chunks) {
    const int last = chunk.count < 0 ? spec.n_layer : chunk.first + chunk.count;
    check(chunk.first >= 0 && last <= spec.n_layer, "stage layers out of range");
    check(global_layers_.empty() || chunk.first > global_layers_.back(), "a stage's chunks must ascend");
    for (int i = chunk.first; i < last; i++) global_layers_.push_back(i);
    chunk_begin_.push_back(static_cast<int>(global_layers_.size()));
  }
  check(layers.blocks.size() == global_layers_.size(), "the stage's layers are not its blocks");
  // Units (the embeddings, each block, the final norm and head) start and end at a
  // multiple of pad_to, so that ZeRO can reduce-scatter each unit in equal blocks;
  // every tensor start stays 64-byte aligned.
  const size_t unit_align = std::lcm<size_t>(16, pad_to);
  unit_align_ = unit_align;
  const auto end_unit = [&](size_t begin) {
    total_ = (total_ + unit_align - 1) / unit_align * unit_align;
    if (total_ > begin) units_.push_back({begin, total_});
    return total_;
  };
  ParameterDeclarations kept(*this, ZeroResidence::kept_gathered), per_use(*this, ZeroResidence::gathered_per_use);
  if (layers.embedding) layers.embedding->declare_parameters(kept);
  size_t unit_begin = end_unit(0);
  if (layers.embedding && stage.has_embedding && !units_.empty()) embedding_unit_ = 0;
  for (const auto& block : layers.blocks) {
    unit_begin = total_;
    block->declare_parameters(per_use);
    block_units_.push_back(static_cast<int>(units_.size()));
    unit_begin = end_unit(unit_begin);
  }
  if (layers.head) {
    layers.final_norm->declare_parameters(kept);
    layers.head->declare_parameters(kept);
  }
  end_unit(unit_begin);
  if (layers.head) head_unit_ = static_cast<int>(units_.size()) - 1;
  unit_is_block_.assign(units_.size(), false);
  for (int u : block_units_) unit_is_block_[u] = true;
  // ZeRO-3: an end close to a block's size is padded to it. A smaller reduction's Open MPI
  // temporaries, freed, leave a hole in the heap (kept: kernels/base/memory.h) that a
  // block's cannot reuse, as large as the end's own; padding costs its zeros in every flat
  // buffer (the shards, a checkpoint's host copy), so only where they are few.
  if (stage.windowed_ends)
    for (int u : ends_for_windows())
      if (4 * units_[u].size() >= 3 * largest_block()) pad_unit(static_cast<size_t>(u), largest_block());
  // add() started every run of tensors reduced apart at a multiple of unit_align, and what
  // follows one (another tensor, a unit's end) too: each run is its group's region.
  for (const ParameterTensor& t : tensors_) {
    const AxisSet axes = t.placement.data_axes();
    if (!reduced_apart(axes, kDataParallel)) continue;
    auto region = std::find_if(data_regions_.begin(), data_regions_.end(), [&](const DataRegion& r) { return r.axes == axes; });
    if (region == data_regions_.end()) region = data_regions_.insert(data_regions_.end(), DataRegion{axes, {}});
    std::vector<FlatRange>& ranges = region->ranges;
    const size_t end = (t.offset + t.stored + unit_align - 1) / unit_align * unit_align;
    if (!ranges.empty() && ranges.back().end >= t.offset) ranges.back().end = end;
    else ranges.push_back({t.offset, end});
  }
}

std::vector<FlatRange> ParameterLayout::region_ranges() const {
  std::vector<FlatRange> all;
  for (const DataRegion& r : data_regions_) all.insert(all.end(), r.ranges.begin(), r.ranges.end());
  std::sort(all.begin(), all.end(), [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  return all;
}

AxisSet ParameterLayout::data_axes_of(const FlatRange& piece) const {
  for (const DataRegion& r : data_regions_)
    if (within(piece, r.ranges)) return r.axes;
  return kDataParallel;
}

bool ParameterLayout::reduced_apart(AxisSet a, AxisSet b) const {
  // The only cut of dp x cp a layout sees is expert parallelism's: with one ep rank the
  // ranks holding an expert (edp) are all of dp x cp.
  return a != b && ep_ > 1;
}

namespace {

// Puts tensor t at `offset` of a flat buffer (this rank's piece of it, padding rows
// included), appended to `list`; `end` moves past it, to the next 64-byte boundary: every
// tensor that starts a GEMM's operand is aligned for the vector kernels. Its index in `list`.
int place(ParameterTensor t, size_t offset, size_t& end, std::vector<ParameterTensor>& list) {
  t.offset = offset;
  size_t padded = 1;
  for (int64_t s : t.padded_shape) padded *= static_cast<size_t>(s);
  t.stored = padded / t.placement.pieces;
  end = (t.offset + t.stored + 15) / 16 * 16;
  list.push_back(std::move(t));
  return static_cast<int>(list.size()) - 1;
}

}  // namespace

int ParameterLayout::add(const TensorDeclaration& declared, ZeroResidence zero) {
  check(declared.pieces > 0 && tp_size_ % declared.pieces == 0, "a tensor's pieces must divide tp");
  ParameterTensor t;
  t.name = declared.name;
  t.shape = declared.shape;
  t.padded_shape = declared.shape;
  if (declared.padded_rows > 0) t.padded_shape[0] = declared.padded_rows;
  t.init = declared.init;
  Placement& p = t.placement;
  p.sharding = declared.sharding;
  p.pieces = declared.pieces;
  const int holders = tp_size_ / p.pieces;  // ranks holding each piece
  p.piece = tp_rank_ / holders;
  p.sharded_over = declared.sharded_over;
  p.summed_over = declared.summed_over;
  // The ranks holding one piece each compute part of its gradient (a shared key/value
  // head sees only this rank's query heads).
  if (p.sharding != Sharding::replicated && holders > 1) p.summed_over = p.summed_over | AxisSet{MeshAxis::tp_piece};
  // The first rank of its replicated set over tp (its piece's first holder) and pp (a
  // tied table's first stage, the one that embeds).
  p.counted = tp_rank_ % holders == 0 && !(p.summed_over.has(MeshAxis::pp_ends) && !has_embedding_);
  p.zero = zero;
  p.weight_decay = t.shape.size() >= 2;  // matrices and embeddings (FORMAT.md)
  p.hidden_matrix = declared.hidden_matrix;
  p.multiplied = declared.multiplied;
  p.active = declared.active;
  if (declared.kind == StateKind::buffer) {  // its own flat buffer: not optimized, no gradient, no ZeRO
    check(!declared.adjacent && declared.padded_rows == 0, "a buffer is laid out on its own");
    check(declared.init == Init::zeros || declared.init == Init::ones, "a buffer starts at zeros or ones");
    p.weight_decay = p.hidden_matrix = false;
    p.multiplied = false;
    return place(std::move(t), buffer_total_, buffer_total_, buffers_);
  }
  // Tensors that data parallelism reduces over different groups never share a stretch of
  // pad_to floats.
  if (!tensors_.empty() && reduced_apart(tensors_.back().placement.data_axes(), p.data_axes())) {
    check(!declared.adjacent, "a tensor adjacent to one reduced over other ranks");
    total_ = (total_ + unit_align_ - 1) / unit_align_ * unit_align_;
  }
  if (declared.adjacent) {
    check(!tensors_.empty(), "an adjacent tensor needs one before it");
    total_ = tensors_.back().offset + tensors_.back().stored;
  }
  return place(std::move(t), total_, total_, tensors_);
}

template <typename F>
void ParameterLayout::for_each_shard_row(const ParameterTensor& t, int p, F copy) const {
  const int64_t rows = t.padded_shape[0], columns = t.padded_shape.size() > 1 ? t.padded_shape[1] : 1;
  const int P = t.placement.pieces;
  switch (t.placement.sharding) {
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
  const int64_t shard_columns =
      t.placement.sharding == Sharding::columns ? full_columns / t.placement.pieces : full_columns;
  for_each_shard_row(t, t.placement.piece, [&](int64_t full_row, int64_t shard_row, int64_t first, int64_t n) {
    if (full_row >= full_rows) std::fill_n(out + shard_row * shard_columns, n, 0.0f);  // padding rows
    else read(full_row * full_columns + first, n, out + shard_row * shard_columns);
  });
}

std::vector<float> ParameterLayout::assemble(const ParameterTensor& t, const std::vector<float>& pieces) const {
  const int P = t.placement.pieces;
  check(pieces.size() == t.stored * P, "assemble: not one piece per shard");
  const int64_t full_rows = t.shape[0], full_columns = t.padded_shape.size() > 1 ? t.padded_shape[1] : 1;
  const int64_t shard_columns = t.placement.sharding == Sharding::columns ? full_columns / P : full_columns;
  std::vector<float> full(t.numel());
  for (int p = 0; p < P; p++) {
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

size_t ParameterLayout::largest_block() const {
  size_t block = 0;
  for (int u : block_units_) block = std::max(block, units_[u].size());
  return block;
}

std::vector<int> ParameterLayout::ends_for_windows() const {
  std::vector<int> ends;
  if (layers() < 2) return ends;
  const auto fits = [&](int u) { return u >= 0 && units_[u].size() <= largest_block(); };
  // A tied table sums its gradient between the pipeline's ends unless both are here.
  if (fits(embedding_unit_) && (!spec_.tied_head || head_reads_embedding_unit())) ends.push_back(embedding_unit_);
  if (fits(head_unit_) && !spec_.tied_head) ends.push_back(head_unit_);
  return ends;
}

void ParameterLayout::pad_unit(size_t u, size_t floats) {
  // Zeros after the unit's last tensor; everything after it moves up (the sizes are
  // multiples of the unit alignment, so the units stay aligned).
  const size_t end = units_[u].end, delta = floats - std::min(floats, units_[u].size());
  if (delta == 0) return;
  units_[u].end += delta;
  for (size_t v = u + 1; v < units_.size(); v++) units_[v].begin += delta, units_[v].end += delta;
  for (ParameterTensor& t : tensors_)
    if (t.offset >= end) t.offset += delta;
  total_ += delta;
}

size_t ParameterLayout::unit_of(size_t offset) const {
  const auto u = std::upper_bound(units_.begin(), units_.end(), offset,
                                  [](size_t o, const FlatRange& r) { return o < r.end; });
  check(u != units_.end() && offset >= u->begin, "flat offset " + std::to_string(offset) + " outside the layout's units");
  return static_cast<size_t>(u - units_.begin());
}

bool ParameterLayout::has(const std::string& name) const { return index_of(name) >= 0; }

const ParameterTensor* ParameterLayout::find_buffer(const std::string& name) const {
  for (const ParameterTensor& b : buffers_)
    if (b.name == name) return &b;
  return nullptr;
}

int ParameterLayout::index_of(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); i++)
    if (tensors_[i].name == name) return static_cast<int>(i);
  return -1;
}

const ParameterTensor& ParameterLayout::tensor(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  throw UsageError("no parameter named '" + name + "'");
}

}  // namespace trident
