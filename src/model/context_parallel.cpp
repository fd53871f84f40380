#include "model/context_parallel.h"

#include "kernels/base/error.h"

namespace trident {

namespace {

// Tags on the cp group: each kind of message in order between two neighbours.
constexpr int kForwardBlock = 1, kBackwardBlock = 2, kBlockGradient = 3;

}  // namespace

std::vector<int32_t> context_positions(int seq_len, int cp, int rank) {
  check(cp > 0 && seq_len % (2 * cp) == 0 && rank >= 0 && rank < cp,
        "context_positions: seq_len must be a multiple of 2 cp");
  const int chunk = seq_len / (2 * cp);
  std::vector<int32_t> positions;
  for (int first : {rank * chunk, (2 * cp - 1 - rank) * chunk})
    for (int t = 0; t < chunk; t++) positions.push_back(first + t);
  return positions;
}

std::vector<int32_t> context_positions_of_every_rank(int seq_len, int cp) {
  std::vector<int32_t> every_rank;
  for (int r = 0; r < cp; r++) {
    const std::vector<int32_t> p = context_positions(seq_len, cp, r);
    every_rank.insert(every_rank.end(), p.begin(), p.end());
  }
  return every_rank;
}

void take_positions(const int32_t* full, int B, int seq_len, const std::vector<int32_t>& positions, int32_t* mine) {
  const size_t T = positions.size();
  for (int b = 0; b < B; b++)
    for (size_t t = 0; t < T; t++) mine[b * T + t] = full[static_cast<size_t>(b) * seq_len + positions[t]];
}

RingAttention::RingAttention(kernels::Kernels& k, Communicator& cp, const int32_t* positions, int T, int NH, int NKV,
                             int HD)
    : k_(k), cp_(cp), positions_(positions), T_(T), NH_(NH), NKV_(NKV), HD_(HD),
      next_((cp.rank() + 1) % cp.size()), prev_((cp.rank() + cp.size() - 1) % cp.size()) {}

const kernels::Act* RingAttention::kv_columns(const kernels::Act* qkv) const {
  return kernels::offset(qkv, static_cast<size_t>(NH_) * HD_, k_.activation_type());
}

kernels::Act* RingAttention::kv_columns(kernels::Act* dqkv) const {
  return kernels::offset(dqkv, static_cast<size_t>(NH_) * HD_, k_.activation_type());
}

void RingAttention::forward(kernels::Act* out, float* lse, const kernels::Act* qkv, kernels::AttentionMask mask,
                            int B, const RingBuffers& ring) {
  const int P = cp_.size(), me = cp_.rank(), width = kv_width(), qkv_width = (NH_ + 2 * NKV_) * HD_;
  k_.copy_columns(ring.kv[0], width, kv_columns(qkv), qkv_width, B * T_, width);
  int cur = 0;
  for (int step = 0; step < P; step++) {
    RequestPtr hop;  // the next block on its way while this one is computed
    if (step < P - 1)
      hop = cp_.send_recv_async(span(ring.kv[cur], B), next_, span(ring.kv[1 - cur], B), prev_, kForwardBlock);
    mask.kv_pos = positions_of((me - step + P) % P);  // whose keys these are
    if (step == 0) {
      k_.attention_forward(out, lse, qkv, ring.kv[cur], width, mask, B, T_, T_, NH_, NKV_, HD_);
    } else {
      k_.attention_forward(ring.part_out, ring.part_lse, qkv, ring.kv[cur], width, mask, B, T_, T_, NH_, NKV_, HD_);
      k_.attention_combine(out, lse, ring.part_out, ring.part_lse, B, T_, NH_, HD_);
    }
    if (hop) {
      hop->wait();
      cur = 1 - cur;
    }
  }
}

void RingAttention::backward(kernels::Act* dqkv, const kernels::Act* dout, const kernels::Act* qkv,
                             const kernels::Act* out, const float* lse, kernels::AttentionMask mask, int B,
                             const RingBuffers& ring) {
  const int P = cp_.size(), me = cp_.rank(), width = kv_width(), qkv_width = (NH_ + 2 * NKV_) * HD_;
  const size_t qkv_elements = static_cast<size_t>(B) * T_ * qkv_width;
  k_.copy_columns(ring.kv[0], width, kv_columns(qkv), qkv_width, B * T_, width);
  // At step s this rank holds block (me - s) and the sum of its key/value gradients from
  // the ranks that had it before (prev took it one step earlier): adds its own part and
  // passes the sum on; after the last step next holds its own block's complete sum.
  RequestPtr gradient;  // a sum to next, the next block's sum so far from prev
  int cur = 0;
  for (int step = 0; step < P; step++) {
    RequestPtr hop;
    if (step < P - 1)
      hop = cp_.send_recv_async(span(ring.kv[cur], B), next_, span(ring.kv[1 - cur], B), prev_, kBackwardBlock);
    mask.kv_pos = positions_of((me - step + P) % P);
    kernels::Act* sum = ring.dkv_out[step % 2];  // step - 1's, in flight, is the other buffer
    if (step == 0) {
      k_.attention_backward(dqkv, sum, dout, qkv, ring.kv[cur], width, out, lse, mask, B, T_, T_, NH_, NKV_, HD_);
    } else {
      k_.attention_backward(ring.dq_part, ring.dkv_part, dout, qkv, ring.kv[cur], width, out, lse, mask, B, T_, T_,
                            NH_, NKV_, HD_);
      k_.add(dqkv, dqkv, ring.dq_part, qkv_elements);  // dq_part's key/value columns stay zero
      gradient->wait();
      k_.add(sum, ring.dkv_in, ring.dkv_part, block_elements(B));
    }
    gradient = cp_.send_recv_async(span(sum, B), next_, span(ring.dkv_in, B), prev_, kBlockGradient);
    if (hop) {
      hop->wait();
      cur = 1 - cur;
    }
  }
  gradient->wait();  // this rank's own block, summed over every rank
  k_.copy_columns(kv_columns(dqkv), qkv_width, ring.dkv_in, width, B * T_, width);
}

}  // namespace trident
