#include "model/activations.h"

#include <algorithm>
#include <map>
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

int ActivationDeclarations::keep(size_t elements, Element type, Retention retention) {
  if (group_ < 0) retention = Retention::always;
  Kept k{bytes_of(elements, type), retention, group_, -1};
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

// Per slot every buffer the mode keeps, in declaration order; then the shared set that
// recomputation refills, one buffer per (group, place); then the scratch buffers.
ActivationArena::Plan ActivationArena::plan(const ActivationDeclarations& declared) {
  const ActivationShape& s = declared.shape();
  check(s.micro_batch > 0 && s.slots > 0, "micro_batch and slots must be positive");
  check(!s.deferred_weight_gradients || s.recompute == Recompute::none,
        "deferred weight gradients need the activations kept (no recompute)");
  check(s.sequence_shards > 0 && s.tokens() % s.sequence_shards == 0,
        "sequence shards must divide the micro-batch's rows");
  Plan p;
  size_t at = 0;
  std::map<std::pair<int, int>, size_t> shared_bytes;  // (group, place) -> its largest buffer
  for (const auto& k : declared.kept_)
    if (dropped(k.retention, s.recompute)) {
      size_t& b = shared_bytes[{k.group, k.place}];
      b = std::max(b, aligned(k.bytes));
    }
  p.kept.assign(s.slots, std::vector<size_t>(declared.kept_.size(), 0));
  for (int slot = 0; slot < s.slots; slot++)
    for (size_t h = 0; h < declared.kept_.size(); h++) {
      if (dropped(declared.kept_[h].retention, s.recompute)) continue;
      p.kept[slot][h] = at;
      at += aligned(declared.kept_[h].bytes);
    }
  p.bytes.slots = at;
  p.bytes.per_slot = at / s.slots;
  std::map<std::pair<int, int>, size_t> shared_at;
  for (const auto& [key, bytes] : shared_bytes) {
    shared_at[key] = at;
    at += bytes;
  }
  p.bytes.recompute = at - p.bytes.slots;
  for (int slot = 0; slot < s.slots; slot++)
    for (size_t h = 0; h < declared.kept_.size(); h++) {
      const auto& k = declared.kept_[h];
      if (dropped(k.retention, s.recompute)) p.kept[slot][h] = shared_at.at({k.group, k.place});
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
  const Plan p = plan(declared);
  bytes_ = p.bytes;
  memory_ = kernels::DeviceBuffer(k, bytes_.total() / sizeof(float));
  char* base = reinterpret_cast<char*>(memory_.data());
  kept_.assign(p.kept.size(), std::vector<void*>(declared.kept_.size(), nullptr));
  for (size_t slot = 0; slot < p.kept.size(); slot++)
    for (size_t h = 0; h < p.kept[slot].size(); h++) kept_[slot][h] = base + p.kept[slot][h];
  for (size_t i = 0; i < declared.scratch_.size(); i++)
    for (void** where : declared.scratch_[i].where) *where = base + p.scratch[i];
}

}  // namespace trident
