#include "model/layers/attention_context.h"

#include <algorithm>

#include "model/document_mask.h"

namespace trident {

AttentionContext::AttentionContext(kernels::Kernels& k, int seq_len, int micro_batch, int slots, Communicator* cp,
                                   int32_t document_end)
    : k_(k), seq_len_(seq_len), micro_batch_(micro_batch), slots_(slots), cp_(cp), document_end_(document_end) {
  cp_size_ = cp != nullptr ? cp->size() : 1;
  cp_rank_ = cp != nullptr ? cp->rank() : 0;
  T_ = seq_len / cp_size_;
  positions_ = context_positions(seq_len, cp_size_, cp_rank_);
  const std::vector<int32_t> every_rank = context_positions_of_every_rank(seq_len, cp_size_);
  every_rank_ = kernels::DeviceBuffer(k, every_rank.size());
  k.copy_to_device(every_rank_.data(), every_rank.data(), every_rank.size() * sizeof(int32_t));
}

const float* AttentionContext::rotary_table(const RotarySettings& s) {
  for (const Rotation& r : rotations_)
    if (same_rotation(r.settings, s)) return r.table.data();
  const std::vector<float> table = trident::rotary_table(s, positions_);
  Rotation& r = rotations_.emplace_back(Rotation{s, kernels::DeviceBuffer(k_, table.size())});
  k_.copy_to_device(r.table.data(), table.data(), table.size() * sizeof(float));
  return r.table.data();
}

RingAttention* AttentionContext::ring(int heads, int kv_heads, int head_dim) {
  if (cp_size_ == 1) return nullptr;
  for (const Ring& r : rings_)
    if (r.heads == heads && r.kv_heads == kv_heads && r.head_dim == head_dim) return r.ring.get();
  auto ring = std::make_unique<RingAttention>(k_, *cp_, every_rank(), T_, heads, kv_heads, head_dim);
  return rings_.emplace_back(Ring{heads, kv_heads, head_dim, std::move(ring)}).ring.get();
}

const SlotMasks& AttentionContext::masks(int window) {
  for (const auto& m : masks_)
    if (m->window_ == window) return *m;
  auto m = std::make_unique<SlotMasks>();
  m->window_ = window;
  m->positions_ = device_positions();
  if (document_end_ >= 0 || window > 0) {  // else the causal mask of the positions alone
    m->per_slot_ = static_cast<size_t>(micro_batch_) * T_;
    m->starts_ = kernels::DeviceBuffer(k_, m->per_slot_ * slots_);
    const size_t whole = static_cast<size_t>(micro_batch_) * seq_len_;
    documents_.resize(whole);
    if (window > 0) narrowed_.resize(whole);
    if (cp_size_ > 1) mine_.resize(m->per_slot_);
  }
  return *masks_.emplace_back(std::move(m));
}

void AttentionContext::load(int slot, const int32_t* tokens, int B) {
  if (documents_.empty()) return;  // no layer's mask has starts
  // Documents are found in whole sequences, then each window narrows them and this rank
  // keeps its share (context parallelism: its chunks of each sequence).
  const size_t whole = static_cast<size_t>(B) * seq_len_;
  if (document_end_ >= 0) document_starts(tokens, B, seq_len_, document_end_, documents_.data());
  else std::fill_n(documents_.begin(), whole, 0);
  for (const auto& m : masks_) {
    if (m->starts_.size() == 0) continue;
    const int32_t* starts = documents_.data();
    if (m->window_ > 0) {
      std::copy_n(documents_.begin(), whole, narrowed_.begin());
      narrow_to_window(narrowed_.data(), B, seq_len_, m->window_);
      starts = narrowed_.data();
    }
    if (cp_size_ > 1) {
      take_positions(starts, B, seq_len_, positions_, mine_.data());
      starts = mine_.data();
    }
    k_.upload(m->first_visible() + static_cast<size_t>(slot) * m->per_slot_, starts,
              static_cast<size_t>(B) * T_ * sizeof(int32_t));
  }
}

}  // namespace trident
