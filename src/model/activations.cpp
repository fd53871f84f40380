#include "model/activations.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "kernels/base/error.h"

namespace trident {

namespace {

size_t aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }  // every buffer 64-byte aligned

// Whether recomputation `mode` drops a buffer kept with `retention`.
bool dropped(Retention retention, Recompute mode) {
  switch (retention) {
    case Retention::always: return false;
    case Retention::dropped_by_full: return mode == Recompute::full;
    case Retention::dropped_by_selective: return mode != Recompute::none;
  }
  return false;
}

}  // namespace

bool ActivationShape::recomputes_block(Recompute mode, int layers, RecomputeMethod method, int i, int n) {
  if (mode != Recompute::full || layers == 0 || layers >= n) return true;
  if (method == RecomputeMethod::block) return i < layers;
  // uniform: where the running count i * N / n steps up, N times over the chunk.
  return (i + 1) * layers / n > i * layers / n;
}

size_t ActivationDeclarations::bytes_of(size_t elements, Element type) const {
  switch (type) {
    case Element::act: return shape_.act_bytes(elements);
    case Element::f32: return elements * sizeof(float);
    case Element::i32: return elements * sizeof(int32_t);
  }
  return 0;
}

void ActivationDeclarations::set_recompute_group(int group) {
  group_ = group;
  if (group < 0) return;
  if (dropped_in_group_.size() <= static_cast<size_t>(group)) dropped_in_group_.resize(group + 1, 0);
  dropped_in_group_[group] = 0;  // from its first place again
}

void ActivationDeclarations::set_chunk(int chunk, bool own) {
  chunk_ = chunk;
  own_ = own;
}

int ActivationDeclarations::keep(size_t elements, Element type, Retention retention) {
  if (group_ < 0 || kept_whole_) retention = Retention::always;
  Kept k{bytes_of(elements, type), retention, group_, -1, chunk_, own_};
  if (retention != Retention::always) k.place = dropped_in_group_[group_]++;
  kept_.push_back(k);
  return static_cast<int>(kept_.size()) - 1;
}

void ActivationDeclarations::add_scratch(void** where, const std::string& name, size_t elements, Element type) {
  const size_t bytes = bytes_of(elements, type);
  for (Scratch& s : scratch_)
    if (s.name == name) {
      s.bytes = std::max(s.bytes, bytes);
      s.where.push_back(where);
      return;
    }
  scratch_.push_back({name, bytes, {where}});
}

// The shared slots, one after the other, each with every buffer the mode keeps of one
// chunk's blocks (of all the stage's layers with one chunk), laid out per chunk from the
// slot's start; then each chunk's own slots (several chunks); then the shared set that
// recomputation refills, one buffer per (group, place); then the scratch buffers.
ActivationArena::Plan ActivationArena::plan(const ActivationDeclarations& declared) {
  const ActivationShape& s = declared.shape();
  check(s.micro_batch > 0 && s.slots > 0, "micro_batch and slots must be positive");
  check(!s.deferred_weight_gradients || s.recompute == Recompute::none,
        "deferred weight gradients need the activations kept (no recompute)");
  check(s.sequence_shards > 0 && s.tokens() % s.sequence_shards == 0,
        "sequence shards must divide the micro-batch's rows");
  int chunks = 1;
  for (const auto& k : declared.kept_) chunks = std::max(chunks, k.chunk + 1);
  const bool apart = chunks > 1;  // the chunks' own buffers in slots of their own
  Plan p;
  p.chunk_slots = s.chunk_slots.empty() ? std::vector<int>(chunks, s.slots) : s.chunk_slots;
  check(static_cast<int>(p.chunk_slots.size()) == chunks, "chunk slots for every chunk");
  p.kept.resize(declared.kept_.size());
  std::vector<size_t> shared_end(chunks, 0);
  p.own_bytes.assign(chunks, 0);
  for (size_t h = 0; h < declared.kept_.size(); h++) {
    const auto& k = declared.kept_[h];
    if (dropped(k.retention, s.recompute)) continue;
    const bool own = apart && k.own;
    size_t& end = own ? p.own_bytes[k.chunk] : shared_end[k.chunk];
    p.kept[h] = {own ? Place::own : Place::shared, end, k.chunk};
    end += aligned(k.bytes);
  }
  p.slot_bytes = *std::max_element(shared_end.begin(), shared_end.end());
  size_t at = s.slots * p.slot_bytes;
  p.bytes.per_slot = p.slot_bytes;
  p.own_at.assign(chunks, at);
  if (apart)
    for (int c = 0; c < chunks; c++) {
      p.own_at[c] = at;
      at += p.own_bytes[c] * p.chunk_slots[c];
    }
  p.bytes.chunk_own = at - s.slots * p.slot_bytes;
  p.bytes.slots = at;
  std::map<std::pair<int, int>, size_t> shared_bytes;  // (group, place) -> its largest buffer
  for (const auto& k : declared.kept_)
    if (dropped(k.retention, s.recompute)) {
      size_t& b = shared_bytes[{k.group, k.place}];
      b = std::max(b, aligned(k.bytes));
    }
  std::map<std::pair<int, int>, size_t> shared_at;
  for (const auto& [key, bytes] : shared_bytes) {
    shared_at[key] = at;
    at += bytes;
  }
  p.bytes.recompute = at - p.bytes.slots;
  for (size_t h = 0; h < declared.kept_.size(); h++) {
    const auto& k = declared.kept_[h];
    if (dropped(k.retention, s.recompute)) p.kept[h] = {Place::fixed, shared_at.at({k.group, k.place}), k.chunk};
  }
  const size_t scratch_begin = at;
  for (const auto& scratch : declared.scratch_) {
    p.scratch.push_back(at);
    at += aligned(scratch.bytes);
  }
  p.bytes.backward = at - scratch_begin;
  return p;
}

ActivationBytes ActivationArena::measure(const ActivationDeclarations& declared) { return plan(declared).bytes; }

ActivationArena::ActivationArena(ActivationDeclarations& declared, kernels::Kernels& k) : shape_(declared.shape()) {
  Plan p = plan(declared);
  bytes_ = p.bytes;
  memory_ = kernels::DeviceBuffer(k, bytes_.total() / sizeof(float));
  base_ = reinterpret_cast<char*>(memory_.data());
  places_ = std::move(p.kept);
  slot_bytes_ = p.slot_bytes;
  own_at_ = std::move(p.own_at);
  own_bytes_ = std::move(p.own_bytes);
  chunk_slots_ = std::move(p.chunk_slots);
  bound_.resize(shape_.slots);
  std::iota(bound_.begin(), bound_.end(), 0);
  for (size_t i = 0; i < declared.scratch_.size(); i++)
    for (void** where : declared.scratch_[i].where) *where = base_ + p.scratch[i];
}

void ActivationArena::bind(int slot, int chunk, int chunk_slot) {
  check(slot >= 0 && slot < shape_.slots && chunk >= 0 && chunk < static_cast<int>(chunk_slots_.size()) &&
            chunk_slot >= 0 && chunk_slot < chunk_slots_[chunk],
        "activation slot out of range");
  bound_[slot] = chunk_slot;
}

}  // namespace trident
