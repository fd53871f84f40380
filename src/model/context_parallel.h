// Context parallelism (parallel.cp, Megatron's --context-parallel-size): each sequence is
// cut into 2 cp chunks and rank i of the cp group holds chunks i and 2cp-1-i, so that
// under the causal mask every rank has the same attention work (the early chunk sees
// little, the late one much). Everything but attention is per token and runs on the
// rank's own tokens; attention is a ring: each rank's keys and values travel round the
// group one block a step (sent on while the current block is computed), every block's
// output merged exactly through the rows' log-sum-exps (attention_combine). Backward
// passes the blocks round again, each block's key/value gradients travelling with it
// and reaching their owner after the last step. Blocks in a rank's causal future cost
// nothing (the kernels skip keys no row sees), so do blocks that share no document with
// the rank's rows under document masking.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernels.h"
#include "parallel/communicator.h"

namespace trident {

// The global positions of the tokens rank `rank` of `cp` holds, in its order: chunk
// rank, then chunk 2cp-1-rank, of seq_len / (2 cp) tokens each (strictly increasing).
std::vector<int32_t> context_positions(int seq_len, int cp, int rank);
// Every rank's, rank after rank: [cp, seq_len / cp] (whose keys a ring block holds).
std::vector<int32_t> context_positions_of_every_rank(int seq_len, int cp);

// mine[b, t] = full[b, positions[t]] for B rows of `seq_len` (a rank's share of a batch).
void take_positions(const int32_t* full, int B, int seq_len, const std::vector<int32_t>& positions, int32_t* mine);

// The ring's buffers, B*T rows each (T: the rank's tokens): keys and values [k | v] of
// kv_width = 2 NKV HD, two to send one and receive the next; their gradients (two going
// out, one coming in, one block's part); a block's output and row statistics; a block's
// dq (rows of the qkv width, its key/value columns left zero).
struct RingBuffers {
  kernels::Act *kv[2] = {}, *dkv_out[2] = {}, *dkv_in = nullptr, *dkv_part = nullptr;
  kernels::Act *part_out = nullptr, *dq_part = nullptr;
  float* part_lse = nullptr;

  // Hands each buffer and its size for `rows` rows to an allocator: want(Act*&, elements),
  // want_f32(float*&, floats) (lse_floats: the kernels' row statistics for these rows).
  template <class Want, class WantF32>
  void lay_out(size_t rows, int qkv_width, int out_width, size_t lse_floats, Want&& want, WantF32&& want_f32) {
    const size_t block = rows * (qkv_width - out_width);  // [k | v] of every row
    for (kernels::Act** p : {&kv[0], &kv[1], &dkv_out[0], &dkv_out[1], &dkv_in, &dkv_part}) want(*p, block);
    want(part_out, rows * out_width);
    want_f32(part_lse, lse_floats);
    want(dq_part, rows * qkv_width);
  }
};

class RingAttention {
 public:
  // cp: the group; positions: every rank's token positions, [cp, T] in device memory.
  RingAttention(kernels::Kernels& k, Communicator& cp, const int32_t* positions, int T, int NH, int NKV, int HD);

  // out, lse = attention of this rank's queries (qkv rows) over every rank's keys, with
  // `mask`'s query side (its q_pos and document starts; kv_pos is each block's own).
  void forward(kernels::Act* out, float* lse, const kernels::Act* qkv, kernels::AttentionMask mask, int B,
               const RingBuffers& ring);
  // dqkv (all columns, overwritten) from dout, with the forward's out and lse.
  void backward(kernels::Act* dqkv, const kernels::Act* dout, const kernels::Act* qkv, const kernels::Act* out,
                const float* lse, kernels::AttentionMask mask, int B, const RingBuffers& ring);

  // Elements one block of keys and values holds for B sequences (what one ring step sends).
  size_t block_elements(int B) const { return static_cast<size_t>(B) * T_ * kv_width(); }
  int kv_width() const { return 2 * NKV_ * HD_; }

 private:
  ActivationSpan span(kernels::Act* x, int B) const { return {x, block_elements(B), k_.activation_type()}; }
  const int32_t* positions_of(int rank) const { return positions_ + static_cast<size_t>(rank) * T_; }
  // A qkv row's k | v columns (and of its gradient's rows).
  const kernels::Act* kv_columns(const kernels::Act* qkv) const;
  kernels::Act* kv_columns(kernels::Act* dqkv) const;

  kernels::Kernels& k_;
  Communicator& cp_;
  const int32_t* positions_;
  int T_, NH_, NKV_, HD_;
  int next_, prev_;  // the ring's neighbours: blocks go to next_, come from prev_
};

}  // namespace trident
