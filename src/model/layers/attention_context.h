// What the attention layers of a stage share, that depends on the sequence only: this
// rank's token positions (the whole sequence, or its share under context parallelism:
// model/context_parallel.h) and each slot's document starts (model/document_mask.h). One
// per stage, built by the model; each attention layer asks it, when the stage is built,
// for the pieces its own settings need: its position slot's rotary table (rotary.h), its
// core's ring under context parallelism, its mask (the starts narrowed by its sliding
// window). Each piece is built once per distinct setting and shared by the layers that
// ask for the same one, so a per-layer window or rotation costs only what differs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/attention_mask.h"
#include "kernels/device_buffer.h"
#include "kernels/kernels.h"
#include "model/context_parallel.h"
#include "model/layers/rotary.h"

namespace trident {

// The masks of the layers of one window, a slot each (kernels/attention_mask.h): this
// rank's positions and, under document masking or a window, each query's first visible
// key, which AttentionContext::load fills per micro-batch.
class SlotMasks {
 public:
  kernels::AttentionMask at(int slot) const {
    const int32_t* starts = starts_.size() == 0 ? nullptr : first_visible() + static_cast<size_t>(slot) * per_slot_;
    return {positions_, positions_, starts};
  }
  int window() const { return window_; }

 private:
  friend class AttentionContext;
  int32_t* first_visible() const { return reinterpret_cast<int32_t*>(starts_.data()); }
  int window_ = 0;  // 0: none
  const int32_t* positions_ = nullptr;
  kernels::DeviceBuffer starts_;  // [slots, micro_batch, T]; empty: the causal mask alone
  size_t per_slot_ = 0;
};

class AttentionContext {
 public:
  // seq_len: a whole sequence's tokens; micro_batch and slots: the activation slots'
  // (each holds its own starts); cp: context parallelism's group (null: each sequence
  // whole here); document_end: the end-of-document token (-1: no document masking).
  AttentionContext(kernels::Kernels& k, int seq_len, int micro_batch, int slots, Communicator* cp,
                   int32_t document_end);

  int tokens() const { return T_; }  // this rank's tokens of a sequence
  // Their positions in the sequence (strictly increasing): on the host, to take this
  // rank's share of a batch; on the device, what the masks (and learned positions) read.
  const std::vector<int32_t>& positions() const { return positions_; }
  const int32_t* device_positions() const { return every_rank() + static_cast<size_t>(cp_rank_) * T_; }

  // What a layer asks for when the stage is built (each the same object for the same
  // settings): the rotary table of this rank's positions (device: [T, dim / 2, 2]); the
  // ring of `heads` query and `kv_heads` key/value heads (this rank's) of head_dim (null
  // without context parallelism: the local kernels); the masks of `window` (0: none).
  const float* rotary_table(const RotarySettings& s);
  RingAttention* ring(int heads, int kv_heads, int head_dim);
  const SlotMasks& masks(int window);

  // For the micro-batch of B sequences in `slot`: finds each sequence's documents in
  // `tokens` (host, [B, seq_len], whole sequences: every stage has them) and loads every
  // window's starts for this rank's positions. Nothing to do without documents or windows.
  void load(int slot, const int32_t* tokens, int B);

 private:
  const int32_t* every_rank() const { return reinterpret_cast<const int32_t*>(every_rank_.data()); }

  kernels::Kernels& k_;
  int seq_len_, micro_batch_, slots_;
  Communicator* cp_;
  int cp_size_ = 1, cp_rank_ = 0, T_ = 0;
  int32_t document_end_;
  std::vector<int32_t> positions_;
  kernels::DeviceBuffer every_rank_;  // every cp rank's positions, [cp, T] (the ring's key blocks)
  struct Rotation {
    RotarySettings settings;
    kernels::DeviceBuffer table;
  };
  struct Ring {
    int heads, kv_heads, head_dim;
    std::unique_ptr<RingAttention> ring;
  };
  std::vector<Rotation> rotations_;
  std::vector<Ring> rings_;
  std::vector<std::unique_ptr<SlotMasks>> masks_;  // each window's, where its layers point
  // load()'s host scratch: the documents' starts in whole sequences, one window's
  // narrowing of them, this rank's share.
  std::vector<int32_t> documents_, narrowed_, mine_;
};

}  // namespace trident
