#include "parallel/param_grad_store.h"

#include <algorithm>
#include <span>

#include "kernels/base/error.h"

namespace trident {

namespace {

// Where each unit's gradients (ZeRO-3: and parameters) live in their storage. Without
// windows: where the unit is in the flat layout. With windows: the kept units first, then
// window 0 and window 1, each as large as the largest windowed unit; block l in window
// l % 2, the embeddings in window 1 and the head in window layers() % 2 (their places
// before their first use: ParamGradStore moves a tied table between the two).
struct UnitStorage {
  size_t floats = 0;
  std::vector<size_t> unit_start;
  size_t window_start[2] = {0, 0};
};

UnitStorage unit_storage(const ParameterLayout& layout, const std::vector<bool>& windowed) {
  const std::vector<FlatRange>& units = layout.units();
  UnitStorage g;
  if (std::find(windowed.begin(), windowed.end(), true) == windowed.end()) {
    for (const FlatRange& u : units) g.unit_start.push_back(u.begin);
    g.floats = layout.total_floats();
    return g;
  }
  size_t window = 0;
  for (size_t u = 0; u < units.size(); u++)
    if (windowed[u]) window = std::max(window, units[u].size());
  g.unit_start.resize(units.size());
  for (size_t u = 0; u < units.size(); u++)
    if (!windowed[u]) g.unit_start[u] = g.floats, g.floats += units[u].size();
  for (int w = 0; w < 2; w++) g.window_start[w] = g.floats + w * window;
  const int L = layout.layers();
  for (int l = 0; l < L; l++) g.unit_start[layout.block_unit(l)] = g.window_start[l % 2];
  if (layout.head_unit() >= 0 && windowed[layout.head_unit()]) g.unit_start[layout.head_unit()] = g.window_start[L % 2];
  if (layout.embedding_unit() >= 0 && windowed[layout.embedding_unit()])
    g.unit_start[layout.embedding_unit()] = g.window_start[1];
  g.floats += std::min(L, 2) * window;
  return g;
}

}  // namespace

std::vector<bool> ParamGradStore::windowed_units(const ParameterLayout& layout, ZeroStage zero,
                                                 bool defers_weight_gradients) {
  std::vector<bool> windowed(layout.units().size(), false);
  if (zero < ZeroStage::gradients) return windowed;
  windowed = layout.unit_is_block();
  // The ends take the windows only as ZeRO-3's parameters (ZeRO-2 accumulates their
  // gradients in place and reduces them once per step), and not under deferred weight
  // gradients (computed apart from their use); which ends fit: the layout says.
  if (zero != ZeroStage::parameters || defers_weight_gradients) return windowed;
  for (int u : layout.ends_for_windows()) windowed[u] = true;
  return windowed;
}

size_t ParamGradStore::gradient_floats_for(const ParameterLayout& layout, ZeroStage zero,
                                           bool defers_weight_gradients) {
  return unit_storage(layout, windowed_units(layout, zero, defers_weight_gradients)).floats;
}

size_t ParamGradStore::parameter_floats_for(const ParameterLayout& layout, ZeroStage zero,
                                            kernels::Precision precision, bool defers_weight_gradients) {
  // ZeRO-3 in bf16 gathers the compute copy itself: the fp32 values live in the shard only.
  if (zero == ZeroStage::parameters && precision != kernels::Precision::fp32) return 0;
  return compute_weight_floats_for(layout, zero, defers_weight_gradients);
}

size_t ParamGradStore::compute_weight_floats_for(const ParameterLayout& layout, ZeroStage zero,
                                                 bool defers_weight_gradients) {
  if (zero != ZeroStage::parameters) return layout.total_floats();
  return unit_storage(layout, windowed_units(layout, zero, defers_weight_gradients)).floats;
}

ParamGradStore::ParamGradStore(const ParameterLayout& layout, kernels::Kernels& k, ZeroStage zero,
                               Communicator* shard_group, GroupOf region_groups, bool defers_weight_gradients)
    : layout_(layout), k_(k),
      shards_(zero == ZeroStage::parameters && shard_group != nullptr && shard_group->size() > 1 ? shard_group
                                                                                                 : nullptr),
      zero_(zero == ZeroStage::parameters && shards_ == nullptr ? ZeroStage::gradients : zero),
      windowed_(windowed_units(layout, zero_, defers_weight_gradients)),
      params_(k, parameter_floats_for(layout, zero_, k.precision(), defers_weight_gradients)),
      grads_(k, gradient_floats_for(layout, zero_, defers_weight_gradients)), act_type_(k.activation_type()),
      region_groups_(std::move(region_groups)) {
  const UnitStorage storage = unit_storage(layout_, windowed_);
  unit_storage_ = storage.unit_start;
  std::copy(std::begin(storage.window_start), std::end(storage.window_start), window_start_);
  for (const ParameterTensor& t : layout_.tensors()) {
    const size_t u = layout_.unit_of(t.offset);
    tensor_unit_.push_back(static_cast<int>(u));
    within_unit_.push_back(t.offset - layout_.units()[u].begin);
  }
  if (shards_ != nullptr) {
    const std::vector<FlatRange>& units = layout_.units();
    check(layout_.data_regions().empty() || region_groups_ != nullptr, "ZeRO-3 over regions without their groups");
    pieces_ = split_at(units, layout_.region_ranges());
    unit_pieces_ = first_pieces(units, pieces_);
    size_t floats = 0;
    for (const FlatRange& p : pieces_) {
      Communicator* group = holders_of(p);
      piece_group_.push_back(group);
      const size_t ranks = group->size(), rank = group->rank();
      check(p.size() % ranks == 0, "ZeRO-3: a unit must be a multiple of the shard group");
      const size_t block = p.size() / ranks;
      held_.push_back({p.begin + rank * block, p.begin + (rank + 1) * block});
      master_offset_.push_back(floats);
      floats += block;
    }
    master_ = kernels::DeviceBuffer(k, floats);
  }
  if (k.precision() == kernels::Precision::fp32) {
    weights_act_ = kernels::as_act(params_.data());  // fp32 compute reads the parameters themselves
  } else {
    weights_ = kernels::DeviceBuffer(
        k, (k.activation_bytes(compute_weight_floats_for(layout_, zero_, defers_weight_gradients)) + 3) / 4);
    weights_act_ = reinterpret_cast<Act*>(weights_.data());
  }
}

Communicator* ParamGradStore::holders_of(const FlatRange& piece) const {
  const AxisSet axes = layout_.data_axes_of(piece);
  return axes == kDataParallel ? shards_ : &region_groups_(axes);
}

float* ParamGradStore::gradient_location(size_t offset) const {
  const size_t u = layout_.unit_of(offset);
  return grads_.data() + unit_storage_[u] + (offset - layout_.units()[u].begin);  // where the unit is now
}

void ParamGradStore::zero_grad() { k_.fill_zero(grads_.data(), grads_.size() * sizeof(float)); }

float* ParamGradStore::parameter_at(size_t offset) const {
  if (shards_ == nullptr) return params_.data() + offset;
  const auto piece = std::upper_bound(pieces_.begin(), pieces_.end(), offset,
                                      [](size_t o, const FlatRange& r) { return o < r.end; });
  check(piece != pieces_.end(), "parameter_at: an offset outside the layout");
  const size_t i = static_cast<size_t>(piece - pieces_.begin());
  check(offset >= held_[i].begin && offset < held_[i].end, "parameter_at: not an offset this rank holds");
  return master_.data() + master_offset_[i] + (offset - held_[i].begin);
}

void ParamGradStore::parameters_changed() {
  weights_stale_ = true;
  for (int w = 0; w < 2; w++) {
    window_gather_[w].reset();  // waits for a gather still in flight
    window_unit_[w] = -1;
  }
}

ShardedParameters ParamGradStore::parameters() {
  return {&layout_, shards_ != nullptr ? master_.data() : params_.data(), &k_, [this] { parameters_changed(); },
          held_};
}

std::vector<float> ParamGradStore::parameter_to_host(int index) {
  const ParameterTensor& t = layout_[index];
  std::vector<float> mine(t.stored);
  parameters().shard_to_host(t, mine.data());
  // ZeRO-3: this rank's part of it, the others' parts from them (zeros here): the ranks
  // holding the same tensor.
  Communicator* holders = shards_ != nullptr ? holders_of({t.offset, t.offset + t.stored}) : nullptr;
  if (holders != nullptr && holders->size() > 1) holders->all_reduce(std::span<float>(mine));
  return mine;
}

std::vector<float> ParamGradStore::gradient_to_host(int index) const {
  const ParameterTensor& t = layout_[index];
  std::vector<float> mine(t.stored);
  k_.copy_to_host(mine.data(), grad(index), t.stored * sizeof(float));
  return mine;
}

void ParamGradStore::refresh_weights() {
  if (!weights_stale_) return;
  weights_stale_ = false;
  if (shards_ == nullptr) {
    if (weights_.data() != nullptr) k_.cast_to_activation(weights_act_, params_.data(), layout_.total_floats());
    return;
  }
  // ZeRO-3: the kept units gathered whole; the windowed ones as they come.
  std::vector<RequestPtr> gathers;  // all started, then waited for
  for (size_t u = 0; u < windowed_.size(); u++)
    if (!windowed_[u]) gathers.push_back(gather_unit(u));
  for (RequestPtr& g : gathers) g->wait();
}

void ParamGradStore::progress_gathers() {
  for (RequestPtr& g : window_gather_)
    if (g) g->test();
}

RequestPtr ParamGradStore::gather_unit(size_t u) {
  const FlatRange& unit = layout_.units()[u];
  std::vector<RequestPtr> gathers;
  for (size_t p = unit_pieces_[u]; p < unit_pieces_[u + 1]; p++) {
    Communicator& group = *piece_group_[p];
    const size_t block = held_[p].size(), mine = group.rank() * block, at = unit_storage_[u] + (pieces_[p].begin - unit.begin);
    const float* master = master_.data() + master_offset_[p];
    // In place: this rank's block at its position, the others' arrive around it (none
    // where no other rank holds the piece). In bf16 the compute copy is what travels.
    if (weights_.data() == nullptr) {  // fp32: the layers read the parameters themselves
      float* storage = params_.data() + at;
      k_.copy_on_device(storage + mine, master, block * sizeof(float));
      if (group.size() > 1) gathers.push_back(group.all_gather_async(std::span<float>(storage, pieces_[p].size())));
      continue;
    }
    Act* storage = kernels::offset(weights_act_, at, act_type_);
    k_.cast_to_activation(kernels::offset(storage, mine, act_type_), master, block);
    if (group.size() > 1)
      gathers.push_back(group.all_gather_async(ActivationSpan{storage, pieces_[p].size(), act_type_}));
  }
  if (gathers.size() == 1) return std::move(gathers[0]);
  return std::make_unique<AllOf>(std::move(gathers));
}

int ParamGradStore::windowed_unit_at(int position) const {
  const int L = layout_.layers();
  int u = -1;
  if (position == -1) u = layout_.embedding_unit();
  else if (position >= 0 && position < L) u = layout_.block_unit(position);
  else if (position == L) u = layout_.head_reads_embedding_unit() ? layout_.embedding_unit() : layout_.head_unit();
  return u >= 0 && windowed_[u] ? u : -1;
}

void ParamGradStore::gather_at(int position, bool wait) {
  const int u = windowed_unit_at(position), w = window_of(position);
  if (u < 0) return;
  if (window_unit_[w] != u) {  // else there, or on its way
    window_gather_[w].reset();  // what was on its way into the window: arrived, and done with
    place(u, w);
    window_gather_[w] = gather_unit(static_cast<size_t>(u));
    window_unit_[w] = u;
  }
  place(u, w);  // a tied table may live in the other window since (its gradients)
  if (wait && window_gather_[w]) {
    window_gather_[w]->wait();
    window_gather_[w].reset();
  }
}

void ParamGradStore::use_embeddings() {
  if (shards_ == nullptr) return;
  gather_at(-1, /*wait=*/true);
  gather_at(0, /*wait=*/false);
}

void ParamGradStore::use_block(int l, int next) {
  if (shards_ == nullptr) return;
  gather_at(l, /*wait=*/true);
  // Ahead, a block or the head (never the embeddings: backward does not read them).
  if (next >= 0 && next <= layout_.layers()) gather_at(next, /*wait=*/false);
}

void ParamGradStore::use_head() {
  if (shards_ == nullptr) return;
  gather_at(layout_.layers(), /*wait=*/true);
}

void ParamGradStore::embedding_takes_gradients() {
  const int u = windowed_unit_at(-1);
  if (shards_ != nullptr && u >= 0) place(u, window_of(-1));
}

}  // namespace trident
